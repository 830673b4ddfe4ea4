"""deploy/grafana/kvtier-dashboard.json against a JSON Schema of Grafana's dashboard model (Grafana is not packaged
here; the schema, grafana-dashboard.schema.json beside this file, says where its rules come from), and its queries
against the recording rules. Each query is run through a live Prometheus in tests/e2e/test_prometheus_stack.py."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from deploy import SCRIPTS
from deploy.prometheus_config import RULES

DASHBOARD = SCRIPTS / "grafana" / "kvtier-dashboard.json"
SCHEMA = Path(__file__).with_name("grafana-dashboard.schema.json")


def _dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def _errors(dash: dict) -> list[str]:
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    v = jsonschema.Draft202012Validator(schema)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in v.iter_errors(dash)]


def test_the_dashboard_follows_the_schema():
    assert _errors(_dashboard()) == []


@pytest.mark.parametrize(
    "breakage, where",
    [
        (lambda d: d.__setitem__("uid", "short"), "uid"),
        (lambda d: d["panels"][0]["gridPos"].__setitem__("w", 30), "panels/0/gridPos/w"),
        (lambda d: d["panels"][1]["targets"][0].__setitem__("exp", "up"), "panels/1/targets/0"),
        (lambda d: d["panels"][2].__setitem__("datasource", {"type": "loki", "uid": "x"}), "panels/2/datasource/type"),
        (lambda d: d["templating"]["list"][1].pop("datasource"), "templating/list/1"),
        (lambda d: d.__setitem__("graphTooltip", 3), "graphTooltip"),
    ],
    ids=["uid-length", "wider-than-the-grid", "misspelt-field", "not-prometheus", "variable-without-source", "tooltip"],
)
def test_the_schema_catches_a_broken_dashboard(breakage, where):
    dash = copy.deepcopy(_dashboard())
    breakage(dash)
    errors = _errors(dash)
    assert errors and any(e.startswith(where) for e in errors), errors


def test_panels_tile_the_grid_and_ids_are_unique():
    panels = _dashboard()["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine
        assert len({t["refId"] for t in p["targets"]}) == len(p["targets"])


def test_every_recorded_series_a_panel_reads_is_a_rule_and_every_rule_is_shown():
    rules = {r["record"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    exprs = [t["expr"] for p in _dashboard()["panels"] for t in p["targets"]]
    read = {m for e in exprs for m in re.findall(r"\b([a-z_]+:[a-z_]+:[a-z0-9_]+)\b", e)}
    assert read == rules
    # the instance variable filters every query
    assert all('stack_instance=~"$instance"' in e for e in exprs)
