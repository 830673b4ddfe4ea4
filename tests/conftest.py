"""Shared by the whole suite. Plain helpers (free_port, wait_for) live in helpers.py beside this file; pytest puts this
folder on sys.path when it loads this conftest, so every test imports them as `from helpers import ...`.

Markers (pyproject.toml lists them) decide where a test runs in `make test`:
- no marker: the fast tier (`make test-fast`), on every core, each test under a minute;
- `slow`: over about a second of wall time; still run on every core, after the fast tier;
- `e2e`: starts a real stack (vLLM, LMCache, kvtier, their servers): run after the slow tier on two workers, each
  running a whole group at a time (a module, or the modules sharing a session's stack: an `xdist_group` mark), so two
  stacks start and serve side by side and no stack is started twice;
- `serial`: needs the machine alone (it times something, loads both cores, traces every process, or changes
  machine-wide configuration another test reads, such as a sudoers rule): run one at a time at the end. A test marked
  `e2e` and `serial` (a stack traced with bpftrace) runs there.
The `root` marker is also the skip: a test marked `@pytest.mark.root` (optionally with reason="what needs root") is
skipped with that reason when the suite does not run as root, so no test checks os.geteuid() itself.

`--durations-file PATH` writes every test's wall time (set-up, call and tear-down added) as JSON, slowest first: where
a run's time went, kept after the run (`make test` writes one per tier under test-durations/)."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--durations-file", default=None, help="write each test's wall time (s) as JSON to this path")


class _Durations:
    """On the controller (xdist sends every worker's reports there): each test's set-up, call and tear-down added."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] += report.duration

    def pytest_sessionfinish(self) -> None:
        rows = sorted(((round(s, 3), nodeid) for nodeid, s in self.seconds.items()), reverse=True)
        doc = {"total_s": round(sum(self.seconds.values()), 1), "tests": [{"s": s, "test": n} for s, n in rows]}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        tmp.replace(self.path)


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--durations-file")
    if path and not hasattr(config, "workerinput"):
        config.pluginmanager.register(_Durations(path), "kvtier-durations")


@pytest.hookimpl(tryfirst=True)  # before xdist's --dist loadgroup reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("e2e") is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))  # its module's stack, one worker
    if os.geteuid() == 0:
        return
    for item in items:
        marker = item.get_closest_marker("root")
        if marker is not None:
            why = marker.kwargs.get("reason", "mounts, bpftrace or drop_caches")
            item.add_marker(pytest.mark.skip(reason=f"needs root: {why}"))
