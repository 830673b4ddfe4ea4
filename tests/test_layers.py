"""The layers of DESIGN.md, read from the source as test_import_cycles.py reads it (imports inside functions count):
the store imports no driver and nothing of replay/ or deploy/; tracing/ nothing of the project; the sinks and the
sources (replay/outputs, replay/sources) no driver (replay/synthetic, replay/openai); replay/plan not replay/openai."""

from __future__ import annotations

import pytest
from test_import_cycles import _modules, import_graph

RULES = [
    ("kvconnector", ("replay", "deploy")),
    ("tracing", ("kvconnector", "replay", "deploy", "benchmarks")),
    ("replay.outputs", ("replay.synthetic", "replay.openai")),
    ("replay.sources", ("replay.synthetic", "replay.openai")),
    ("replay.plan", ("replay.openai",)),
]


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


@pytest.mark.parametrize("layer, forbidden", RULES, ids=[r[0] for r in RULES])
def test_layer_imports_nothing_it_must_not(layer, forbidden):
    graph = import_graph(_modules())
    wrong = sorted(
        f"{m} -> {t}"
        for m, targets in graph.items()
        if _within(m, layer)
        for t in targets
        if any(_within(t, f) for f in forbidden)
    )
    assert wrong == [], f"{layer} must not import {', '.join(forbidden)}: " + "; ".join(wrong)
