#!/usr/bin/env python3
"""trace_vs_plan.py	A scaled Mooncake trace on the real CPU stack, kvtier's disk tier against `kvtier plan --trace`.

usage: benchmarks/trace_vs_plan.py [--trace FILE] [--format mooncake] [--trace-block-tokens 64] [--max-requests N]
                                   [--disk-mb 15,37] [--model DIR] [--out DIR]

What it checks: that the hit rate `kvtier plan --trace` predicts for a block-hash trace from the trace alone is the
one the live stack (vLLM + LMCache + kvtier) gets for the same trace and capacity.
1. The trace (default: the last 193 requests of Mooncake's synthetic_trace.jsonl, committed under tests/replay/data/
   mooncake/ with its source and licence) is scaled with --trace-block-tokens (a 512-token block becomes N tokens,
   every length with it), and N is also LMCache's chunk and vLLM's block, so one trace block is one kvtier entry.
2. For each --disk-mb, a stack with a kvtier disk tier of that size (run-stack.sh: vLLM's own prefix cache off, so
   every reuse comes through LMCache): the requests are sent one at a time in trace order, each prompt made by
   `kvtier replay`'s block-hash source (replay.openai.workload.TextMaker.block_prompt, calibrated on the server's
   /tokenize) and sent as is to /v1/completions (one output token). After each request, once kvtier's writes have
   settled, LMCache's memory (L1) is emptied (POST /cache/clear): every hit of the next request comes from kvtier's
   disk tier, an LRU of whole entries. kvtier holds target_usage_ratio (0.9) of its capacity before it evicts, so the
   tier keeps floor(0.9 x capacity / entry) entries; the run reads the number it really kept from kvtier's metrics.
3. `kvtier plan --trace FILE --trace-block-tokens N --tier disk=<entries x N tokens>` predicts the hit rate; the
   measured ones are vLLM's external prefix-cache hits over its queries (tokens, as vLLM counts them) and kvtier's
   own (hit entries x N over the prompts' tokens). Verdict: each within 3 points of the plan.
Not measured here: vLLM's own prefix cache as a tier above (it frees a finished request's blocks tail first, an
order the plan's LRU does not follow) and LMCache's L1 as a tier (LMCache 0.5.6 evicts by watermark, not LRU).
Everything lands in a new directory (--out, default results/trace-vs-plan-<UTC time>; an existing non-empty one is
refused): plan-<mb>.json, trace_vs_plan.json (the table), trace_vs_plan.png, the stacks' logs.

example (2 cores: about 6 minutes, two stack start-ups and 193 requests each):
  benchmarks/trace_vs_plan.py --disk-mb 15,37
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from deploy import make_tiny_model
from deploy import stack as live
from replay.outputs.provenance import write_run_json

ROOT = Path(__file__).resolve().parents[1]
PY = os.environ.get("PYTHON") or (str(ROOT / ".venv/bin/python") if (ROOT / ".venv/bin/python").exists() else "python3")
SAMPLE = ROOT / "tests" / "replay" / "data" / "mooncake" / "synthetic_trace_lines3801-3993.jsonl"
TARGET_POINTS = 0.03


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def parse(argv):
    p = argparse.ArgumentParser(
        prog="benchmarks/trace_vs_plan.py",
        description=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--trace", default=str(SAMPLE), help="a block-hash trace file (default: the committed window)")
    p.add_argument("--format", default="mooncake", help="its format (kvtier plan --trace's --format)")
    p.add_argument("--trace-block-tokens", type=int, default=64, help="trace block = LMCache chunk = vLLM block")
    p.add_argument("--max-requests", type=int, default=0, help="the first N requests (0: all)")
    p.add_argument("--disk-mb", default="15,37", help="kvtier disk tier sizes in MB, one stack each (comma list)")
    p.add_argument("--model", default="/tmp/kvtier-tiny-model-16k", help="model dir (deploy/make_tiny_model.py)")
    p.add_argument("--max-model-len", type=int, default=16384, help="vLLM's and the model's longest prompt")
    p.add_argument("--out", help="new results directory (default results/trace-vs-plan-<UTC time>)")
    a = p.parse_args(argv)

    def bad_usage(msg: str):  # one line and exit 2, not the usage text
        p.exit(2, f"benchmarks/trace_vs_plan.py: {msg}\n")

    try:
        a.disk_mb = [float(x) for x in a.disk_mb.split(",") if x]
    except ValueError:
        bad_usage(f"--disk-mb {a.disk_mb!r}: give sizes in MB, e.g. 15,37")
    if not a.disk_mb or min(a.disk_mb) <= 0:
        bad_usage("--disk-mb: give at least one size > 0")
    if a.trace_block_tokens < 32 or a.trace_block_tokens % 32:
        bad_usage("--trace-block-tokens must be a multiple of 32 (it is vLLM's block size too; CPU attention's rule)")
    if a.max_requests < 0 or a.max_model_len < 256:
        bad_usage("--max-requests must be >= 0 and --max-model-len >= 256")
    if not Path(a.trace).exists():
        bad_usage(f"--trace {a.trace}: no such file")
    return a


def kvtier_plan(a, out: Path, tag: str, *extra: str) -> dict:
    cmd = [PY, "-m", "replay.plan.cli", "--trace", a.trace, "--format", a.format, "--quiet"]
    cmd += ["--trace-block-tokens", str(a.trace_block_tokens), "--output", str(out / f"plan-{tag}.json"), *extra]
    if a.max_requests:
        cmd += ["--max-requests", str(a.max_requests)]
    res = subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True)
    if res.returncode != 0:
        raise SystemExit(f"trace_vs_plan.py: kvtier plan failed ({res.returncode}): {res.stderr.strip()[-1000:]}")
    return json.loads((out / f"plan-{tag}.json").read_text())["traces"][0]


def settled(read, interval_s: float = 0.3, timeout_s: float = 60.0) -> None:
    """Return once two reads `interval_s` apart agree (or after `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    last = read()
    while time.monotonic() < deadline:
        time.sleep(interval_s)
        now = read()
        if now == last:
            return
        last = now


def replay_one_at_a_time(stack: live.Stack, trace, progress) -> None:
    """Each request of the trace in order, with kvtier replay's prompt for it; then LMCache's L1 emptied."""
    import aiohttp

    from replay.openai.workload import TextMaker

    maker = TextMaker()

    async def calibrate():
        async with aiohttp.ClientSession() as session:
            await maker.prepare(session, stack.vllm, "tiny")

    asyncio.run(calibrate())
    if maker.mode != "server:/tokenize":
        raise SystemExit(f"trace_vs_plan.py: the server's /tokenize did not answer ({maker.fallback_reason})")

    def writes() -> float:
        return live.metric(live.metrics(stack.inst()["kvtier_metrics"]), "kvtier_ops_total", op="write")

    for i, req in enumerate(trace.requests):
        prompt = maker.block_prompt(req.hash_ids, req.input_tokens, trace.block_tokens, unique=f"request:{i}")
        live.complete(stack.vllm, prompt, max_tokens=1)
        settled(writes)  # LMCache hands the chunks to kvtier after the request: wait until kvtier's writes stop
        live.clear_l1(stack)
        progress(i + 1)


def measure(stack: live.Stack, trace, block: int, progress) -> dict:
    replay_one_at_a_time(stack, trace, progress)
    vm = live.metrics(stack.vllm + "/metrics")
    km = live.metrics(stack.inst()["kvtier_metrics"])
    prompt_tokens = sum(r.input_tokens for r in trace.requests)
    queries = live.metric(vm, "vllm:external_prefix_cache_queries_total")
    return {
        "vllm_external_hit_rate": live.metric(vm, "vllm:external_prefix_cache_hits_total") / queries,
        "vllm_queried_tokens": queries,
        "kvtier_hit_rate": live.metric(km, "kvtier_backend_events_total", event="load_hits") * block / prompt_tokens,
        "kvtier_entries": int(live.metric(km, "kvtier_tier_entries")),
        "kvtier_evictions": int(live.metric(km, "kvtier_tier_events_total", event="evictions")),
        "kvtier_entry_bytes": live.metric(km, "kvtier_tier_used_bytes")
        / max(1, live.metric(km, "kvtier_tier_entries")),
        "prompt_tokens": prompt_tokens,
    }


def main(argv: list[str] | None = None) -> int:
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn
    from rich.table import Table

    from kvconnector.backend_config import BackendConfig
    from replay.outputs.terminal import console
    from replay.sources.block_traces import load_block_trace

    a = parse(argv)
    out = Path(a.out or ROOT / "results" / time.strftime("trace-vs-plan-%Y%m%d-%H%M%S", time.gmtime()))
    if out.exists() and any(out.iterdir()):
        print(f"trace_vs_plan.py: {out} exists and is not empty; give a new --out", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    block = a.trace_block_tokens
    trace = load_block_trace(a.trace, a.format, block_tokens=block, max_requests=a.max_requests or None)
    longest = max(r.input_tokens for r in trace.requests)
    if longest + 2 > a.max_model_len:
        print(f"trace_vs_plan.py: a prompt of {longest} tokens does not fit --max-model-len {a.max_model_len}; "
              f"give a smaller --trace-block-tokens or a larger --max-model-len", file=sys.stderr)  # fmt: skip
        return 2
    say(f"model {a.model} (max length {a.max_model_len})")
    shape = make_tiny_model.ensure(a.model, max_len=a.max_model_len)
    entry_bytes = block * shape["kv_bytes_per_token"]
    fill = BackendConfig.model_fields["target_usage_ratio"].default
    load0 = os.getloadavg()
    span = f"{block * 10:g}..{block * 1e5:g}"
    sweep = kvtier_plan(a, out, "sweep", "--capacity-sweep", span, "--points-per-decade", "8")

    rows = []
    for mb in a.disk_mb:
        entries = int(mb * 1e6 * fill // entry_bytes)
        plan = kvtier_plan(a, out, f"{mb:g}MB", "--tier", f"disk={entries * block}")
        state, kv = out / f"stack-{mb:g}MB", out / f"kv-{mb:g}MB"
        up = ["--disk-gb", f"{mb / 1e3:g}", "--chunk-size", str(block), "--block-size", str(block)]
        up += ["--max-model-len", str(a.max_model_len), "--max-num-seqs", "1", "--prefix-caching", "off"]
        say(f"{mb:g} MB: starting the stack (vLLM + LMCache + kvtier, {entries} entries of {entry_bytes} B)")
        try:
            stack = live.up(state, a.model, kv, *up)
            columns = (TextColumn("{task.description}", markup=False), BarColumn(), TaskProgressColumn())
            columns += (TimeRemainingColumn(),)
            with Progress(*columns, console=console(), transient=True) as bar:
                task = bar.add_task(f"{mb:g} MB: {len(trace.requests)} requests", total=len(trace.requests))
                t0 = time.monotonic()
                m = measure(stack, trace, block, lambda n, task=task: bar.update(task, completed=n))
            say(f"{mb:g} MB: {len(trace.requests)} requests in {time.monotonic() - t0:.0f} s")
        except RuntimeError as exc:
            raise SystemExit(f"trace_vs_plan.py: {exc}") from None
        finally:
            live.down(state)
            shutil.rmtree(kv, ignore_errors=True)  # this run's own tier (tens of MB), made in its new --out
        predicted = plan["tiers"][0]["hit_rate"]
        rows.append({
            "disk_mb": mb, "planned_entries": entries, **m, "plan_hit_rate": predicted,
            "max_hit_rate": plan["max_hit_rate"],
            "vllm_minus_plan": m["vllm_external_hit_rate"] - predicted,
            "kvtier_minus_plan": m["kvtier_hit_rate"] - predicted,
        })  # fmt: skip
    load1 = os.getloadavg()
    ok = all(abs(r["vllm_minus_plan"]) <= TARGET_POINTS and abs(r["kvtier_minus_plan"]) <= TARGET_POINTS for r in rows)
    doc = {
        "command": " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "loadavg_before": [round(x, 2) for x in load0],
        "loadavg_after": [round(x, 2) for x in load1],
        "trace": {"file": a.trace, "format": a.format, "requests": len(trace.requests), "block_tokens": block},
        "rows": rows,
        "verdict": {"target_points": TARGET_POINTS, "ok": ok},
        "curve": sweep["curve"],
    }
    write_run_json(out / "trace_vs_plan.json", doc, argv=argv)
    t = Table(title=f"{Path(a.trace).name}, {len(trace.requests)} requests, {block}-token blocks: hit rate")
    for col in ("kvtier disk", "entries kept", "kvtier plan", "vLLM external", "kvtier's own", "max (infinite)"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(
            f"{r['disk_mb']:g} MB", f"{r['kvtier_entries']} ({r['planned_entries']} planned)",
            f"{r['plan_hit_rate']:.3f}", f"{r['vllm_external_hit_rate']:.3f} ({100 * r['vllm_minus_plan']:+.1f} pt)",
            f"{r['kvtier_hit_rate']:.3f} ({100 * r['kvtier_minus_plan']:+.1f} pt)", f"{r['max_hit_rate']:.3f}",
        )  # fmt: skip
    console().print(t)
    plot(doc, out / "trace_vs_plan.png")
    print(f"{'within' if ok else 'NOT within'} {100 * TARGET_POINTS:g} points of the plan; results in {out}")
    return 0 if ok else 1


def plot(doc: dict, path: Path) -> None:
    """The plan's curve (hit rate against the tier's capacity) with the measured points on it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    block = doc["trace"]["block_tokens"]
    xs = [p["capacity_tokens"] / block for p in doc["curve"]]
    ax.plot(xs, [p["hit_rate"] for p in doc["curve"]], "-", color="tab:gray", label="kvtier plan --trace")
    rows = doc["rows"]
    ax.plot([r["kvtier_entries"] for r in rows], [r["plan_hit_rate"] for r in rows], "o", ms=11, mfc="none",
            color="tab:gray", label="plan at the entries kvtier kept")  # fmt: skip
    ax.plot([r["kvtier_entries"] for r in rows], [r["vllm_external_hit_rate"] for r in rows], "s", color="tab:blue",
            label="measured: vLLM external hits")  # fmt: skip
    ax.plot([r["kvtier_entries"] for r in rows], [r["kvtier_hit_rate"] for r in rows], "^", color="tab:orange",
            label="measured: kvtier's own hits")  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlabel(f"kvtier disk tier capacity (entries of {block} tokens)")
    ax.set_ylabel("prefix hit rate (hit tokens / prompt tokens)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    tr = doc["trace"]
    ax.set_title(f"{Path(tr['file']).name}: {tr['requests']} requests, live stack vs plan", fontsize=9)
    fig.text(0.995, 0.005, f"benchmarks/trace_vs_plan.py {doc['date_utc']} UTC", ha="right", va="bottom", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
