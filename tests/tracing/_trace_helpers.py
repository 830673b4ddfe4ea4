"""Shared helpers for the tracer tests: skips with a reason where root,
bpftrace or fio is missing."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TRACING = REPO / "tracing"
FIXTURES = Path(__file__).resolve().parent / "fixtures"

# the `root` marker skips as non-root (tests/conftest.py)
needs_root = pytest.mark.root(reason="bpftrace attaches kernel tracepoints")
needs_bpftrace = pytest.mark.skipif(
    shutil.which("bpftrace") is None, reason="bpftrace not installed (bash deploy/install-system-deps.sh)"
)
needs_fio = pytest.mark.skipif(
    shutil.which("fio") is None, reason="fio not installed (bash deploy/install-system-deps.sh)"
)


def disk_tmp_dir() -> Path:
    """A folder on the root disk (not tmpfs): block I/O must reach a device."""
    base = Path(os.environ.get("KVTIER_TRACE_TMP", "/var/tmp"))
    base.mkdir(parents=True, exist_ok=True)
    return base
