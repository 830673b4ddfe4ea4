"""Shared helpers for the tracer tests: skips with a reason where root,
bpftrace or fio is missing; waits for a tracer to attach and for a workload's I/O."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import wait_for

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


def wait_attached(out: Path, tracer: subprocess.Popen | None = None, trace: str = "trace.txt", timeout_s: float = 90):
    """Until the tracer's banner is in OUT/TRACE (its probes are attached); fails at once if the tracer exits."""

    def attached() -> bool:
        if tracer is not None and tracer.poll() is not None:
            raise AssertionError(f"the tracer exited with {tracer.returncode} before attaching")
        p = out / trace
        return p.exists() and "Tracing storage I/O by layer" in p.read_text(errors="replace")

    wait_for(attached, timeout_s=timeout_s, interval_s=0.1, what=f"the tracer to attach ({out / trace})")


def io_counters(pid: int) -> dict[str, int]:
    """The kernel's I/O counters of a process (/proc/PID/io: rchar, syscr, syscw, read_bytes, write_bytes, ...)."""
    with open(f"/proc/{pid}/io") as f:
        return {name: int(value) for name, value in (line.split(": ") for line in f.read().splitlines())}


def wait_io(proc: subprocess.Popen, since: dict[str, int] | None = None, timeout_s: float = 60, **at_least: int):
    """Until PROC's I/O counters have grown by AT_LEAST (e.g. read_bytes=16 << 20) from SINCE (from zero if not
    given); fails at once if PROC exits. The event a workload offers that it is doing I/O, instead of a sleep."""
    since = since or {}

    def grown() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"the workload exited with {proc.returncode} before doing its I/O")
        now = io_counters(proc.pid)
        return all(now[name] - since.get(name, 0) >= n for name, n in at_least.items())

    wait_for(grown, timeout_s=timeout_s, interval_s=0.05, what=f"pid {proc.pid}'s I/O to grow by {at_least}")


# fio's own start reads a few MiB (its libraries) and laying out its file reads nothing: past this, its job's reads
# are under way
FIO_READING_BYTES = 16 << 20
