#!/usr/bin/env python3
"""nodes.py	two nodes (network namespaces, each its own vLLM + LMCache + kvtier) behind the round-robin proxy: private
disk tiers vs one shared tier (GlusterFS, Redis Cluster, a Ceph bucket, CephFS, a Mooncake Store), one multi-turn
session trace replayed across both.

usage: python -m benchmarks.nodes [--nodes 2] [--gluster-bw off,8mbit] [--sessions 5] [--rounds 4] [--input-len 512]
                                  [--output-len 16] [--kinds private,glusterfs,redis-cluster,s3,cephfs,mooncake]
                                  [--dir DIR] [--json OUT]
(from the repository root: it reuses benchmarks/shared_vs_private.py's replay point)

The multi-node version of benchmarks/shared_vs_private.py (one host, one shared directory): here each node has its
own address and network stack (deploy/run-stack.sh up --nodes N), the shared tier is a real networked one and every
node reaches it through its own client:
- private:       --nodes N, each node its own kvtier disk tier;
- glusterfs:     --nodes N --shared glusterfs --disk-gb 0 (one FUSE client per node; every store lands in the volume),
                 once per --gluster-bw (tc tbf on the storage link, changed live with deploy/glusterfs.sh bw);
- redis-cluster: --nodes N --shared redis-cluster --disk-gb 0 (three masters on the nodes' bridge);
- s3, cephfs:    --nodes N --shared s3|cephfs --disk-gb 0 (a Ceph cluster on the nodes' bridge: its bucket through
                 radosgw, or CephFS through one ceph-fuse client per node);
- mooncake:      --nodes N --shared mooncake --disk-gb 0 (a Mooncake Store, its memory lent by the nodes).
Each point replays fresh sessions (its own seed) through the proxy: `kvtier replay --source synthetic --rounds R
--concurrency S`, so a session's consecutive turns land on different nodes (S not a multiple of N: rounds go out in
lockstep and the proxy rotates per request). LMCache's L1 is small (--l1-gb 0.2) and cleared on every node before
each point. Reported per point, from the nodes' Prometheus counters over the run: prefix hit rate per node (each
node's vLLM) and overall (replay's, over both), TTFT p50/p90, and the bytes through the shared tier (kvtier's writes
and reads of it, summed over the nodes). Needs root (namespaces, FUSE). One stack at a time.

example: sudo .venv/bin/python -m benchmarks.nodes --json nodes.json
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

from benchmarks.shared_vs_private import replay_point
from deploy import SCRIPTS, make_tiny_model
from replay.openai.server_metrics import Snapshot, derive
from replay.outputs.provenance import write_run_json

PROG = "nodes"
# kvtier's name of each kind's tier
TIER = {"private": "disk", "glusterfs": "shared", "redis-cluster": "redis", "s3": "s3", "cephfs": "shared",
        "mooncake": "mooncake"}  # fmt: skip


def snapshots(stack) -> list[Snapshot]:
    """One snapshot per node: its vLLM's and its kvtier's counters."""
    from deploy.stack import metrics

    out = []
    for inst in stack.endpoints["instances"]:
        values = metrics(inst["vllm"] + "/metrics")
        values.update(metrics(inst["kvtier_metrics"]))
        out.append(Snapshot(time.perf_counter_ns(), values))
    return out


def point(a, stack, kind: str, bw: str | None, out: Path, seed: int) -> dict:
    before = snapshots(stack)
    row = {"config": kind, "gluster_bw": bw}
    row.update(replay_point(a, stack, out, seed))  # clears every node's L1 first
    row.pop("shared_read_share")  # a shared directory's share only; the tier's own bytes are counted below
    after = snapshots(stack)
    ttft = json.loads(out.read_text()).get("ttft_ms") or {}
    row["ttft_p90_ms"] = ttft.get("p90")
    tier = TIER[kind]
    row["tier_write_bytes"] = row["tier_read_bytes"] = 0.0
    for i, (b, e) in enumerate(zip(before, after)):
        d = derive(b, e)
        row[f"node{i}_hit_rate"] = d["hit_rate"]
        by_op = (d["kv_bytes_by_tier"] or {}).get(tier, {})
        row["tier_write_bytes"] += by_op.get("write", 0.0)
        row["tier_read_bytes"] += by_op.get("read", 0.0)
    return row


def run(a, model: str, log, rows: list[dict]) -> None:
    """Appends one row per point to `rows` as it goes, so a failure later leaves the points measured so far."""
    from deploy.stack import down, up

    seed = 200
    # the tiny model's limit (run-stack.sh's own 2048 cut the 4th round of 512-token turns: HTTP 400)
    common = ["--nodes", str(a.nodes), "--l1-gb", "0.2", "--vllm-arg", "--max-model-len", "--vllm-arg", "4096"]
    for kind in a.kinds:
        work = Path(a.dir) / kind
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        state = work / "state"
        tiers = ["--disk-gb", "2"] if kind == "private" else ["--shared", kind, "--disk-gb", "0", "--shared-gb", "2"]
        t0 = time.monotonic()
        try:  # down() in finally also when interrupted during up (servers, namespaces, the volume already made)
            stack = up(state, model, work / "kv", *common, *tiers, timeout_s=900)
            log(f"{PROG}: {kind}: {a.nodes} nodes up in {time.monotonic() - t0:.0f} s")
            for bw in a.gluster_bw if kind == "glusterfs" else [None]:
                if bw is not None:
                    gluster = stack.endpoints["shared"]["state_dir"]
                    subprocess.run(["bash", str(SCRIPTS / "glusterfs.sh"), "bw", "--state-dir", gluster, "--bw", bw],
                                   check=True, capture_output=True, timeout=60)  # fmt: skip
                seed += 1
                row = point(a, stack, kind, bw, work / f"{kind}-{bw or 'none'}.json", seed)
                rows.append(row)
                log(f"  {row}")
        finally:
            down(state)


def report(rows: list[dict], nodes: int) -> None:
    def f(v, w, fmt):
        return f"{'-':>{w}}" if v is None else f"{v:>{w}{fmt}}"

    per_node = " ".join(f"{'node' + str(i):>6}" for i in range(nodes))
    head = f"{'overall':>7} {'TTFT p50':>9} {'TTFT p90':>9} {'tier MB w/r':>13} ok/failed"
    print(f"{'config':<14} {'bw':>7} {per_node} {head}")
    for r in rows:
        hits = " ".join(f(r.get(f"node{i}_hit_rate"), 6, ".3f") for i in range(nodes))
        mb = f"{r['tier_write_bytes'] / 1e6:.1f}/{r['tier_read_bytes'] / 1e6:.1f}"
        print(
            f"{r['config']:<14} {r['gluster_bw'] or '-':>7} {hits} {f(r['hit_rate'], 7, '.3f')} "
            f"{f(r['ttft_p50_ms'], 9, '.1f')} {f(r['ttft_p90_ms'], 9, '.1f')} {mb:>13} {r['completed']}/{r['failed']}"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--kinds", default=",".join(TIER), help="which tiers, in this order")
    ap.add_argument("--gluster-bw", default="off,8mbit", help="GlusterFS storage link rates (tc's units; off = none)")
    ap.add_argument("--sessions", type=int, default=5, help="concurrent sessions; not a multiple of --nodes")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--dir", default="/var/tmp/kvtier-nodes", help="work dir (model, tiers, state; wiped)")
    ap.add_argument("--json")
    a = ap.parse_args()
    a.kinds = [k for k in a.kinds.split(",") if k]
    a.gluster_bw = [b for b in a.gluster_bw.split(",") if b]
    if not a.kinds or set(a.kinds) - set(TIER):
        print(f"{PROG}: --kinds is a comma list of {', '.join(TIER)}", file=sys.stderr)
        return 2
    if a.nodes < 2:
        print(f"{PROG}: --nodes 2 or more (a session's turns must be able to land elsewhere)", file=sys.stderr)
        return 2
    if a.sessions % a.nodes == 0:
        print(f"{PROG}: --sessions {a.sessions} is a multiple of --nodes {a.nodes}: every session would stay on one "
              "node; give e.g. an odd number", file=sys.stderr)  # fmt: skip
        return 2
    if os.geteuid() != 0:
        print(f"{PROG}: needs root (network namespaces, FUSE)", file=sys.stderr)
        return 2
    make_tiny_model.ensure(str(Path(a.dir) / "model"))
    t0, load0 = time.monotonic(), os.getloadavg()
    rows: list[dict] = []
    code = 0
    try:
        run(a, str(Path(a.dir) / "model"), lambda s: print(s, file=sys.stderr, flush=True), rows)
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:  # a stack that did not start, a tc refusal
        print(
            f"{PROG}: stopped early, {len(rows)} points measured: {str(exc).strip().splitlines()[0]}", file=sys.stderr
        )
        code = 1
    wall = time.monotonic() - t0
    report(rows, a.nodes)
    print(f"wall {wall:.0f} s; load average {load0[0]:.1f} -> {os.getloadavg()[0]:.1f} (2 vCPUs)")
    if a.json:
        doc = {"rows": rows, "args": {k: v for k, v in vars(a).items() if k != "json"},
               "wall_s": round(wall, 1), "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}  # fmt: skip
        write_run_json(a.json, doc)
    return code


if __name__ == "__main__":
    sys.exit(main())
