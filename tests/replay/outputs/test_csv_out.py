"""The long-format CSV parses with the csv module and every figure matches the JSON it came from; `results.load`
gives Python callers the same rows as a DataFrame."""

import csv
import json

import pandas as pd
import pytest

from replay.outputs import write_csv
from replay.synthetic.results import load


def _read(path):
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    assert rows[0] == ["section", "metric", "value"]
    assert all(len(r) == 3 for r in rows)
    return rows[1:]


def _lookup(doc, section, metric):
    node = doc
    if section != "run":
        for part in section.split("."):
            node = node[int(part)] if isinstance(node, list) else node[part]
    return node[metric]


def _as_json_value(text, like):
    if isinstance(like, bool):
        return {"true": True, "false": False}[text]
    if like is None:
        assert text == ""
        return None
    if isinstance(like, (int, float)):
        return type(like)(float(text)) if isinstance(like, float) else int(text)
    return text


def test_every_row_matches_the_json(tmp_path, sample_doc):
    path = tmp_path / "run.csv"
    write_csv(sample_doc, path)
    rows = _read(path)
    seen = {(s, m) for s, m, _ in rows}
    assert len(seen) == len(rows)  # no (section, metric) twice
    derived = 0
    for section, metric, value in rows:
        if section.startswith("tiers.") and metric in ("gb", "gbps"):
            derived += 1
            continue
        expected = _lookup(sample_doc, section, metric)
        if isinstance(expected, (list, dict)):
            continue  # written as JSON text
        assert _as_json_value(value, expected) == expected, (section, metric)
    assert derived == len(sample_doc["tiers"]) * 2 * 2  # tiers x (read, write) x (gb, gbps)
    # the figures a reader looks for are there, every section of the run among them
    for key in [
        ("summary", "requests_per_second"),
        ("summary.end_to_end_latency_ms", "p99"),
        ("summary.cache_stats", "cache_hit_rate"),
        ("summary.cache_stats", "tier_storage_read_p99_ms"),
        ("summary.prefix_cache_stats", "bytes_saved_gb"),
        ("summary.rag_stats.burst_latency_ms", "p95"),
        ("summary.qos_metrics.batch.service_latency_ms", "p95"),
        ("summary.autoscaling_summary", "peak_users"),
        ("autoscaling_stats.0", "action"),
        ("tiers.disk.read.latency_ms", "p999"),
        ("tiers.cpu.write", "ops"),
        ("tiers.disk.events", "hits"),
        ("block_device", "read_gbps"),
        ("run", "status"),
        ("config", "io_workers"),
    ]:
        assert key in seen, key
    # histograms and the timeline are series, not figures
    assert not any("histograms" in s or s.startswith("timeline") for s, _ in seen)
    gbps = {s: float(v) for s, m, v in rows if m == "gbps"}
    cache = sample_doc["summary"]["cache_stats"]
    assert gbps["tiers.disk.read"] == pytest.approx(cache["tier_storage_read_bandwidth_gbps"], abs=1e-4)


@pytest.mark.slow
def test_qos_autoscaling_and_clients_sections(tmp_path, full_doc):
    path = tmp_path / "run.csv"
    write_csv(full_doc, path)
    rows = {(s, m): v for s, m, v in _read(path)}
    for name, q in full_doc["summary"]["qos_metrics"].items():
        section = f"summary.qos_metrics.{name}"
        assert float(rows[(f"{section}.service_latency_ms", "p95")]) == q["service_latency_ms"]["p95"]
        assert rows[(f"{section}.sla", "met")] == {True: "true", False: "false", None: ""}[q["sla"]["met"]]
    assert {rows[(f"summary.qos_metrics.{n}.sla", "verdict")] for n in full_doc["summary"]["qos_metrics"]} == {
        "met",
        "missed",
    }
    assert (
        float(rows[("summary.prefix_cache_stats", "hit_rate")]) == full_doc["summary"]["prefix_cache_stats"]["hit_rate"]
    )
    steps = full_doc["autoscaling_stats"]
    last = len(steps) - 1
    assert rows[(f"autoscaling_stats.{last}", "action")] == steps[last]["action"]
    assert int(rows[("autoscaling_stats.0", "users")]) == steps[0]["users"]
    assert int(rows[("summary", "num_clients")]) == len(full_doc["clients"]) == 2
    assert int(rows[("clients.1.summary", "total_requests")]) == full_doc["clients"][1]["summary"]["total_requests"]


def test_pandas_reads_it(tmp_path, sample_doc):
    write_csv(sample_doc, tmp_path / "run.csv")
    df = pd.read_csv(tmp_path / "run.csv")
    assert list(df.columns) == ["section", "metric", "value"]
    v = df[(df.section == "summary") & (df.metric == "total_requests")].value.iloc[0]
    assert int(v) == sample_doc["summary"]["total_requests"]


def test_load_is_the_csv_as_a_dataframe_with_typed_values(tmp_path, sample_doc):
    src = tmp_path / "run.json"
    src.write_text(json.dumps(sample_doc))
    write_csv(sample_doc, tmp_path / "run.csv")
    df = load(src)
    assert list(df.columns) == ["section", "metric", "value"]
    assert list(zip(df.section, df.metric)) == [(s, m) for s, m, _ in _read(tmp_path / "run.csv")]
    v = df.set_index(["section", "metric"])["value"]
    s = sample_doc["summary"]
    assert v["summary", "total_requests"] == s["total_requests"] and type(v["summary", "total_requests"]) is int
    assert v["summary.end_to_end_latency_ms", "p999"] == s["end_to_end_latency_ms"]["p999"]
    assert v["summary.rag_stats", "enabled"] is True and v["run", "error"] is None
    assert v["tiers.disk.read", "gb"] == pytest.approx(sample_doc["tiers"]["disk"]["read"]["bytes"] / 1e9)


def test_loaded_runs_stack_and_pivot_side_by_side(tmp_path, sample_doc, full_doc):
    """Runs of different shapes (one client, two merged) stack and pivot as load's docstring shows."""
    paths = {"one": tmp_path / "one.json", "two": tmp_path / "two.json"}
    paths["one"].write_text(json.dumps(sample_doc))
    paths["two"].write_text(json.dumps(full_doc))
    runs = pd.concat({name: load(p) for name, p in paths.items()}, names=["run"]).reset_index("run")
    side = runs.pivot(index=["section", "metric"], columns="run", values="value")
    assert side.loc[("summary", "num_clients")].tolist() == [1, 2]
    assert side.loc[("summary", "total_requests")].tolist() == [
        sample_doc["summary"]["total_requests"],
        full_doc["summary"]["total_requests"],
    ]
    assert pd.isna(side.loc[("clients.1.summary", "total_requests"), "one"])  # a section only the merged run has


def test_load_refuses_what_is_not_a_bench_result(tmp_path):
    path = tmp_path / "replay.json"
    path.write_text(json.dumps({"request_throughput": 1.0}))
    with pytest.raises(ValueError, match="not a kvtier bench result"):
        load(path)
