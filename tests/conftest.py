"""Shared by the whole suite. Plain helpers (free_port, wait_for) live in helpers.py beside this file; pytest puts this
folder on sys.path when it loads this conftest, so every test imports them as `from helpers import ...`.

The `root` marker is also the skip: a test marked `@pytest.mark.root` (optionally with reason="what needs root") is
skipped with that reason when the suite does not run as root, so no test checks os.geteuid() itself."""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.geteuid() == 0:
        return
    for item in items:
        marker = item.get_closest_marker("root")
        if marker is not None:
            why = marker.kwargs.get("reason", "mounts, bpftrace or drop_caches")
            item.add_marker(pytest.mark.skip(reason=f"needs root: {why}"))
