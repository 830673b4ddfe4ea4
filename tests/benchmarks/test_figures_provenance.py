"""Every committed figure JSON says which kvtier made it: its version and the commit (recorded by the run, or for runs
that predate the record, the commit the figure was added in)."""

import json
import re
from pathlib import Path

import pytest

FIGURES = Path(__file__).resolve().parents[2] / "benchmarks" / "figures"
SHA = re.compile(r"^[0-9a-f]{40}$")


@pytest.mark.parametrize("path", sorted(FIGURES.rglob("*.json")), ids=lambda p: str(p.relative_to(FIGURES)))
def test_the_figure_carries_its_provenance(path):
    p = json.loads(path.read_text()).get("provenance")
    assert p, "no provenance: write it with replay.outputs.provenance.provenance()"
    assert re.match(r"^\d+\.\d+", p["kvtier_version"]), p
    assert SHA.match(p.get("commit") or p.get("committed_in") or ""), p
