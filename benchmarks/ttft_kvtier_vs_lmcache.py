#!/usr/bin/env python3
"""ttft_kvtier_vs_lmcache.py	TTFT of cached prompts (L1 hits, cold L2 hits): kvtier vs LMCache's fs adapter as L2.

usage: benchmarks/ttft_kvtier_vs_lmcache.py [--model DIR] [--dir DIR] [--repeats 10] [--rounds 2]
                                       [--prompt-tokens 1300] [--max-tokens 1] [--io-mode direct|buffered]
                                       [--l2 kvtier,lmcache-fs] [--json OUT] [--timeline FILE]

One run, stacks started one at a time by deploy/run-stack.sh (vLLM on CPU + the LMCache MP server,
`--no-enable-prefix-caching`, a wiped kv dir), --rounds per backend in ABBA order (kvtier, lmcache-fs, lmcache-fs,
kvtier: a drift of the machine hits both alike; two stacks up at once slow each other 5-10x on 2 cores, so never),
differing only in the MP server's L2 adapter:
- kvtier:     kvconnector.lmcache.l2_adapter.KvtierL2Adapter, local disk tier (--io-mode direct = O_DIRECT);
- lmcache-fs: LMCache 0.5.6's own "fs" L2 adapter (lmcache/v1/distributed/l2_adapters/fs_l2_adapter.py,
              FSL2Adapter) on the same kind of directory (--io-mode direct = its `use_odirect: true`).
Per stack: two throw-away requests (first-request warm-up), the fixed prompt once (computed, stored), then
--repeats times:
  1. vLLM's hit counter and the LMCache server's /proc/PID/io read; POST /cache/clear on LMCache's HTTP port
     (L1 empty), `sync; echo 1 > /proc/sys/vm/drop_caches` (cold L2);
  2. the fixed prompt, streaming, max_tokens --max-tokens: the "L2 hit" TTFT;
  3. the same prompt again, nothing cleared: "L2 again". Not an L1 hit: LMCache's default prefetch policy keeps
     nothing it loaded from L2 in L1, so this reads L2 again (warm for the device, for context);
  4. a fresh prompt of the same length (never seen before): the "uncached" TTFT (full prefill, the reference);
     its chunks stay in L1 and are stored to L2;
  5. that fresh prompt again: the "L1 hit" TTFT (served from LMCache's memory while its L2 stores may still be
     in flight; LMCache still asks the L2 adapter to look up and lock every chunk, then unlocks them).
TTFT is measured client-side with perf_counter_ns: request sent -> first SSE event carrying a generated token
(a token's text can be empty for a partial UTF-8 sequence; the event still marks the first token).
Checks: every L2 hit grows vLLM's vllm:external_prefix_cache_hits_total by the stored tokens (the chunks of
--prompt-tokens at chunk size 256), gives the computed greedy text, and makes the LMCache server read from the block
device (/proc/PID/io read_bytes); every L1 hit grows the hit tokens alike, gives the uncached request's text and
reads less than a chunk from the block device; with kvtier, its disk-tier hits over a stack are exactly 2 x the
chunks per repeat (the L2 hit and the re-read; nothing for L1 hits), read from its exporter once before and once
after the repeats: nothing in the LMCache server is asked between timed requests (a scrape of kvtier's exporter
there was charged to the next request). A request that fails a check is reported and left out of the percentiles.
Percentiles are nearest-rank over the repeats x rounds samples (a bounded list). --timeline FILE records the LMCache
servers' prefetch path (tools/prefetch_timeline/sitecustomize.py) and the client's sends and first tokens in one
file; tools/prefetch_timeline/phases.py splits each request into its phases. Needs root (drop_caches,
/proc/PID/io); stops the stack even on errors.

example (2 cores, virtio disk, tiny model, 310 s; benchmarks/README.md says how to read it):
  $ sudo .venv/bin/python benchmarks/ttft_kvtier_vs_lmcache.py --dir /var/tmp/kvtier-ttft --rounds 4
  backend     L2 adapter                uncached  L1-hit  L1-hit  L2-hit  L2-hit L2 again  samples ok
                                             p50     p50     p90     p50     p90      p50  L1/L2
  kvtier      kvtier disk (O_DIRECT)        36.9    31.8    34.3    37.5    43.1     34.0  40/40 40/40
  lmcache-fs  LMCache fs (use_odirect)      38.3    32.1    35.6    39.7    50.0     35.3  40/40 40/40
  ratio L1-hit kvtier / lmcache-fs: p50 0.99x, p90 0.96x (< 1: kvtier faster)
  ratio L2-hit kvtier / lmcache-fs: p50 0.94x, p90 0.86x (< 1: kvtier faster)
"""

from __future__ import annotations

import argparse
import gc
import http.client
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from deploy.host import drop_caches
from replay.outputs.provenance import write_run_json

ROOT = Path(__file__).resolve().parents[1]

CHUNK_TOKENS = 256  # run-stack.sh's default LMCache chunk size
LABELS = {
    ("kvtier", "direct"): "kvtier disk (O_DIRECT)",
    ("kvtier", "buffered"): "kvtier disk (buffered)",
    ("lmcache-fs", "direct"): "LMCache fs (use_odirect)",
    ("lmcache-fs", "buffered"): "LMCache fs (buffered)",
}


class BenchError(Exception):
    """A one-line user or set-up error."""


_timeline: list = []  # [open file] with --timeline: the client's own events, in the servers' timeline file


def mark(event: str) -> None:
    """With --timeline, one line `<time.time_ns()> client <event>` in the file the LMCache server logs to
    (tools/prefetch_timeline), so the client's sends and first tokens sit in the same timeline."""
    if _timeline:
        _timeline[0].write(f"{time.time_ns()} client {event}\n")
        _timeline[0].flush()


def read_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/io") as fh:
        for line in fh:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    return 0


def stream_ttft(base: str, prompt: str, max_tokens: int, timeout_s: float = 60, label: str = "") -> dict:
    """One streaming completion. Never raises: {'ok', 'ttft_ms', 'text', 'prompt_tokens', 'error'}."""
    host, port = base.removeprefix("http://").split(":")
    body = json.dumps(
        {
            "model": "tiny",
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout_s)
    out = {"ok": False, "ttft_ms": None, "text": "", "prompt_tokens": None, "error": None}
    try:
        mark(f"send {label}")
        t0 = time.perf_counter_ns()
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            out["error"] = f"HTTP {resp.status}: {resp.read(300)!r}"
            return out
        while True:
            line = resp.readline()
            if not line:
                break
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                break
            ev = json.loads(data)
            if ev.get("choices"):
                if out["ttft_ms"] is None:
                    out["ttft_ms"] = (time.perf_counter_ns() - t0) / 1e6
                    mark(f"first_token {label} {out['ttft_ms']:.1f}")
                out["text"] += ev["choices"][0].get("text") or ""
            if ev.get("usage"):
                out["prompt_tokens"] = ev["usage"]["prompt_tokens"]
        out["ok"] = out["ttft_ms"] is not None
        if not out["ok"]:
            out["error"] = "no token event in the stream"
    except (OSError, ValueError, http.client.HTTPException) as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()
    return out


def nearest_rank(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def prompts(model: str, n_tokens: int, n_fresh: int) -> tuple[str, list[str]]:
    """The fixed prompt (argparse.py) and n_fresh prompts of the same length never sent before (typing.py windows)."""
    import sysconfig

    from deploy.stack import prompt_text, tokenizer

    fixed = prompt_text(model, n_tokens, "argparse.py")
    tok = tokenizer(model)
    text = Path(sysconfig.get_paths()["stdlib"], "typing.py").read_text()
    ids = tok(text)["input_ids"]
    step = 37
    if len(ids) < n_tokens + step * n_fresh:
        raise BenchError(f"typing.py is too short for {n_fresh} fresh prompts of {n_tokens} tokens")
    return fixed, [tok.decode(ids[i * step : i * step + n_tokens]) for i in range(n_fresh)]


class Side:
    """One stack (vLLM + LMCache MP server with one L2 adapter) and its samples."""

    def __init__(self, a, l2: str):
        self.l2, self.a = l2, a
        work = Path(a.dir) / l2
        shutil.rmtree(work, ignore_errors=True)
        self.kv, self.state = work / "kv", work / "state"
        self.chunks = a.prompt_tokens // CHUNK_TOKENS
        self.stack = None
        self.res = {
            "backend": l2,
            "l2_adapter": LABELS[(l2, a.io_mode)],
            "io_mode": a.io_mode,
            "uncached": [],
            "l1_hit": [],
            "l2_hit": [],
            "l2_again": [],
            "l2_read_bytes": [],
            "l1_read_bytes": [],
            "failed": [],
            "hit_tokens_expected": self.chunks * CHUNK_TOKENS,
        }

    def up(self) -> None:
        from deploy.stack import up

        t0 = time.monotonic()
        self.stack = up(
            self.state,
            self.a.model,
            self.kv,
            "--l2",
            self.l2,
            "--io-mode",
            self.a.io_mode,
            "--disk-gb",
            "1",
            timeout_s=240,
        )
        self.res["start_s"] = round(time.monotonic() - t0, 1)
        pids = dict(line.split() for line in (self.state / "pids").read_text().splitlines())
        self.lm_pid = int(pids["lmcache0"])
        self.v = self.stack.vllm

    def down(self) -> None:
        from deploy.stack import down

        down(self.state)

    def disk_hits(self) -> float | None:
        from deploy.stack import kvtier_event

        if self.l2 != "kvtier":
            return None
        mark("scrape_kvtier")
        n = kvtier_event(self.stack, "hits", tier="disk")
        mark("scrape_kvtier_done")
        return n

    def store(self, fixed: str, warmups: list[str]) -> None:
        """Warm-up requests (one-off first-request costs), then the fixed prompt computed and stored in L2."""
        from deploy.stack import kvtier_event, wait_for

        for p in warmups:
            r = stream_ttft(self.v, p, self.a.max_tokens)
            if not r["ok"]:
                raise BenchError(f"[{self.l2}] warm-up request failed: {r['error']}")
        self.ref = stream_ttft(self.v, fixed, self.a.max_tokens)
        if not self.ref["ok"]:
            raise BenchError(f"[{self.l2}] store request failed: {self.ref['error']}")
        self.res["prompt_tokens"] = self.ref["prompt_tokens"]
        n = (len(warmups) + 1) * self.chunks
        if self.l2 == "kvtier":
            stored = wait_for(lambda: kvtier_event(self.stack, "store_ok") >= n, 30)
        else:  # the fs adapter writes one <key>.data file per chunk
            stored = wait_for(lambda: len(list(self.kv.glob("*.data"))) >= n, 30)
        if not stored:
            raise BenchError(
                f"[{self.l2}] the chunks were not stored in L2 within 30 s; log: {self.state}/lmcache0.log"
            )

    def clear_l1(self) -> None:
        from deploy.stack import clear_l1

        clear_l1(self.stack)

    def counters(self) -> tuple:
        """What the L2-hit check compares against: vLLM's external hit tokens and the LMCache server's block-device
        reads, read before L1 is cleared. Nothing in the LMCache server is asked between timed requests: a scrape of
        kvtier's exporter there was charged to the next request (kvconnector/README.md), so kvtier's
        disk-tier hits are read once per stack (check_disk_hits)."""
        from deploy.stack import vllm_external_hits

        return vllm_external_hits(self.v), read_bytes(self.lm_pid)

    def _sample(self, kind: str, where: str, r: dict, problems: list[str]) -> str:
        if not r["ok"]:
            problems.insert(0, r["error"])
        if problems:
            self.res["failed"].append({"where": f"{where} {kind}", "problems": problems})
        else:
            self.res[kind].append(r["ttft_ms"])
        ms = r["ttft_ms"] if r["ttft_ms"] is not None else float("nan")
        return f"{kind} {ms:.1f}" + (" FAILED: " + "; ".join(problems) if problems else "")

    def l2_hit(self, where: str, fixed: str, before: tuple) -> str:
        """The fixed prompt after L1 was cleared and the page cache dropped; checked to be a cold L2 hit."""
        from deploy.stack import vllm_external_hits

        h0, rb0 = before
        r = stream_ttft(self.v, fixed, self.a.max_tokens, label=f"{self.l2}:l2")
        hit_tokens = vllm_external_hits(self.v) - h0
        disk_bytes = read_bytes(self.lm_pid) - rb0
        problems = []
        if hit_tokens < self.res["hit_tokens_expected"]:
            problems.append(f"external hit tokens {hit_tokens:.0f} < {self.res['hit_tokens_expected']}")
        if r["text"] != self.ref["text"]:
            problems.append(f"text {r['text']!r} != computed {self.ref['text']!r}")
        if disk_bytes <= 0:
            problems.append("the LMCache server read nothing from the block device (not a cold L2 read)")
        self.res["l2_read_bytes"].append(disk_bytes)
        self.chunk_read_bytes = max(disk_bytes // self.chunks, 8192)
        return self._sample("l2_hit", where, r, problems) + f" ({hit_tokens:.0f} tok, {disk_bytes / 1024:.0f} KiB)"

    def l2_again(self, where: str, fixed: str) -> str:
        """The same prompt right after its L2 hit. Not an L1 hit: LMCache 0.5.6's default prefetch policy keeps
        nothing it loaded from L2 in L1 (DefaultPrefetchPolicy.plan_l1_retention), so this reads L2 again."""
        r = stream_ttft(self.v, fixed, self.a.max_tokens, label=f"{self.l2}:l2_again")
        problems = [] if r["text"] == self.ref["text"] else [f"text {r['text']!r} != computed {self.ref['text']!r}"]
        return self._sample("l2_again", where, r, problems)

    def uncached(self, where: str, prompt: str) -> tuple[str, str]:
        """A prompt this stack never saw: full prefill; its chunks stay in L1 (and are stored to L2)."""
        r = stream_ttft(self.v, prompt, self.a.max_tokens, label=f"{self.l2}:uncached")
        return self._sample("uncached", where, r, []), r["text"]

    def l1_hit(self, where: str, prompt: str, text: str, hits_before: float) -> str:
        """The uncached prompt again: served from LMCache's memory (L1), while that prompt's stores to L2 may still
        be in flight. Checked: the hit tokens, the same greedy text, and no chunk's worth of block-device reads by the
        LMCache server during the request (and, for kvtier, none from its disk tier over the stack: check_disk_hits)."""
        from deploy.stack import vllm_external_hits

        rb0 = read_bytes(self.lm_pid)
        r = stream_ttft(self.v, prompt, self.a.max_tokens, label=f"{self.l2}:l1")
        disk_bytes = read_bytes(self.lm_pid) - rb0
        hit_tokens = vllm_external_hits(self.v) - hits_before
        problems = []
        if hit_tokens < self.res["hit_tokens_expected"]:
            problems.append(f"external hit tokens {hit_tokens:.0f} < {self.res['hit_tokens_expected']}")
        if r["text"] != text:
            problems.append(f"text {r['text']!r} != uncached {text!r}")
        self.res["l1_read_bytes"].append(disk_bytes)
        if disk_bytes >= self.chunk_read_bytes:  # a stray page (a lazy import, metadata) is not a chunk
            problems.append(f"the LMCache server read {disk_bytes} bytes from the block device (not an L1 hit)")
        return self._sample("l1_hit", where, r, problems)

    def check_disk_hits(self, before: float | None, repeats: int) -> str:
        """kvtier: over the stack's repeats its disk tier served exactly the L2 hits and the L2 re-reads (2 x the
        chunks a repeat): the L1 hits and the uncached prompts read nothing from it."""
        if before is None:
            return ""
        served, want = self.disk_hits() - before, 2 * self.chunks * repeats
        if served != want:
            self.res["failed"].append(
                {"where": "stack", "problems": [f"kvtier disk-tier hits grew by {served:.0f}, not {want}"]}
            )
            return f"FAILED: kvtier disk-tier hits grew by {served:.0f}, not {want}"
        return f"kvtier disk-tier hits: {served:.0f} = 2 x {self.chunks} chunks x {repeats} repeats (none by L1 hits)"


def schedule(backends: list[str], rounds: int) -> list[str]:
    """Stack order: ABBA... so a drift of the machine over the run hits every backend alike."""
    out: list[str] = []
    for r in range(rounds):
        out += backends if r % 2 == 0 else backends[::-1]
    return out


def run(a, backends: list[str], fixed: str, fresh: list[str], log, results: list[dict]) -> None:
    """One stack at a time (two idle vLLM CPU servers on 2 cores slow each other down by 5-10x), in ABBA order.
    Samples land in `results` as they come (a run cut short still reports what it has)."""
    from deploy.stack import vllm_external_hits

    merged: dict[str, dict] = {}
    for n, backend in enumerate(schedule(backends, a.rounds)):
        s = Side(a, backend)
        if backend in merged:  # later rounds add their samples to the first round's record
            s.res = merged[backend]
        else:
            merged[backend] = s.res
            results.append(s.res)
        try:
            s.up()
            s.res.setdefault("starts_s", []).append(s.res.pop("start_s"))
            log(f"[{backend}] stack {n + 1} up in {s.res['starts_s'][-1]} s ({s.res['l2_adapter']}, kv dir {s.kv})")
            s.store(fixed, fresh[-2:])
            disk0 = s.disk_hits()
            for i in range(a.repeats):
                where = f"stack {n + 1} repeat {i + 1}"
                before = s.counters()
                s.clear_l1()
                drop_caches()
                gc.collect()  # the client's own garbage collection must not land inside a timed request
                time.sleep(0.2)
                mark(f"repeat {backend} {n + 1} {i + 1}")
                msgs = [s.l2_hit(where, fixed, before)]
                time.sleep(0.1)
                msgs.append(s.l2_again(where, fixed))
                time.sleep(0.1)
                msg, text = s.uncached(where, fresh[i])  # never seen by this stack: full prefill
                msgs.append(msg)
                hits = vllm_external_hits(s.v)
                gc.collect()
                time.sleep(0.1)
                msgs.append(s.l1_hit(where, fresh[i], text, hits))
                log(f"  {i + 1}/{a.repeats}: " + ", ".join(msgs))
                time.sleep(0.3)  # let the fresh prompt's stores finish before the next cold read
            if disk0 is not None:
                log("  " + s.check_disk_hits(disk0, a.repeats))
        finally:
            t0 = time.monotonic()
            s.down()
            log(f"[{backend}] stack {n + 1} down in {time.monotonic() - t0:.1f} s")


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--model",
        default="/var/tmp/kvtier-tiny-model",
        help="model dir; built with deploy/make_tiny_model.py when missing",
    )
    ap.add_argument("--dir", default="/var/tmp/ttft-kvtier-vs-lmcache", help="work dir (kv dirs, state; wiped)")
    ap.add_argument("--repeats", type=int, default=10, help="measurements per stack start")
    ap.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="stack starts per backend, in ABBA order (samples per backend: repeats x rounds)",
    )
    ap.add_argument("--prompt-tokens", type=int, default=1300)
    ap.add_argument("--max-tokens", type=int, default=1)
    ap.add_argument(
        "--io-mode",
        choices=["direct", "buffered"],
        default="direct",
        help="both backends: direct = kvtier O_DIRECT / LMCache fs use_odirect",
    )
    ap.add_argument("--l2", default="kvtier,lmcache-fs", help="backends, in order")
    ap.add_argument("--json", help="write all samples and the summary here")
    ap.add_argument(
        "--timeline",
        metavar="FILE",
        help="record the LMCache servers' prefetch/L2 path (tools/prefetch_timeline) and the client's sends and "
        "first tokens in FILE (appended; costs the servers a little time per event)",
    )
    a = ap.parse_args()
    backends = a.l2.split(",")

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    def on_term(signum, frame):
        raise SystemExit(128 + signum)  # runs the finally blocks: the stack is stopped

    signal.signal(signal.SIGTERM, on_term)
    results: list[dict] = []
    try:
        if os.geteuid() != 0:
            raise BenchError("needs root (drop_caches for cold L2 reads, /proc/PID/io)")
        if bad := [b for b in backends if b not in ("kvtier", "lmcache-fs")]:
            raise BenchError(f"unknown --l2 backend(s) {bad}: kvtier, lmcache-fs")
        if a.prompt_tokens < CHUNK_TOKENS or min(a.repeats, a.rounds, a.max_tokens) < 1:
            raise BenchError("--prompt-tokens >= 256, --repeats, --rounds and --max-tokens >= 1")
        if not Path(a.model, "config.json").exists():
            log(f"building the tiny model in {a.model}")
            subprocess.run(
                [sys.executable, str(ROOT / "deploy" / "make_tiny_model.py"), a.model], check=True, capture_output=True
            )
        fixed, fresh = prompts(a.model, a.prompt_tokens, a.repeats + 2)
        if a.timeline:
            tool = str(ROOT / "tools" / "prefetch_timeline")
            os.environ["PFTRACE_LOG"] = os.path.abspath(a.timeline)
            os.environ["PYTHONPATH"] = tool + (
                os.pathsep + os.environ["PYTHONPATH"] if "PYTHONPATH" in os.environ else ""
            )
            _timeline.append(open(a.timeline, "a"))
        gc.freeze()  # the tokenizer's large heap is never collected again: full collections stay short
        t0 = time.monotonic()
        try:
            run(a, backends, fixed, fresh, log, results)
        finally:
            if any(r["l2_hit"] or r["uncached"] for r in results):
                report(a, results, time.monotonic() - t0)
    except BenchError as exc:
        print(f"ttft_kvtier_vs_lmcache: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:  # run-stack.sh up failed (deploy.stack.up), with its output
        print(f"ttft_kvtier_vs_lmcache: {str(exc).splitlines()[0]}\n{exc}", file=sys.stderr)
        return 1
    want = a.repeats * a.rounds
    complete = all(not r["failed"] and len(r["l2_hit"]) == len(r["l1_hit"]) == want for r in results)
    return 0 if complete and len(results) == len(backends) else 1


def report(a, results: list[dict], wall_s: float) -> None:
    kinds = ("uncached", "l1_hit", "l2_hit", "l2_again")
    for r in results:
        r["summary_ms"] = {
            k: {"p50": nearest_rank(r[k], 0.5), "p90": nearest_rank(r[k], 0.9), "n": len(r[k])} for k in kinds
        }

    def f(x):
        return f"{x:.1f}" if x is not None else "n/a"

    print(
        f"{a.prompt_tokens}-token prompt ({results[0].get('prompt_tokens')} as served), max_tokens {a.max_tokens}, "
        f"{a.repeats} repeats x {a.rounds} stack starts per backend (ABBA), TTFT client-side in ms;\n"
        f"L2 hits cold (L1 cleared, page cache dropped); run took {wall_s:.0f} s"
    )
    print(
        f"{'backend':11} {'L2 adapter':25} {'uncached':>8} {'L1-hit':>7} {'L1-hit':>7} {'L2-hit':>7} {'L2-hit':>7} "
        f"{'L2 again':>8}  samples ok"
    )
    print(f"{'':37} {'p50':>8} {'p50':>7} {'p90':>7} {'p50':>7} {'p90':>7} {'p50':>8}  L1/L2")
    want = a.repeats * a.rounds
    for r in results:
        s = r["summary_ms"]
        print(
            f"{r['backend']:11} {r['l2_adapter']:25} {f(s['uncached']['p50']):>8} {f(s['l1_hit']['p50']):>7} "
            f"{f(s['l1_hit']['p90']):>7} {f(s['l2_hit']['p50']):>7} {f(s['l2_hit']['p90']):>7} "
            f"{f(s['l2_again']['p50']):>8}  {s['l1_hit']['n']}/{want} {s['l2_hit']['n']}/{want}"
        )
    by = {r["backend"]: r["summary_ms"] for r in results}
    if "kvtier" in by and "lmcache-fs" in by:
        for kind, name in (("l1_hit", "L1-hit"), ("l2_hit", "L2-hit")):
            k, m = by["kvtier"][kind], by["lmcache-fs"][kind]
            if k["p50"] and m["p50"]:
                print(
                    f"ratio {name} kvtier / lmcache-fs: p50 {k['p50'] / m['p50']:.2f}x, p90 {k['p90'] / m['p90']:.2f}x "
                    f"(< 1: kvtier faster)"
                )
    for r in results:
        for fl in r["failed"]:
            print(f"{r['backend']}: {fl['where']} left out: {'; '.join(fl['problems'])}")
    if a.json:
        write_run_json(a.json, {"args": vars(a), "wall_s": wall_s, "results": results}, indent=1)


if __name__ == "__main__":
    sys.exit(main())
