#!/usr/bin/env python3
"""ttft_kvtier_vs_lmcache.py	TTFT of a cached prompt served cold from L2: kvtier's disk tier vs LMCache's fs adapter.

usage: benchmarks/ttft_kvtier_vs_lmcache.py [--model DIR] [--dir DIR] [--repeats 10] [--rounds 2]
                                       [--prompt-tokens 1300] [--max-tokens 1] [--io-mode direct|buffered]
                                       [--l2 kvtier,lmcache-fs] [--json OUT]

One run, stacks started one at a time by deploy/run-stack.sh (vLLM on CPU + the LMCache MP server,
`--no-enable-prefix-caching`, a wiped kv dir), --rounds per backend in ABBA order (kvtier, lmcache-fs, lmcache-fs,
kvtier: a drift of the machine hits both alike; two stacks up at once slow each other 5-10x on 2 cores, so never),
differing only in the MP server's L2 adapter:
- kvtier:     kvconnector.lmcache.l2_adapter.KvtierL2Adapter, local disk tier (--io-mode direct = O_DIRECT);
- lmcache-fs: LMCache 0.5.6's own "fs" L2 adapter (lmcache/v1/distributed/l2_adapters/fs_l2_adapter.py,
              FSL2Adapter) on the same kind of directory (--io-mode direct = its `use_odirect: true`).
Per stack: two throw-away requests (first-request warm-up), the fixed prompt once (computed, stored), then
--repeats times:
  0. the counters the checks below compare against are read (a scrape right before the timed request would be
     charged to it);
  1. POST /cache/clear on LMCache's HTTP port (L1 empty), `sync; echo 1 > /proc/sys/vm/drop_caches` (cold L2);
  2. the fixed prompt, streaming, max_tokens --max-tokens: the "L2 hit" TTFT;
  3. the same prompt again, nothing cleared: the "L1 hit" TTFT (LMCache memory, for context);
  4. a fresh prompt of the same length (never seen before): the "uncached" TTFT (full prefill, the reference).
TTFT is measured client-side with perf_counter_ns: request sent -> first SSE event carrying a generated token
(a token's text can be empty for a partial UTF-8 sequence; the event still marks the first token).
Every L2 hit is checked: vLLM's vllm:external_prefix_cache_hits_total must grow by the stored tokens (the chunks
of --prompt-tokens at chunk size 256), the greedy text must equal the computed one, and the LMCache server must
have read the chunks' bytes from the block device (/proc/PID/io read_bytes; kvtier also counts disk-tier hits).
A request that fails a check is reported and left out of the percentiles. Percentiles are nearest-rank over the
repeats x rounds samples (a bounded list). Needs root (drop_caches, /proc/PID/io); stops the stack even on errors.

example (2 cores, virtio disk, tiny model, 185 s; kvconnector/README.md says how to read it):
  $ sudo .venv/bin/python benchmarks/ttft_kvtier_vs_lmcache.py --dir /var/tmp/ttft-lvk
  backend     L2 adapter                  uncached p50  L1-hit p50  L2-hit p50  L2-hit p90  L2 hits ok
  kvtier      kvtier disk (O_DIRECT)           46.9 ms     41.7 ms     40.7 ms     58.1 ms     20/20
  lmcache-fs  LMCache fs (use_odirect)         45.4 ms     39.3 ms     43.7 ms     50.3 ms     20/20
  ratio L2-hit kvtier / lmcache-fs: p50 0.93x, p90 1.16x (< 1: kvtier faster)
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
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

CHUNK_TOKENS = 256  # run-stack.sh's default LMCache chunk size
LABELS = {
    ("kvtier", "direct"): "kvtier disk (O_DIRECT)",
    ("kvtier", "buffered"): "kvtier disk (buffered)",
    ("lmcache-fs", "direct"): "LMCache fs (use_odirect)",
    ("lmcache-fs", "buffered"): "LMCache fs (buffered)",
}


class BenchError(Exception):
    """A one-line user or set-up error."""


def drop_caches() -> None:
    subprocess.run(["sync"], check=False)
    with open("/proc/sys/vm/drop_caches", "w") as fh:
        fh.write("1\n")


def read_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/io") as fh:
        for line in fh:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    return 0


def stream_ttft(base: str, prompt: str, max_tokens: int, timeout_s: float = 60) -> dict:
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


def clear_l1(lmcache_http: str) -> None:
    req = urllib.request.Request(lmcache_http + "/cache/clear", b"", method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        if r.status != 200:
            raise BenchError(f"POST {lmcache_http}/cache/clear answered {r.status}")


def nearest_rank(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def prompts(model: str, n_tokens: int, n_fresh: int) -> tuple[str, list[str]]:
    """The fixed prompt (argparse.py) and n_fresh prompts of the same length never sent before (typing.py windows)."""
    import sysconfig

    from kvtier_stack import _tokenizer, prompt_text

    fixed = prompt_text(model, n_tokens, "argparse.py")
    tok = _tokenizer(model)
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
            "l2_read_bytes": [],
            "failed": [],
            "hit_tokens_expected": self.chunks * CHUNK_TOKENS,
        }

    def up(self) -> None:
        from kvtier_stack import up

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
        from kvtier_stack import down

        down(self.state)

    def disk_hits(self) -> float | None:
        from kvtier_stack import kvtier_event

        return kvtier_event(self.stack, "hits", tier="disk") if self.l2 == "kvtier" else None

    def store(self, fixed: str, warmups: list[str]) -> None:
        """Warm-up requests (one-off first-request costs), then the fixed prompt computed and stored in L2."""
        from kvtier_stack import kvtier_event, wait_for

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
        clear_l1(self.stack.inst(0)["lmcache_http"])

    def counters(self) -> tuple:
        """What l2_hit checks against, read before L1 is cleared: read right before the timed request, the scrape's
        cost showed up in the TTFT (kvconnector/README.md)."""
        from kvtier_stack import vllm_external_hits

        return vllm_external_hits(self.v), read_bytes(self.lm_pid), self.disk_hits()

    def l2_hit(self, where: str, fixed: str, before: tuple) -> str:
        """The fixed prompt after L1 was cleared and the page cache dropped; checked to be a cold L2 hit."""
        from kvtier_stack import vllm_external_hits

        h0, rb0, d0 = before
        r = stream_ttft(self.v, fixed, self.a.max_tokens)
        hit_tokens = vllm_external_hits(self.v) - h0
        disk_bytes = read_bytes(self.lm_pid) - rb0
        problems = []
        if not r["ok"]:
            problems.append(r["error"])
        if hit_tokens < self.res["hit_tokens_expected"]:
            problems.append(f"external hit tokens {hit_tokens:.0f} < {self.res['hit_tokens_expected']}")
        if r["text"] != self.ref["text"]:
            problems.append(f"text {r['text']!r} != computed {self.ref['text']!r}")
        if disk_bytes <= 0:
            problems.append("the LMCache server read nothing from the block device (not a cold L2 read)")
        if d0 is not None and self.disk_hits() - d0 < self.chunks:
            problems.append("kvtier disk-tier hits did not grow by the chunk count")
        self.res["l2_read_bytes"].append(disk_bytes)
        if problems:
            self.res["failed"].append({"where": where, "problems": problems})
        else:
            self.res["l2_hit"].append(r["ttft_ms"])
        ms = r["ttft_ms"] if r["ttft_ms"] is not None else float("nan")
        return f"{self.l2} L2 {ms:.1f} ms ({hit_tokens:.0f} tok, {disk_bytes / 1024:.0f} KiB read)" + (
            " FAILED: " + "; ".join(problems) if problems else ""
        )

    def l1_hit(self, fixed: str) -> str:
        r = stream_ttft(self.v, fixed, self.a.max_tokens)
        if r["ok"] and r["text"] == self.ref["text"]:
            self.res["l1_hit"].append(r["ttft_ms"])
        return f"L1 {r['ttft_ms'] or float('nan'):.1f}"

    def uncached(self, prompt: str) -> str:
        r = stream_ttft(self.v, prompt, self.a.max_tokens)
        if r["ok"]:
            self.res["uncached"].append(r["ttft_ms"])
        return f"uncached {r['ttft_ms'] or float('nan'):.1f}"


def schedule(backends: list[str], rounds: int) -> list[str]:
    """Stack order: ABBA... so a drift of the machine over the run hits every backend alike."""
    out: list[str] = []
    for r in range(rounds):
        out += backends if r % 2 == 0 else backends[::-1]
    return out


def run(a, backends: list[str], fixed: str, fresh: list[str], log, results: list[dict]) -> None:
    """One stack at a time (two idle vLLM CPU servers on 2 cores slow each other down by 5-10x), in ABBA order.
    Samples land in `results` as they come (a run cut short still reports what it has)."""
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
            for i in range(a.repeats):
                before = s.counters()
                s.clear_l1()
                drop_caches()
                gc.collect()  # the client's own garbage collection must not land inside a timed request
                time.sleep(0.2)
                msgs = [s.l2_hit(f"stack {n + 1} repeat {i + 1}", fixed, before)]
                time.sleep(0.1)
                msgs.append(s.l1_hit(fixed))
                time.sleep(0.1)
                msgs.append(s.uncached(fresh[i]))  # never seen by this stack: full prefill
                log(f"  {i + 1}/{a.repeats}: " + ", ".join(msgs))
                time.sleep(0.3)  # let the fresh prompt's stores finish before the next cold read
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
        help="model dir; built with deploy/make-tiny-model.py when missing",
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
                [sys.executable, str(ROOT / "deploy" / "make-tiny-model.py"), a.model], check=True, capture_output=True
            )
        fixed, fresh = prompts(a.model, a.prompt_tokens, a.repeats + 2)
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
    except RuntimeError as exc:  # run-stack.sh up failed (kvtier_stack.up), with its output
        print(f"ttft_kvtier_vs_lmcache: {str(exc).splitlines()[0]}\n{exc}", file=sys.stderr)
        return 1
    complete = all(not r["failed"] and len(r["l2_hit"]) == a.repeats * a.rounds for r in results)
    return 0 if complete and len(results) == len(backends) else 1


def report(a, results: list[dict], wall_s: float) -> None:
    for r in results:
        r["summary_ms"] = {
            k: {"p50": nearest_rank(r[k], 0.5), "p90": nearest_rank(r[k], 0.9), "n": len(r[k])}
            for k in ("uncached", "l1_hit", "l2_hit")
        }

    def f(x):
        return f"{x:8.1f} ms" if x is not None else "       n/a"

    print(
        f"{a.prompt_tokens}-token prompt ({results[0].get('prompt_tokens')} as served), max_tokens {a.max_tokens}, "
        f"{a.repeats} repeats x {a.rounds} stack starts per backend (ABBA), TTFT client-side;\n"
        f"L2 hits cold (L1 cleared, page cache dropped); run took {wall_s:.0f} s"
    )
    print(
        f"{'backend':11} {'L2 adapter':27} {'uncached p50':>12} {'L1-hit p50':>11} {'L2-hit p50':>11} "
        f"{'L2-hit p90':>11}  L2 hits ok"
    )
    for r in results:
        s = r["summary_ms"]
        print(
            f"{r['backend']:11} {r['l2_adapter']:27} {f(s['uncached']['p50']):>12} {f(s['l1_hit']['p50']):>11} "
            f"{f(s['l2_hit']['p50']):>11} {f(s['l2_hit']['p90']):>11}  "
            f"{s['l2_hit']['n']:5}/{a.repeats * a.rounds}"
        )
    by = {r["backend"]: r["summary_ms"]["l2_hit"] for r in results}
    if by.get("kvtier", {}).get("p50") and by.get("lmcache-fs", {}).get("p50"):
        k, m = by["kvtier"], by["lmcache-fs"]
        print(
            f"ratio L2-hit kvtier / lmcache-fs: p50 {k['p50'] / m['p50']:.2f}x, p90 {k['p90'] / m['p90']:.2f}x "
            f"(< 1: kvtier faster)"
        )
    for r in results:
        for fl in r["failed"]:
            print(f"{r['backend']}: {fl['where']} left out: {'; '.join(fl['problems'])}")
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "wall_s": wall_s, "results": results}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
