"""The layers of kvtier, enforced: each rule below is a "never" of the design, checked on the import graph read from
the source (tests/import_graph.py: imports inside functions count too, so a rule cannot be dodged by a lazy import).

- the store (kvconnector/) imports nothing of replay/ or deploy/, and its core (all but the engine adapters
  kvconnector/lmcache/ and kvconnector/vllm/) imports no engine (lmcache, vllm) at import time, nor torch (only the
  GPU tier imports it, when asked for);
- tracing/ imports nothing of the project: it is copied onto an inference node alone;
- the workload sources (replay/sources/) and the sinks (replay/outputs/) never import a driver (replay/synthetic/,
  replay/openai/); the planner (replay/plan/) never imports the OpenAI driver;
- the MLPerf harness package (replay/mlperf/) drives `kvtier bench` through its command line, as mlpstorage drives
  the reference, so it imports no driver and no planner; nothing below it (the drivers, sources, sinks, the common
  package) imports it;
- what deploy/, the benchmarks and the drivers share (replay/common/) imports nothing else of replay/ or deploy/.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from import_graph import imports, project_modules

DRIVERS = ("replay.synthetic", "replay.openai")
ENGINES = ("lmcache", "vllm", "torch")
ADAPTERS = ("kvconnector.lmcache", "kvconnector.vllm")

# (the importing modules, what they may never import, why)
NEVER: list[tuple[str | tuple[str, ...], tuple[str, ...], str]] = [
    ("kvconnector", ("replay", "deploy", "benchmarks", "tracing"), "the store imports nothing above it"),
    ("tracing", ("kvconnector", "replay", "deploy", "benchmarks"), "tracing/ stands alone"),
    ("replay.sources", DRIVERS, "a workload source never imports a driver"),
    ("replay.outputs", DRIVERS, "a sink never imports a driver"),
    ("replay.plan", ("replay.openai",), "the planner never imports the OpenAI driver"),
    ("replay.mlperf", (*DRIVERS, "replay.plan"), "the MLPerf harness runs kvtier bench by its command line"),
    (
        ("replay.synthetic", "replay.openai", "replay.sources", "replay.outputs", "replay.plan", "replay.common"),
        ("replay.mlperf",),
        "the drivers, sources, sinks, planner and common package know nothing of the MLPerf harness",
    ),
    (
        "replay.common",
        ("replay.synthetic", "replay.openai", "replay.sources", "replay.outputs", "replay.plan", "deploy"),
        "the common package sits below the drivers, sources and sinks",
    ),
]


def _within(name: str, packages: tuple[str, ...] | str) -> bool:
    packages = (packages,) if isinstance(packages, str) else packages
    return any(name == p or name.startswith(p + ".") for p in packages)


def violations(modules: dict[str, Path]) -> list[str]:
    """One line per import that breaks a rule: `module imports target (why)`."""
    found = []
    for name, path in sorted(modules.items()):
        for imported, at_import_time in imports(name, path):
            for layer, never, why in NEVER:
                if _within(name, layer) and _within(imported, never):
                    found.append(f"{name} imports {imported} ({why})")
            core = _within(name, "kvconnector") and not _within(name, ADAPTERS)
            if core and at_import_time and _within(imported, ENGINES):
                found.append(f"{name} imports {imported} at import time (the store's core loads no engine)")
    return found


def test_the_tree_keeps_its_layers():
    assert violations(project_modules()) == []


@pytest.mark.parametrize(
    "module, text, expect",
    [
        ("replay.outputs.page", "from replay.synthetic.compare import rows_for\n", "a sink never imports a driver"),
        ("replay.outputs.page", "def f():\n    from ..openai import cli\n", "a sink never imports a driver"),
        ("replay.sources.x", "import replay.openai.client\n", "a workload source never imports a driver"),
        ("tracing.distill", "from replay.common.ports import free_port\n", "tracing/ stands alone"),
        ("kvconnector.store", "from deploy import stack\n", "the store imports nothing above it"),
        ("kvconnector.tiers", "import torch\n", "the store's core loads no engine"),
        ("replay.plan.cli", "from replay.openai import driver\n", "the planner never imports the OpenAI driver"),
        ("replay.mlperf.shim", "from replay.synthetic import cli\n", "the MLPerf harness runs kvtier bench by its"),
        ("replay.synthetic.check", "from replay.mlperf import summary\n", "know nothing of the MLPerf harness"),
        ("replay.common.cli", "import replay.mlperf.cli\n", "know nothing of the MLPerf harness"),
        ("replay.common.ports", "from replay.sources.base import Turn\n", "the common package sits below"),
    ],
)
def test_a_planted_violation_is_named(tmp_path, module, text, expect):
    path = tmp_path / "m.py"
    path.write_text(text)
    (found,) = violations({module: path})
    assert found.startswith(module + " imports ") and expect in found


@pytest.mark.parametrize(
    "module, text",
    [
        ("kvconnector.tiers", "def gpu():\n    import torch\n"),  # the GPU tier, lazily: allowed
        ("kvconnector.lmcache.adapter", "import lmcache.v1\n"),  # an adapter imports its engine
        ("replay.openai.cli", "from replay.outputs import plots\n"),  # a driver uses a sink
        ("replay.plan.cli", "from replay.synthetic import config\n"),  # only the OpenAI driver is off-limits
    ],
)
def test_what_the_layers_allow_passes(tmp_path, module, text):
    path = tmp_path / "m.py"
    path.write_text(text)
    assert violations({module: path}) == []
