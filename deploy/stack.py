"""The one Python owner of a live stack: up and down with a state directory, its endpoints, clearing LMCache's L1, its
metrics, a completion, the model's tokenizer. People, `kvtier sweep`, the benchmarks and the end-to-end tests all drive
a stack through this module. Starting and stopping is deploy/run_stack.py (what deploy/run-stack.sh runs), run as a
child process: the servers outlive it, and whoever adopts them reaps them, not the caller."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from replay.common.ports import free_port_block
from replay.common.prometheus_text import Series, parse_prometheus

from . import SCRIPTS


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


def run_stack(*args: str, timeout_s: float | None = None) -> subprocess.CompletedProcess:
    """`run-stack.sh ARGS` on this interpreter, its output captured."""
    path = [str(SCRIPTS.parent), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    cmd = [sys.executable, "-m", "deploy.run_stack", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)


def start(state_dir: Path, *args: str, timeout_s: float | None = None) -> Stack:
    """`run-stack.sh up ARGS --state-dir STATE_DIR`; a failed start is torn down and raises RuntimeError."""
    p = run_stack("up", *args, "--state-dir", str(state_dir), timeout_s=timeout_s)
    if p.returncode != 0:
        down(state_dir)
        raise RuntimeError(f"run-stack.sh up failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}")
    return Stack(Path(state_dir), json.loads(Path(state_dir, "endpoints.json").read_text()))


def up(state_dir: Path, model_dir: str, kv_dir: Path, *extra: str, timeout_s: int = 300, device: str = "cpu") -> Stack:
    """A stack (vLLM on `device`) on free ports started with this interpreter (`--python`), so a run on another
    venv's python starts its LMCache server and vLLM from that venv too."""
    base = free_port_block(60)
    args = ["--device", device, "--model", model_dir, "--vllm-port", str(base), "--lmcache-port", str(base + 10)]
    args += ["--lmcache-http-port", str(base + 20), "--metrics-port", str(base + 40), "--kv-dir", str(kv_dir)]
    args += ["--timeout", str(timeout_s), "--python", sys.executable, *extra]
    return start(state_dir, *args, timeout_s=timeout_s + 60)


def down(state_dir: Path) -> None:
    run_stack("down", "--state-dir", str(state_dir), timeout_s=120)


def group_pids(state_dir: Path) -> list[int]:
    p = state_dir / "pids"
    return [int(line.split()[1]) for line in p.read_text().splitlines()] if p.exists() else []


def pid_of(state_dir: Path, name: str) -> int:
    """The pid run-stack.sh recorded for `name` (its last one); KeyError when it recorded none."""
    pids = dict(line.split() for line in (state_dir / "pids").read_text().splitlines())
    return int(pids[name])


def alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


@functools.lru_cache(maxsize=2)
def tokenizer(model_dir: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def prompt_text(model_dir: str, n_tokens: int = 1300, source: str = "argparse.py") -> str:
    """About n_tokens of the model's tokens, from a standard-library source file (offline, deterministic)."""
    import sysconfig

    tok = tokenizer(model_dir)
    text = Path(sysconfig.get_paths()["stdlib"], source).read_text()
    return tok.decode(tok(text[: n_tokens * 8])["input_ids"][:n_tokens])


def complete(base: str, prompt: str, max_tokens: int = 16, timeout_s: float = 120) -> tuple[str, float, dict]:
    """Greedy completion: (text, seconds, response headers)."""
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}).encode()
    req = urllib.request.Request(base + "/v1/completions", body, {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        data = json.load(r)
        headers = dict(r.headers)
    return data["choices"][0]["text"], time.perf_counter() - t0, headers


def metrics(url: str) -> dict[Series, float]:
    """The Prometheus samples at `url` as {(name, labels): value} (prometheus_client's parser)."""
    with urllib.request.urlopen(url, timeout=10) as r:
        return parse_prometheus(r.read().decode())


def metric(m: dict[Series, float], name: str, **labels: str) -> float:
    """Sum of the series of `name` whose labels include `labels`."""
    return sum(v for (n, ls), v in m.items() if n == name and labels.items() <= dict(ls).items())


def kvtier_event(stack: Stack, event: str, i: int = 0, tier: str | None = None) -> float:
    m = metrics(stack.inst(i)["kvtier_metrics"])
    if tier is None:
        return metric(m, "kvtier_backend_events_total", event=event)
    return metric(m, "kvtier_tier_events_total", event=event, tier=tier)


def vllm_external_hits(base: str) -> float:
    return metric(metrics(base + "/metrics"), "vllm:external_prefix_cache_hits_total")


def wait_for(fn, timeout_s: float = 30.0, interval_s: float = 0.2):
    """Poll fn until it returns something true or timeout_s passes; its last value."""
    deadline = time.monotonic() + timeout_s
    while True:
        v = fn()
        if v or time.monotonic() > deadline:
            return v
        time.sleep(interval_s)


def clear_l1(stack: Stack, i: int = 0) -> None:
    """Empty LMCache's CPU tier (L1) of instance i, so the next lookup goes to kvtier; raises on a non-200."""
    clear_l1_at(stack.inst(i)["lmcache_http"])


def clear_l1_at(lmcache_http: str) -> None:
    req = urllib.request.Request(lmcache_http + "/cache/clear", b"", method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        if r.status != 200:
            raise RuntimeError(f"POST {lmcache_http}/cache/clear: HTTP {r.status}")


@dataclass
class L2Hit:
    """One prompt sent three times through a stack with a kvtier tier: computed (its chunks stored), then a hit in
    LMCache's L1, then, L1 cleared, a hit served from kvtier's `tier`. Token counts are vLLM's external prefix-cache
    hits, chunk counts kvtier's own events, each a delta over the three requests."""

    tier: str
    first_hit_tokens: float
    stored_chunks: float
    l1_hit_tokens: float
    l2_hit_tokens: float
    tier_hit_chunks: float
    same_text: bool
    load_errors: float
    corrupt_dropped: float

    def problems(self, chunks: int, chunk_tokens: int = 256) -> list[str]:
        """What fell short of `chunks` full chunks stored and served back; empty when the path works."""
        want = chunks * chunk_tokens
        checks = [
            (self.first_hit_tokens == 0, f"the first request already hit {self.first_hit_tokens:.0f} tokens"),
            (self.stored_chunks >= chunks, f"kvtier stored {self.stored_chunks:.0f} of {chunks} chunks"),
            (self.l1_hit_tokens >= want, f"second request: {self.l1_hit_tokens:.0f} hit tokens, want {want}"),
            (self.l2_hit_tokens >= want, f"after the L1 clear: {self.l2_hit_tokens:.0f} hit tokens, want {want}"),
            (self.tier_hit_chunks >= chunks, f"kvtier's {self.tier} tier served {self.tier_hit_chunks:.0f} chunks"),
            (self.same_text, "a cached answer differs from the computed one (greedy decoding)"),
            (self.load_errors == 0, f"{self.load_errors:.0f} load errors"),
            (self.corrupt_dropped == 0, f"{self.corrupt_dropped:.0f} corrupt entries dropped"),
        ]
        return [why for ok, why in checks if not ok]


def l2_hit(stack: Stack, prompt: str, chunks: int, tier: str = "disk", i: int = 0) -> tuple[L2Hit, str]:
    """Send `prompt` (one no earlier request sent) to instance i three times: computed, an L1 hit, then L1 cleared
    and a hit from kvtier. The figures and the computed text. The path the end-to-end tests and deploy/gpu_check.py
    check."""
    base = stack.inst(i)["vllm"]
    h0, stored = vllm_external_hits(base), kvtier_event(stack, "store_ok", i)
    ref, _, _ = complete(base, prompt)
    first = vllm_external_hits(base) - h0
    wait_for(lambda: kvtier_event(stack, "store_ok", i) - stored >= chunks)  # stores land after the answer
    stored = kvtier_event(stack, "store_ok", i) - stored
    second, _, _ = complete(base, prompt)
    h1 = vllm_external_hits(base)
    tier_hits = kvtier_event(stack, "hits", i, tier=tier)
    clear_l1(stack, i)
    third, _, _ = complete(base, prompt)
    hit = L2Hit(
        tier=tier,
        first_hit_tokens=first,
        stored_chunks=stored,
        l1_hit_tokens=h1 - h0 - first,
        l2_hit_tokens=vllm_external_hits(base) - h1,
        tier_hit_chunks=kvtier_event(stack, "hits", i, tier=tier) - tier_hits,
        same_text=second == ref == third,
        load_errors=kvtier_event(stack, "load_errors", i),
        corrupt_dropped=kvtier_event(stack, "corrupt_dropped", i, tier=tier),
    )
    return hit, ref
