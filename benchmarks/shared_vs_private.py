#!/usr/bin/env python3
"""shared_vs_private.py	N instances behind the round-robin proxy: private disk tiers vs one shared tier (on throttlefs,
with added latency standing in for a networked file system), multi-turn sessions, per chunk size.

usage: benchmarks/shared_vs_private.py [--instances 2] [--chunk-sizes 256,128] [--shared-lat-ms 0,1,2,5]
                                       [--sessions 5] [--rounds 4] [--input-len 512] [--output-len 16]
                                       [--dir DIR] [--json OUT] [--plot PNG]

The JGU Mainz storage-tiering case study ("Wo der KV-Cache liegt", 2026; vLLM 0.19 + LMCache): four instances sharing
one GekkoFS tier reached parity with private local NVMe after tuning (chunk size, backend), and a shared tier is to be
judged by its per-operation latency first. Here, per chunk size:
- private: deploy/run-stack.sh --instances N, each instance its own kvtier disk tier (no --shared-dir);
- shared:  --instances N --shared-dir on a throttlefs mount --disk-gb 0 (every store lands in the shared tier),
           once per --shared-lat-ms (the mount's latency per operation changed live, the stack stays up).
Each point replays the same kind of load with fresh sessions (its own seed): `kvtier replay --source synthetic --rounds
R --concurrency S` through the proxy, so a session's consecutive turns land on different instances (as behind the load
balancer of the JGU Mainz storage-tiering case study, 2026; S must not be a multiple of N: rounds go out in lockstep and
the rotation is per request, so with S = 4 and N = 2 every session would stay on one instance). LMCache's L1 is kept
small (--l1-gb 0.2) and cleared on every instance before each point. Reported per point, from vLLM's and kvtier's
Prometheus counters over the run (replay's --metrics-url on every instance's vLLM and kvtier exporter): prefix hit rate
(tokens served from a cache / prompt tokens), the share of kvtier reads served by the shared tier, TTFT p50/p95,
recomputed prompt tokens (vLLM's local_compute), and the load average.
Needs root (FUSE). One stack at a time (two slow each other several-fold on 2 cores).

example: sudo .venv/bin/python benchmarks/shared_vs_private.py --json svp.json --plot svp.png
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from deploy import make_tiny_model
from replay.outputs.provenance import write_run_json

ROOT = Path(__file__).resolve().parents[1]

PROG = "shared_vs_private"


def _make_tiny_model(out: Path) -> str:
    make_tiny_model.ensure(str(out))
    return str(out)


def replay_point(a, stack, out: Path, seed: int) -> dict:
    """One replay through the proxy; the summary's figures for the table."""
    from deploy.stack import clear_l1

    for i in range(len(stack.endpoints["instances"])):
        clear_l1(stack, i)
    urls = []
    for inst in stack.endpoints["instances"]:
        urls += ["--metrics-url", inst["vllm"] + "/metrics", "--metrics-url", inst["kvtier_metrics"]]
    cmd = [sys.executable, "-m", "replay.cli", "replay", "--base-url", stack.vllm, "--model", "tiny"]
    cmd += ["--endpoint", "completions", "--source", "synthetic", "--rounds", str(a.rounds)]
    cmd += ["--concurrency", str(a.sessions), "--input-len", str(a.input_len), "--output-len", str(a.output_len)]
    cmd += ["--seed", str(seed), "--output", str(out), "--quiet", *urls]
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=ROOT)
    wall = time.monotonic() - t0
    if not out.exists():
        raise RuntimeError(f"kvtier replay failed ({r.returncode}): {r.stderr.strip()[-500:]}")
    s = json.loads(out.read_text())
    sm = s.get("server_metrics") or {}
    src = sm.get("prompt_tokens_by_source") or {}
    by_tier = sm.get("kv_bytes_by_tier") or {}
    reads = {t: v.get("read", 0) for t, v in by_tier.items()}
    total_read = sum(reads.values())
    return {
        "exit_code": r.returncode,
        "completed": s.get("completed"),
        "failed": s.get("failed"),
        "hit_rate": sm.get("hit_rate"),
        "shared_read_share": (reads.get("shared", 0) / total_read) if total_read else None,
        "kv_read_bytes_by_tier": reads,
        "ttft_p50_ms": (s.get("ttft_ms") or {}).get("p50"),
        "ttft_p95_ms": (s.get("ttft_ms") or {}).get("p95"),
        "recomputed_tokens": src.get("local_compute"),
        "prompt_tokens": s.get("total_input_tokens"),
        "wall_s": round(wall, 1),
        "loadavg": os.getloadavg()[0],
    }


def run(a, model: str, log, rows: list[dict]) -> None:
    """Appends one row per point to `rows` as it goes, so a failure later leaves the points measured so far."""
    from deploy.stack import down, up
    from deploy.throttle import Mount

    seed = 100
    # the tiny model's limit (run-stack.sh's own 2048 cut the 4th round of 512-token turns: HTTP 400)
    common = ["--instances", str(a.instances), "--l1-gb", "0.2", "--vllm-arg", "--max-model-len", "--vllm-arg", "4096"]
    for chunk in a.chunk_sizes:
        work = Path(a.dir) / f"chunk{chunk}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        # private baseline
        state = work / "state-private"
        t0 = time.monotonic()
        try:  # down() in finally also when interrupted during up (servers already started)
            stack = up(state, model, work / "kv-private", *common, "--chunk-size", str(chunk), "--disk-gb", "2",
                       timeout_s=900)  # fmt: skip
            log(f"{PROG}: chunk {chunk}: private stack up in {time.monotonic() - t0:.0f} s")
            seed += 1
            row = {"config": "private", "chunk": chunk, "shared_lat_ms": None}
            row.update(replay_point(a, stack, work / "private.json", seed))
            rows.append(row)
            log(f"  {row}")
        finally:
            down(state)
        # shared tier on throttlefs
        backing, mnt, state = work / "shared-backing", work / "shared-mnt", work / "state-shared"
        backing.mkdir()
        mnt.mkdir()
        with Mount(str(mnt), str(backing), ["--bw", "0", "--lat-ms", "0"]) as m:
            t0 = time.monotonic()
            try:
                stack = up(state, model, work / "kv-shared", *common, "--chunk-size", str(chunk), "--disk-gb", "0",
                           "--shared-dir", str(mnt), "--shared-gb", "2", timeout_s=900)  # fmt: skip
                log(f"{PROG}: chunk {chunk}: shared stack up in {time.monotonic() - t0:.0f} s")
                for lat in a.shared_lat_ms:
                    m.client.set(lat_ms=lat)
                    seed += 1
                    row = {"config": "shared", "chunk": chunk, "shared_lat_ms": lat}
                    row.update(replay_point(a, stack, work / f"shared-{lat:g}.json", seed))
                    rows.append(row)
                    log(f"  {row}")
            finally:
                down(state)


def report(rows: list[dict]) -> None:
    print(
        f"{'config':<8} {'chunk':>5} {'+lat ms':>7} {'hit rate':>8} {'shared':>7} {'TTFT p50':>9} {'TTFT p95':>9} "
        f"{'recomputed':>10} {'vs private p50':>14} {'ok/failed':>9}"
    )
    base = {r["chunk"]: r for r in rows if r["config"] == "private"}

    def f(v, w, fmt):
        return f"{'-':>{w}}" if v is None else f"{v:>{w}{fmt}}"

    for r in rows:
        b = base.get(r["chunk"])
        rel = r["ttft_p50_ms"] / b["ttft_p50_ms"] if b and r["ttft_p50_ms"] and b["ttft_p50_ms"] else None
        print(
            f"{r['config']:<8} {r['chunk']:>5} {f(r['shared_lat_ms'], 7, 'g')} {f(r['hit_rate'], 8, '.3f')} "
            f"{f(r['shared_read_share'], 7, '.2f')} {f(r['ttft_p50_ms'], 9, '.1f')} {f(r['ttft_p95_ms'], 9, '.1f')} "
            f"{f(r['recomputed_tokens'], 10, '.0f')} {f(rel, 14, '.2f')} {r['completed']}/{r['failed']:<5}"
        )


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for i, chunk in enumerate(sorted({r["chunk"] for r in rows})):
        c = f"C{i}"
        sh = sorted(
            (r for r in rows if r["chunk"] == chunk and r["config"] == "shared"), key=lambda r: r["shared_lat_ms"]
        )
        xs = [r["shared_lat_ms"] for r in sh if r["ttft_p50_ms"]]
        ax.plot(xs, [r["ttft_p50_ms"] for r in sh if r["ttft_p50_ms"]], "o-", color=c, label=f"shared, chunk {chunk}")
        ax.plot(xs, [r["ttft_p95_ms"] for r in sh if r["ttft_p50_ms"]], "o:", color=c, alpha=0.6, label="  p95")
        for r in rows:
            if r["chunk"] == chunk and r["config"] == "private" and r["ttft_p50_ms"]:
                ax.axhline(r["ttft_p50_ms"], color=c, ls="--", lw=1, label=f"private, chunk {chunk} (p50)")
    ax.set_xlabel("latency added per operation on the shared tier (ms)")
    ax.set_ylabel("TTFT (ms)")
    ax.set_title("round-robin over instances: shared tier vs private disk tiers", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.text(0.995, 0.005, "benchmarks/shared_vs_private.py", ha="right", va="bottom", fontsize=7, color="0.45")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--instances", type=int, default=2)
    ap.add_argument("--chunk-sizes", default="256,128", help="LMCache chunk sizes, multiples of 128")
    ap.add_argument("--shared-lat-ms", default="0,1,2,5")
    ap.add_argument("--sessions", type=int, default=5, help="concurrent sessions; not a multiple of --instances")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--dir", default="/var/tmp/shared-vs-private", help="work dir (model, tiers, state; wiped)")
    ap.add_argument("--json")
    ap.add_argument("--plot")
    a = ap.parse_args()
    try:
        a.chunk_sizes = [int(x) for x in a.chunk_sizes.split(",")]
        a.shared_lat_ms = [float(x) for x in a.shared_lat_ms.split(",")]
    except ValueError:
        print(f"{PROG}: --chunk-sizes and --shared-lat-ms are comma-separated numbers", file=sys.stderr)
        return 2
    if a.instances < 2:
        print(f"{PROG}: --instances 2 or more (a session's turns must be able to land elsewhere)", file=sys.stderr)
        return 2
    if any(c <= 0 or c % 128 for c in a.chunk_sizes):
        # vLLM on CPU refuses to start otherwise (its block size here is 128), after a minute of start-up
        print(f"{PROG}: --chunk-sizes must be multiples of 128 (vLLM's CPU block size)", file=sys.stderr)
        return 2
    if a.sessions % a.instances == 0:
        # rounds go out in lockstep and the proxy rotates per request: with S a multiple of N, session i's every
        # turn lands on instance i mod N (pinned), which is the opposite of what is measured here
        print(f"{PROG}: --sessions {a.sessions} is a multiple of --instances {a.instances}: every session would "
              "stay on one instance; give e.g. an odd number", file=sys.stderr)  # fmt: skip
        return 2
    if os.geteuid() != 0:
        print(f"{PROG}: needs root (FUSE)", file=sys.stderr)
        return 2
    model = _make_tiny_model(Path(a.dir) / "model")
    t0, load0 = time.monotonic(), os.getloadavg()
    rows: list[dict] = []
    code = 0
    try:
        run(a, model, lambda s: print(s, file=sys.stderr, flush=True), rows)
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:  # a stack that did not start, a mount
        print(
            f"{PROG}: stopped early, {len(rows)} points measured: {str(exc).strip().splitlines()[0]}", file=sys.stderr
        )
        code = 1
    wall = time.monotonic() - t0
    report(rows)
    print(f"wall {wall:.0f} s; load average {load0[0]:.1f} -> {os.getloadavg()[0]:.1f} (2 vCPUs)")
    if a.json:
        doc = {"rows": rows, "args": {k: v for k, v in vars(a).items() if k not in ("json", "plot")},
               "wall_s": round(wall, 1), "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}  # fmt: skip
        write_run_json(a.json, doc)
    if a.plot:
        plot(rows, a.plot)
    return code


if __name__ == "__main__":
    sys.exit(main())
