#!/usr/bin/env python3
"""AIPerf 0.13 vs `kvtier replay`: the same Mooncake and Weka trace files against the same fake prefix-caching server.

For each trace and each cache size (unbounded, and a bounded LRU), one fake server per tool
(replay/openai/fake_server.py, in this process: it keeps every body and its arrival time), then:

  aiperf   `python -m aiperf profile --endpoint-type chat --streaming --custom-dataset-type mooncake_trace|weka_trace`
           on a copy of the trace whose times are divided by --speedup (AIPerf 0.13's only speed-up of a Mooncake
           file, --synthesis-speedup-ratio, also re-synthesises its hash ids; a Weka file has none) and, for a
           Mooncake file at --block-tokens other than 512, whose input_length is rescaled as kvtier rescales it
           (--isl-block-size maps an id to that many tokens but keeps input_length); output_length 1 (Mooncake)
  kvtier   `kvtier replay --endpoint chat --source mooncake|weka` on the unchanged file, --trace-speedup,
           --trace-block-tokens (Mooncake), --trace-timing think (Weka), --max-tokens 1 (Mooncake)

AIPerf needs a tokenizer: it gets a word-level one (every whitespace word of its own prompt corpus is a token, its
BOS `<s>` one more), built here in an HF cache layout under --dir (AIPerf 0.13's decode workers set HF_HUB_OFFLINE=1
and then load a tokenizer by repo name only, not by a local path), so that its token counts are the fake server's.

Compared, per tool, from what the server received: requests; arrival order (the prompts' lengths in arrival order
against the trace's, whose lengths tell its requests apart) and arrival offsets (from the first arrival, against
the trace's times / speedup); per request the leading whole blocks it shares with the requests that arrived before
it (chained block hashes of the server's whitespace tokens, the server's own rule), against the trace's (the
longest common run of leading ids with an earlier request, whole blocks only); the server's prefix hit rate
(vllm:prefix_cache_hits_total / queries_total) against `kvtier plan --trace`'s (reuse_profile(trace).hit_rate).

  python benchmarks/aiperf_vs_kvtier.py --aiperf-python /var/tmp/aiperf-venv/bin/python --dir /var/tmp/kvtier-aiperf
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from replay.cli import main as kvtier
from replay.common.cli import fail
from replay.common.json_files import write_json
from replay.openai.fake_server import FakeServer, FakeServerConfig
from replay.outputs.jsonl import write_jsonl
from replay.outputs.paths import default_results_path
from replay.outputs.provenance import write_run_json
from replay.plan.trace import reuse_profile
from replay.sources.block_traces import FORMATS, load_block_trace

PROG = "aiperf_vs_kvtier"
ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "replay" / "data"
MOONCAKE = DATA / "mooncake" / "conversation_trace_head300.jsonl"
WEKA = DATA / "weka" / "kv-cache-tester" / "trace_0291.json"
TOKENIZER = "kvtier/whitespace-words"  # the repo name AIPerf is given; the files are made here
SNAPSHOT = "0" * 39 + "1"
KEEP_BODIES = 1 << 20
UNBOUNDED = 1e12  # the plan's capacity for "no bound"


def parse_args(argv):
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--aiperf-python",
        default=os.environ.get("KVTIER_AIPERF_PYTHON", "/var/tmp/aiperf-venv/bin/python"),
        help="a Python with aiperf 0.13.0 installed (default $KVTIER_AIPERF_PYTHON, else the make target's venv)",
    )
    p.add_argument("--dir", required=True, help="scratch directory: tokenizer, trace copies, AIPerf's artifacts")
    p.add_argument("--traces", nargs="+", choices=("mooncake", "weka"), default=["mooncake", "weka"])
    p.add_argument("--mooncake", type=Path, default=MOONCAKE)
    p.add_argument("--weka", type=Path, default=WEKA)
    p.add_argument("--num-requests", type=int, default=300, help="the Mooncake file's first N rows")
    p.add_argument("--block-tokens", type=int, default=16, help="the Mooncake file's block rescaled to this")
    p.add_argument("--speedup", type=float, default=100.0, help="both tools replay the trace's times / this")
    p.add_argument("--mooncake-cache-tokens", type=int, default=20_000, help="the bounded case's LRU (Mooncake)")
    p.add_argument("--weka-cache-tokens", type=int, default=40_000, help="the bounded case's LRU (Weka)")
    p.add_argument("--timeout-s", type=float, default=300.0, help="per tool run")
    p.add_argument("--output", default=None, help="JSON of the run (default results/<datetime>.json)")
    return p.parse_args(argv)


# ---------------------------------------------------------------- AIPerf's inputs


def aiperf_corpus(python: str) -> Path:
    """AIPerf's prompt corpus (its default, the sonnet one) as its installed package has it."""
    code = (
        "import os, aiperf.dataset.generator.prompt as p;"
        "print(os.path.join(os.path.dirname(p.__file__), p.DEFAULT_CORPUS_FILE))"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise SystemExit(f"{PROG}: {python} cannot import aiperf: {(out.stderr.strip().splitlines() or [''])[-1]}")
    return Path(out.stdout.strip())


def make_tokenizer(corpus: Path, hf_home: Path) -> None:
    """A word-level tokenizer (tokenizers' JSON format) over the corpus's whitespace words, in an HF cache layout."""
    words = sorted(set(corpus.read_text(encoding="utf-8").split()))
    specials = ["<unk>", "<s>", "</s>"]
    vocab = {w: i for i, w in enumerate(specials + [w for w in words if w not in specials])}
    added = [
        {"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False}
        | {"special": True}
        for i, s in enumerate(specials)
    ]
    spec = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": None,  # ids decode to their words joined by one space
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "model_max_length": 1 << 30,
    }
    repo = hf_home / "hub" / ("models--" + TOKENIZER.replace("/", "--"))
    snap = repo / "snapshots" / SNAPSHOT
    snap.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(SNAPSHOT)
    write_json(snap / "tokenizer.json", spec, indent=None)
    write_json(snap / "tokenizer_config.json", config)


def mooncake_copy(src: Path, dst: Path, n: int, block: int, speedup: float) -> None:
    """The first n rows: times / speedup, input_length rescaled to `block` as kvtier does, one output token."""
    native = FORMATS["mooncake"]
    rows = []
    with src.open() as f:
        for line, _ in zip(f, range(n)):
            row = json.loads(line)
            row["timestamp"] = row["timestamp"] / speedup
            if block != native:
                row["input_length"] = math.ceil(row["input_length"] * block / native)
            row["output_length"] = 1
            rows.append(row)
    write_jsonl(rows, dst)


def weka_copy(src: Path, dst: Path, speedup: float) -> None:
    """The conversation with every time / speedup (t, api_time, think_time; a sub-agent's whole ms duration)."""

    def scale(calls):
        for c in calls:
            c["t"] = c["t"] / speedup
            for k in ("api_time", "think_time", "ttft"):
                if c.get(k) is not None:
                    c[k] = c[k] / speedup
            if c.get("duration_ms") is not None:
                c["duration_ms"] = round(c["duration_ms"] / speedup)  # AIPerf's schema: an integer
            scale(c.get("requests") or [])

    doc = json.loads(src.read_text())
    scale(doc["requests"])
    write_json(dst, doc, indent=None)


# ---------------------------------------------------------------- runs


def run_aiperf(args, fmt: str, trace_copy: Path, n: int, block: int, base_url: str, out: Path) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    cmd = [args.aiperf_python, "-m", "aiperf", "profile", "--model", "fake", "--url", base_url]
    cmd += ["--endpoint-type", "chat", "--streaming", "--tokenizer", TOKENIZER, "--input-file", str(trace_copy)]
    cmd += ["--ui", "none", "--no-server-metrics", "--random-seed", "1", "--artifact-dir", str(out)]
    if fmt == "mooncake":
        cmd += ["--custom-dataset-type", "mooncake_trace", "--isl-block-size", str(block), "--fixed-schedule"]
    else:
        cmd += ["--custom-dataset-type", "weka_trace", "--prompt-corpus", "sonnet", "--request-count", str(n)]
    env = dict(os.environ, HF_HOME=str(Path(args.dir) / "hf"), HF_HUB_OFFLINE="1")
    t0 = time.monotonic_ns()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout_s)
    (out.parent / (out.name + ".log")).write_text(p.stdout + p.stderr)
    return {"rc": p.returncode, "wall_s": (time.monotonic_ns() - t0) / 1e9, "command": cmd}


def run_kvtier(args, fmt: str, path: Path, n: int, base_url: str, out: Path) -> dict:
    argv = ["replay", "--base-url", base_url, "--model", "fake", "--endpoint", "chat", "--quiet"]
    argv += ["--source", fmt, "--dataset-path", str(path), "--trace-speedup", f"{args.speedup:g}"]
    argv += ["--output", str(out)]
    if fmt == "mooncake":
        argv += ["--trace-block-tokens", str(args.block_tokens), "--num-requests", str(n), "--max-tokens", "1"]
    else:  # AIPerf 0.13 caps neither a pause nor the recorded answer's length
        argv += ["--trace-timing", "think", "--max-idle-s", "1e9", "--max-tokens-cap", "1000000"]
    t0 = time.monotonic_ns()
    rc = kvtier(argv)
    return {"rc": rc, "wall_s": (time.monotonic_ns() - t0) / 1e9, "command": ["kvtier", *argv]}


def prefix_counters(base_url: str) -> tuple[float, float]:
    text = urllib.request.urlopen(base_url + "/metrics", timeout=10).read().decode()
    value = {ln.split("{")[0]: float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith("vllm:")}
    return value["vllm:prefix_cache_queries_total"], value["vllm:prefix_cache_hits_total"]


# ---------------------------------------------------------------- what the server saw


def server_tokens(body: dict) -> list[str]:
    """The fake server's whitespace tokens of a chat body: each message as `<role> content`, in order."""
    parts = []
    for m in body.get("messages", []):
        c = m.get("content")
        if isinstance(c, list):
            c = " ".join(p.get("text", "") for p in c if isinstance(p, dict))
        parts.append(f"<{m.get('role', 'user')}> {c or ''}")
    return " ".join(parts).split()


def chain(tokens: list[str], block: int) -> list[bytes]:
    """Chained hashes of the whole blocks (block k's covers blocks 0..k), as the server keys its cache."""
    out, h = [], b""
    for i in range(0, len(tokens) - len(tokens) % block, block):
        h = hashlib.blake2b(h + " ".join(tokens[i : i + block]).encode(), digest_size=8).digest()
        out.append(h)
    return out


def shared_blocks(token_lists: list[list[str]], block: int) -> list[int]:
    """Per request, in arrival order: its leading whole blocks that an earlier request's prompt had."""
    seen: set[bytes] = set()
    shared = []
    for tokens in token_lists:
        hashes = chain(tokens, block)
        k = 0
        while k < len(hashes) and hashes[k] in seen:
            k += 1
        shared.append(k)
        seen.update(hashes)
    return shared


def trace_shared_blocks(trace) -> list[int]:
    """Per request, in the trace's order: the longest run of leading ids (whole blocks only) an earlier one had."""
    b = trace.block_tokens
    seen: set[tuple[int, ...]] = set()
    shared = []
    for r in trace.requests:
        ids = tuple(r.hash_ids[: r.input_tokens // b])
        k = 0
        while k < len(ids) and ids[: k + 1] in seen:
            k += 1
        shared.append(k)
        seen.update(ids[: j + 1] for j in range(len(ids)))
    return shared


def observed(srv: FakeServer, block: int) -> dict:
    bodies, arrivals = srv.recent_bodies, srv.recent_arrivals_ns
    tokens = [server_tokens(b) for b in bodies]
    t0 = arrivals[0] if arrivals else 0
    return {
        "requests": len(bodies),
        "prompt_tokens": [len(t) for t in tokens],
        "arrival_ms": [(a - t0) / 1e6 for a in arrivals],
        "shared_blocks": shared_blocks(tokens, block),
        "max_tokens": [b.get("max_tokens", b.get("max_completion_tokens")) for b in bodies],
        "messages": [len(b.get("messages", [])) for b in bodies],
    }


def identify(lengths: list[int], trace) -> list[int]:
    """The trace index of each request received, in arrival order: the earliest not yet matched of its length (a
    prompt's content length, without the server's role words), -1 for one the trace has no length for."""
    free: dict[int, list[int]] = {}
    for i, r in enumerate(trace.requests):
        free.setdefault(r.input_tokens, []).append(i)
    return [free[n].pop(0) if free.get(n) else -1 for n in lengths]


def compare(trace, seen: dict, speedup: float) -> dict:
    """One tool's run against the trace: requests, order, times, shared blocks, each request matched to its row."""
    lengths = [n - m for n, m in zip(seen["prompt_tokens"], seen["messages"])]
    idx = identify(lengths, trace)
    want_shared = trace_shared_blocks(trace)
    got = [(s, want_shared[i]) for s, i in zip(seen["shared_blocks"], idx) if i >= 0]
    inverted = [(a, b) for n, a in enumerate(idx) for b in idx[n + 1 :] if a > b >= 0]
    t0 = trace.requests[0].arrival_s
    sched_ms = [(r.arrival_s - t0) * 1e3 / speedup for r in trace.requests]
    out = {
        "requests_sent": seen["requests"],
        "requests_in_trace": len(trace.requests),
        "unmatched": idx.count(-1),
        "in_trace_order": idx == list(range(len(trace.requests))),
        "inverted_pairs": len(inverted),
        "arrival_order": idx,
        "shared_blocks_total": sum(seen["shared_blocks"]),
        "shared_blocks_total_trace": sum(want_shared),
        "shared_blocks_equal_trace": sum(a == b for a, b in got),
        "shared_blocks_more_than_trace": sum(a > b for a, b in got),
        "shared_blocks_less_than_trace": sum(a < b for a, b in got),
    }
    if inverted:  # how far apart in the trace's (sped-up) time the requests sent the other way round were
        out["inverted_max_schedule_gap_ms"] = max(sched_ms[a] - sched_ms[b] for a, b in inverted)
    lag = sorted(a - sched_ms[i] for a, i in zip(seen["arrival_ms"], idx) if i >= 0)
    if lag:  # arrival minus schedule, less its median (the first arrival's own lag cancels)
        med = lag[len(lag) // 2]
        out["arrival_jitter_ms"] = {"min": lag[0] - med, "max": lag[-1] - med, "median_lag": med}
    return out


def measure(args, fmt: str, cache_tokens: int, trace, src: Path, copy: Path, block: int, scratch: Path) -> dict:
    n = len(trace.requests)
    case = f"{fmt}-{cache_tokens or 'unbounded'}"
    predicted = reuse_profile(trace).hit_rate(cache_tokens or UNBOUNDED)
    row: dict = {"trace": fmt, "file": src.name, "cache_tokens": cache_tokens, "block_tokens": block}
    row["plan_hit_rate"] = predicted
    cfg = FakeServerConfig(block_size=block, cache_tokens=cache_tokens, keep_bodies=KEEP_BODIES)
    for tool in ("aiperf", "kvtier"):
        with FakeServer(cfg) as srv:
            if tool == "aiperf":
                run = run_aiperf(args, fmt, copy, n, block, srv.base_url, scratch / f"{case}-aiperf")
            else:
                run = run_kvtier(args, fmt, src, n, srv.base_url, scratch / f"{case}-kvtier.json")
            queries, hits = prefix_counters(srv.base_url)
            seen = observed(srv, block)
        rate = hits / queries if queries else None
        row[tool] = {
            **run,
            "hit_rate": rate,
            "hit_rate_minus_plan": None if rate is None else rate - predicted,
            **compare(trace, seen, args.speedup),
            "per_request": seen,
        }
    # the two tools' figures for the same trace request (matched by identify)
    by = {}
    for tool in ("aiperf", "kvtier"):
        t = row[tool]
        by[tool] = {
            i: (s, a)
            for i, s, a in zip(t["arrival_order"], t["per_request"]["shared_blocks"], t["per_request"]["arrival_ms"])
        }
    both = sorted(set(by["aiperf"]) & set(by["kvtier"]) - {-1})
    row["between_tools"] = {
        "same_order": row["aiperf"]["arrival_order"] == row["kvtier"]["arrival_order"],
        "shared_blocks_differ": sum(by["aiperf"][i][0] != by["kvtier"][i][0] for i in both),
        "max_arrival_gap_ms": max((abs(by["aiperf"][i][1] - by["kvtier"][i][1]) for i in both), default=0.0),
    }
    return row


def run_all(args) -> dict:
    scratch = Path(args.dir)
    scratch.mkdir(parents=True, exist_ok=True)
    make_tokenizer(aiperf_corpus(args.aiperf_python), scratch / "hf")
    rows = []
    if "mooncake" in args.traces:
        copy = scratch / "mooncake-aiperf.jsonl"
        mooncake_copy(args.mooncake, copy, args.num_requests, args.block_tokens, args.speedup)
        trace = load_block_trace(args.mooncake, "mooncake", block_tokens=args.block_tokens,
                                 max_requests=args.num_requests)  # fmt: skip
        for cache in dict.fromkeys((0, args.mooncake_cache_tokens)):  # 0: the unbounded case alone
            rows.append(measure(args, "mooncake", cache, trace, args.mooncake, copy, args.block_tokens, scratch))
    if "weka" in args.traces:
        copy = scratch / "weka-aiperf" / args.weka.name
        copy.parent.mkdir(exist_ok=True)
        weka_copy(args.weka, copy, args.speedup)
        trace = load_block_trace(args.weka, "weka")
        for cache in dict.fromkeys((0, args.weka_cache_tokens)):
            rows.append(measure(args, "weka", cache, trace, args.weka, copy, trace.block_tokens, scratch))
    return {"speedup": args.speedup, "aiperf_python": args.aiperf_python, "rows": rows}


def table(doc: dict) -> str:
    head = f"{'case':<22}{'tool':<8}{'sent':>6}{'inverted':>10}{'shared=trace':>14}{'hit rate':>10}{'plan':>8}"
    lines = [head]
    for r in doc["rows"]:
        case = f"{r['trace']} {r['cache_tokens'] or 'unbounded'}"
        for tool in ("aiperf", "kvtier"):
            t = r[tool]
            rate = "-" if t["hit_rate"] is None else f"{t['hit_rate']:.4f}"
            lines.append(
                f"{case:<22}{tool:<8}{t['requests_sent']:>4}/{t['requests_in_trace']:<3}"
                f"{t['inverted_pairs']:>8}{t['shared_blocks_equal_trace']:>10}/{len(t['per_request']['shared_blocks']):<3}"
                f"{rate:>10}{r['plan_hit_rate']:>8.4f}"
            )
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    if not Path(args.aiperf_python).exists():
        return fail(PROG, f"no {args.aiperf_python}: `make bench-aiperf` makes the AIPerf venv")
    doc = run_all(args)
    out = args.output or default_results_path()
    write_run_json(out, doc, argv=sys.argv if argv is None else [PROG, *argv], script=__file__)
    print(table(doc))
    print(f"written {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
