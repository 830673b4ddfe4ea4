#!/usr/bin/env python3
"""kvtier's disk tier vs fio, same directory, same object size, same concurrency, in one run.

fio: `direct=1`, `bs` = object size, `numjobs` = workers, psync (one object per call per job, like a worker),
`fdatasync=1` (each object made durable, as the disk tier does). kvtier: DiskTier write_entry/read_entry of whole
objects from `workers` threads (temp file + rename + fdatasync per object; reads verify the xxh3 checksum).
Reports bandwidth of both and the ratio, kvtier's host share of storage time, and CPU seconds per GiB moved.
Rounds alternate fio and kvtier so drift on a shared disk hits both. fio overwrites the files it wrote in the first
round; kvtier writes new files every round, unless --reuse-files: then, like a full disk tier, it overwrites the
previous round's files in place (its spare files), and both sides write new files in round 1 only.

  python benchmarks/disk_vs_fio.py --dir /var/tmp/kvtier-bench --object-mib 16 --workers 8 --total-gib 4
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from kvconnector.tiers import DiskTier
from replay.synthetic.payload import RandomPayload

GIB = 1 << 30


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run_fio(directory: str, rw: str, obj: int, workers: int, per_job: int) -> dict:
    cmd = [
        "fio",
        "--name=ref",
        f"--directory={directory}",
        f"--rw={rw}",
        f"--bs={obj}",
        f"--size={per_job}",
        f"--numjobs={workers}",
        "--ioengine=psync",
        "--direct=1",
        "--group_reporting",
        "--output-format=json",
        "--filename_format=fio.$jobnum",
    ]
    if rw == "write":
        cmd.append("--fdatasync=1")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    job = json.loads(out[out.index("{") :])["jobs"][0]
    side = job["read" if rw == "read" else "write"]
    cpu = (job["usr_cpu"] + job["sys_cpu"]) / 100 * job["elapsed"] if "elapsed" in job else float("nan")
    return {"gbps": side["bw_bytes"] / 1e9, "bytes": side["io_bytes"], "cpu_s": cpu}


def run_kvtier(tier: DiskTier, op: str, keys: list[str], obj: int, workers: int, payload: RandomPayload) -> dict:
    host = [0] * workers
    total = [0] * workers
    lock = threading.Lock()
    queue = list(keys)

    def worker(i: int) -> None:
        rng = random.Random(i)
        while True:
            with lock:
                if not queue:
                    return
                key = queue.pop()
            if op == "write":
                t = tier.write(key, payload.chunks(obj, rng), obj)
            else:
                t = tier.read(key, obj)
            host[i] += t.host_ns
            total[i] += t.total_ns

    c0, t0 = cpu_s(), time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(worker, range(workers)))
    wall, cpu = time.perf_counter() - t0, cpu_s() - c0
    moved = obj * len(keys)
    return {
        "gbps": moved / wall / 1e9,
        "bytes": moved,
        "cpu_s_per_gib": cpu / (moved / GIB),
        "host_share": sum(host) / max(sum(total), 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=None, help="directory on the device to test (default a temp dir in /var/tmp)")
    ap.add_argument("--object-mib", type=int, default=16)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--total-gib", type=float, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--io-mode", default="direct", choices=["direct", "buffered"])
    ap.add_argument("--reuse-files", action="store_true", help="kvtier overwrites the last round's files, as fio does")
    ap.add_argument("--json", help="also write the figures here")
    a = ap.parse_args()
    if not shutil.which("fio"):
        print("disk_vs_fio: fio is not installed (apt-get install fio)", file=sys.stderr)
        return 2
    base = a.dir or tempfile.mkdtemp(prefix="kvtier-diskbench-", dir="/var/tmp")
    os.makedirs(base, exist_ok=True)
    obj = a.object_mib << 20
    count = max(a.workers, int(a.total_gib * GIB) // obj)
    per_job = count * obj // a.workers
    fio_dir, kv_dir = os.path.join(base, "fio"), os.path.join(base, "kvtier")
    os.makedirs(fio_dir, exist_ok=True)
    # Without --reuse-files every round writes new files (the harder case). With it, the deleted files are kept as
    # spares, all of them (no store accounts capacity here), and the next round overwrites them in place.
    tier = DiskTier(kv_dir, 0, a.io_mode, spare_ratio=1.0 if a.reuse_files else 0.0)
    payload = RandomPayload(256, 1)
    keys = [f"obj-{i}" for i in range(count)]
    res: dict[str, list] = {k: [] for k in ("fio_write", "fio_read", "kv_write", "kv_read")}
    try:
        for r in range(a.rounds):
            res["fio_write"].append(run_fio(fio_dir, "write", obj, a.workers, per_job))
            for key in keys:  # untimed: new files each round, or spares to overwrite (--reuse-files)
                tier.delete(key)
            res["kv_write"].append(run_kvtier(tier, "write", keys, obj, a.workers, payload))
            res["fio_read"].append(run_fio(fio_dir, "read", obj, a.workers, per_job))
            res["kv_read"].append(run_kvtier(tier, "read", keys, obj, a.workers, payload))
            print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)
    finally:
        if not a.dir:
            shutil.rmtree(base, ignore_errors=True)
        else:
            shutil.rmtree(fio_dir, ignore_errors=True)
            shutil.rmtree(kv_dir, ignore_errors=True)

    def med(rows, k):
        return statistics.median(x[k] for x in rows)

    print(
        f"\n{a.object_mib} MiB objects, {a.workers} workers, {count * obj / GIB:.1f} GiB per op, {a.rounds} rounds "
        f"(medians), io-mode {tier.io_mode.value}, "
        f"kvtier {'reuses files' if a.reuse_files else 'writes new files'}, dir {base}"
    )
    print(f"{'op':<6}{'fio GB/s':>10}{'kvtier GB/s':>13}{'ratio':>8}{'host %':>8}{'CPU s/GiB':>11}")
    figures = {}
    for op in ("write", "read"):
        f, k = med(res[f"fio_{op}"], "gbps"), med(res[f"kv_{op}"], "gbps")
        host, cpu = med(res[f"kv_{op}"], "host_share"), med(res[f"kv_{op}"], "cpu_s_per_gib")
        figures[op] = {"fio_gbps": f, "kvtier_gbps": k, "ratio": k / f, "host_share": host, "cpu_s_per_gib": cpu}
        print(f"{op:<6}{f:>10.2f}{k:>13.2f}{k / f:>8.2f}{host * 100:>7.1f}%{cpu:>11.3f}")
    print("targets: ratio >= 0.9, host <= 10% (direct mode), CPU <= 0.5 s/GiB")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"args": vars(a), "figures": figures, "rounds": res}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
