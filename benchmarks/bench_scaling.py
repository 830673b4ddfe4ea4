#!/usr/bin/env python3
"""Two questions about the synthetic driver itself, answered on this machine:

1. Does `--num-clients` use the cores beyond the GIL? `kvtier bench` in one process vs `--num-clients 2`, same total
   users, in a CPU-bound setting (small entries in a CPU tier, no think time, no generation time): aggregate tier
   bandwidth of both and the ratio (expect > 1.3x on 2 cores).
2. Does one process drive 1,000 users in realistic mode without the driver becoming the bottleneck? `kvtier bench
   --num-users 1000 --generation-mode realistic` on tiny-1b: CPU seconds per request, the process's CPU use (one
   core = 100%) and the I/O workers' busy share (near 100% = storage-bound, not driver-bound).

  python benchmarks/bench_scaling.py                 # both, about 3 minutes
  python benchmarks/bench_scaling.py --only clients --duration 20
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import yaml

from kvconnector.units import GB
from replay.common.leftovers import disk_temp_dir

ROOT = os.path.join(os.path.dirname(__file__), "..")

CPU_BOUND = {
    "model": "small",
    "model_configs": {"small": {"num_layers": 4, "kv_heads": 2, "head_dim": 64}},
    "user_templates": {"t": {"context_tokens": [8, 32], "generate_tokens": [32, 96], "think_time_s": [0, 0]}},
    "gpu_mem_gb": 0,
    "cpu_mem_gb": 2,
    "storage_capacity_gb": 1,
    "performance_profile": "throughput",
    "random_buffer_mb": 64,
    "progress": False,
    # kvtier's own request model and GB sizes: the recorded figures were made with them (the bench defaults are now
    # the MLPerf reference's, whose model starts one I/O thread per user)
    "request_model": "kvtier",
    "size_unit": "GB",
}


class BenchFailed(RuntimeError):
    """A child `kvtier bench` exited non-zero or did not complete: its numbers would be from a partial run."""


def run_bench(cfg: dict, workdir: str, name: str) -> tuple[dict, dict]:
    path = os.path.join(workdir, f"{name}.yaml")
    cfg = dict(cfg, output=os.path.join(workdir, f"{name}.json"), cache_dir=os.path.join(workdir, "cache"))
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    # stderr into a file, not a pipe: a chatty child cannot fill a pipe nobody reads while we wait for it
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "replay.cli", "bench", "--config", path],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=err,
            text=True,
        )
        _, status, rusage = os.wait4(proc.pid, 0)  # wait4 for the child's CPU time
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, so tell Popen
        err.seek(0)
        stderr = err.read().strip()
    if proc.returncode != 0:
        last = stderr.splitlines()[-1] if stderr else "no message"
        raise BenchFailed(f"kvtier bench ({name}) exited {proc.returncode}: {last}")
    with open(cfg["output"]) as f:
        doc = json.load(f)
    if doc.get("status") != "completed":
        raise BenchFailed(f"kvtier bench ({name}) ended {doc.get('status')}: {doc.get('error') or 'no error given'}")
    return doc, {"cpu_s": rusage.ru_utime + rusage.ru_stime}


def tier_gbps(doc: dict) -> float:
    moved = sum(t["read"]["bytes"] + t["write"]["bytes"] for t in doc["tiers"].values())
    return moved / GB / doc["summary"]["elapsed_time"]


def clients(duration: float, users: int) -> None:
    with tempfile.TemporaryDirectory(dir=disk_temp_dir()) as wd:
        one, r1 = run_bench(dict(CPU_BOUND, duration=duration, num_users=users, seed=1), wd, "one")
        two, r2 = run_bench(dict(CPU_BOUND, duration=duration, num_users=users, seed=1, num_clients=2), wd, "two")
    b1, b2 = tier_gbps(one), tier_gbps(two)
    q1, q2 = one["summary"]["requests_per_second"], two["summary"]["requests_per_second"]
    print(f"\n1) --num-clients scaling, {users} users, {duration:g} s, CPU-bound (entries in a 2 GB CPU tier)")
    print(f"{'':<14}{'tier GB/s':>10}{'requests/s':>12}{'CPU s':>8}")
    print(f"{'1 process':<14}{b1:>10.2f}{q1:>12.0f}{r1['cpu_s']:>8.1f}")
    print(f"{'2 clients':<14}{b2:>10.2f}{q2:>12.0f}{r2['cpu_s']:>8.1f}")
    print(f"ratio 2 clients / 1 process: bandwidth {b2 / b1:.2f}x, requests {q2 / q1:.2f}x  (target > 1.3x)")


def many_users(duration: float, users: int) -> None:
    cfg = {
        "model": "tiny-1b",
        "num_users": users,
        "generation_mode": "realistic",
        "duration": duration,
        "gpu_mem_gb": 0,
        "progress": False,
        "seed": 1,
        "request_model": "kvtier",
        "size_unit": "GB",
    }
    with tempfile.TemporaryDirectory(dir=disk_temp_dir()) as wd:
        doc, r = run_bench(cfg, wd, "many")
    s = doc["summary"]
    el = s["elapsed_time"]
    print(f"\n2) {users} users, tiny-1b, --generation-mode realistic, {duration:g} s, one process")
    print(
        f"requests completed {s['total_requests']:,} ({s['requests_per_second']:.1f}/s), tier bandwidth "
        f"{tier_gbps(doc):.2f} GB/s, disk read {s['cache_stats']['tier_storage_read_bandwidth_gbps']:.2f} GB/s, "
        f"write {s['cache_stats']['tier_storage_write_bandwidth_gbps']:.2f} GB/s"
    )
    per_req = r["cpu_s"] / max(1, s["total_requests"]) * 1000
    per_gb = r["cpu_s"] / max(1e-9, tier_gbps(doc) * el)
    print(
        f"process CPU {r['cpu_s']:.1f} s over {el:.1f} s = {r['cpu_s'] / el:.0%} of one core; "
        f"{per_req:.1f} CPU-ms per request ({per_gb:.2f} CPU-s per GB moved); "
        f"I/O workers busy {s['io_saturation']:.0%} of the time"
    )
    print("driver-bound would show: CPU near 100% of one core with I/O workers idle; storage-bound: the reverse")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=["clients", "users"])
    ap.add_argument("--duration", type=float, default=30)
    ap.add_argument("--clients-users", type=int, default=32)
    ap.add_argument("--many-users", type=int, default=1000)
    a = ap.parse_args()
    try:
        if a.only in (None, "clients"):
            clients(a.duration, a.clients_users)
        if a.only in (None, "users"):
            many_users(a.duration * 2, a.many_users)
    except BenchFailed as exc:
        print(f"bench_scaling: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
