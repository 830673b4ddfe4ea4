#!/usr/bin/env python3
"""kvtier's disk tier vs fio, same directory, same object size, same concurrency, same durability, in one run.

fio: `direct=1`, `bs` = object size, `numjobs` = workers, psync (one object per call per job, like a worker), one file
per object (`nrfiles`, `filesize` = object size, `create_on_open`: each file is created when its job gets to it, inside
the timed run), `fdatasync=1` (each object made durable before the next, as the disk tier does) and `end_fsync=1`
(fdatasync=1 skips the job's last object; this syncs it). kvtier: DiskTier write_entry/read_entry of whole objects
from `workers` threads (temp file or spare + fdatasync + rename per object; reads verify the xxh3 checksum).

Each round measures, on both sides:
  fill       new files into an empty directory: fio creates one file per object (open O_CREAT, write, fdatasync),
             kvtier a new, empty tier (open O_CREAT, fallocate, write, fdatasync, rename)
  overwrite  fio rewrites its object files in place; kvtier rewrites every entry into the previous entries' files
             (its spare files, as a full tier does)
  read       fio reads its object files; kvtier reads and verifies every entry
What a step removed is synced before the next timed step (untimed), so on a discard mount the freed blocks are
discarded then, not inside the next timed fdatasync. Within a round the two sides alternate (fio first in odd rounds,
kvtier first in even ones), and the table gives the median of the per-round ratios with their range, so a disk whose
speed drifts weighs on both sides alike and the range shows how noisy the run was.

Why fio's fill is one new file per object and not fio's usual layout (one file per job, `--job-files` adds it): for a
write job fio lays its files out (creates and fallocates them) before its clock starts, so its usual "first write"
times neither file creation nor block allocation, which is exactly what a fill of new entries costs. With one file per
object created inside the run, both sides do the same work per object (a new inode, newly allocated blocks, the data,
an fdatasync that commits the allocation) and fio does no less durability work than kvtier (it fsyncs every file again
at the end). The row "fio fill / fio overwrite" is fio's own cost of new blocks on this disk: kvtier's fill cannot
beat fio's overwrite by more than fio's own fill does.

examples:
  python benchmarks/disk_vs_fio.py --dir /var/tmp/kvtier-bench --object-mib 16 --workers 8 --total-gib 2 --rounds 5
  python benchmarks/disk_vs_fio.py --dir /var/tmp/kvtier-bench --total-gib 1 --rounds 5 --job-files --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from deploy.host import cpu_s
from kvconnector.tiers import DiskTier
from replay.outputs.provenance import write_run_json
from replay.synthetic.payload import RandomPayload

GIB = 1 << 30


def run_fio(directory: str, rw: str, obj: int, workers: int, per_job: int, job_files: bool = False) -> dict:
    """One fio run: one file per object (see the module docstring), or with `job_files` fio's usual one file per job."""
    cmd = [
        "fio",
        "--name=ref",
        f"--directory={directory}",
        f"--rw={rw}",
        f"--bs={obj}",
        f"--numjobs={workers}",
        "--ioengine=psync",
        "--direct=1",
        "--group_reporting",
        "--output-format=json",
    ]
    if job_files:
        cmd += [f"--size={per_job}", "--filename_format=fio.$jobnum"]
    else:
        cmd += [
            f"--filesize={obj}",
            f"--nrfiles={per_job // obj}",
            "--create_on_open=1",  # each file created when its turn comes, inside the timed run
            "--file_service_type=sequential",  # one object file after the other, each written once
            "--openfiles=1",
            "--filename_format=fio.$jobnum.$filenum",
        ]
    if rw == "write":
        cmd += ["--fdatasync=1", "--end_fsync=1"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    job = json.loads(out[out.index("{") :])["jobs"][0]
    side = job["read" if rw == "read" else "write"]
    # CPU as its jobs report it: usr + sys share of their summed runtime (ms), so fio's own start-up is not in it
    cpu = (job["usr_cpu"] + job["sys_cpu"]) / 100 * job["job_runtime"] / 1000
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


# (label, kvtier op, fio op): each row of the table is a ratio kvtier / fio from the same round. The first two are
# kvtier's own targets; "fill vs fio overwrite" holds kvtier's fill to blocks fio has already written.
ROWS = (
    ("fill vs fio fill", "kv_fill", "fio_fill"),
    ("overwrite vs fio overwrite", "kv_overwrite", "fio_overwrite"),
    ("fill vs fio overwrite", "kv_fill", "fio_overwrite"),
    ("read vs fio read", "kv_read", "fio_read"),
)
JOB_FILE_ROWS = (
    ("fill vs fio fill, job files", "kv_fill", "fio_fill_jobs"),
    ("overwrite vs fio ow, job files", "kv_overwrite", "fio_overwrite_jobs"),
)
# fio against itself: what new blocks cost this disk, whoever writes them.
FIO_ROWS = (("fio fill / fio overwrite", "fio_fill", "fio_overwrite"),)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=None, help="directory on the device to test (default a temp dir in /var/tmp)")
    ap.add_argument("--object-mib", type=int, default=16)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--total-gib", type=float, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--io-mode", default="direct", choices=["direct", "buffered"])
    ap.add_argument("--job-files", action="store_true", help="also measure fio's usual layout (one file per job)")
    ap.add_argument("--json", help="also write the figures here")
    a = ap.parse_args()
    if not shutil.which("fio"):
        print("disk_vs_fio: fio is not installed (apt-get install fio)", file=sys.stderr)
        return 2
    if a.object_mib < 1 or a.workers < 1 or a.total_gib <= 0 or a.rounds < 1:
        ap.error("sizes, workers and rounds must be positive")
    base = a.dir or tempfile.mkdtemp(prefix="kvtier-diskbench-", dir="/var/tmp")
    os.makedirs(base, exist_ok=True)
    obj = a.object_mib << 20
    # A multiple of the workers, so fio's jobs (an equal share each) write exactly kvtier's objects.
    count = max(1, int(a.total_gib * GIB) // obj // a.workers) * a.workers
    per_job = count * obj // a.workers
    fio_dir, jobs_dir, kv_dir = (os.path.join(base, n) for n in ("fio", "fio-jobs", "kvtier"))
    payload = RandomPayload(256, 1)
    keys = [f"obj-{i}" for i in range(count)]
    res: dict[str, list] = {
        k: []
        for k in ("fio_fill", "fio_overwrite", "fio_read", "fio_fill_jobs", "fio_overwrite_jobs")
        + ("kv_fill", "kv_overwrite", "kv_read")
    }
    tier = None

    def fresh(directory: str) -> None:
        shutil.rmtree(directory, ignore_errors=True)
        os.makedirs(directory)
        os.sync()  # untimed: the removed files' blocks are freed (and discarded) now

    def fio_fill():
        fresh(fio_dir)
        res["fio_fill"].append(run_fio(fio_dir, "write", obj, a.workers, per_job))

    def kv_fill():
        nonlocal tier
        if tier is not None:
            tier.close()
        fresh(kv_dir)
        # Every deleted entry is kept as a spare (no store accounts capacity here), for the overwrite step.
        tier = DiskTier(kv_dir, 0, a.io_mode, spare_ratio=1.0)
        res["kv_fill"].append(run_kvtier(tier, "write", keys, obj, a.workers, payload))

    def kv_overwrite():
        for key in keys:  # untimed: every entry's file becomes a spare that the next write of its size takes
            tier.delete(key)
        res["kv_overwrite"].append(run_kvtier(tier, "write", keys, obj, a.workers, payload))

    def fio_overwrite():
        res["fio_overwrite"].append(run_fio(fio_dir, "write", obj, a.workers, per_job))

    def fio_jobs():
        fresh(jobs_dir)  # fio lays the job files out (create + fallocate) before its clock starts
        res["fio_fill_jobs"].append(run_fio(jobs_dir, "write", obj, a.workers, per_job, job_files=True))
        res["fio_overwrite_jobs"].append(run_fio(jobs_dir, "write", obj, a.workers, per_job, job_files=True))
        shutil.rmtree(jobs_dir, ignore_errors=True)

    def fio_read():
        res["fio_read"].append(run_fio(fio_dir, "read", obj, a.workers, per_job))

    def kv_read():
        res["kv_read"].append(run_kvtier(tier, "read", keys, obj, a.workers, payload))

    rows = ROWS + (JOB_FILE_ROWS if a.job_files else ())
    load0 = os.getloadavg()[0]
    t0 = time.monotonic()
    try:
        for r in range(a.rounds):
            fio_first = r % 2 == 0
            steps = (
                (fio_fill, kv_fill, fio_overwrite, kv_overwrite, fio_read, kv_read)
                if fio_first
                else (kv_fill, fio_fill, kv_overwrite, fio_overwrite, kv_read, fio_read)
            )
            for step in steps + ((fio_jobs,) if a.job_files else ()):
                step()
            ratios = "  ".join(f"{k[3:]}/{f[4:]} {res[k][-1]['gbps'] / res[f][-1]['gbps']:.2f}" for _, k, f in rows)
            print(
                f"round {r + 1}/{a.rounds} ({time.monotonic() - t0:.0f} s, load {os.getloadavg()[0]:.1f}): "
                f"kvtier/fio {ratios}",
                file=sys.stderr,
            )
    finally:
        io_mode = tier.io_mode.value if tier is not None else a.io_mode
        if tier is not None:
            tier.close()
        if not a.dir:
            shutil.rmtree(base, ignore_errors=True)
        else:
            for d in (fio_dir, jobs_dir, kv_dir):
                shutil.rmtree(d, ignore_errors=True)
    load1 = os.getloadavg()[0]
    done = min(len(res["kv_read"]), len(res["fio_read"]))  # rounds complete on both sides

    def med(rows, k):
        return statistics.median(x[k] for x in rows[:done])

    print(
        f"\n{a.object_mib} MiB objects, {a.workers} workers, {count * obj / GIB:.1f} GiB per step, {done} rounds "
        f"(medians), io-mode {io_mode}, dir {base}, load average {load0:.1f} at the start, {load1:.1f} at the end"
    )
    print(
        f"{'kvtier op vs fio op':<31}{'fio GB/s':>9}{'kvtier GB/s':>12}{'ratio':>7}{'range':>12}"
        f"{'host %':>8}{'CPU s/GiB':>10}"
    )
    figures = {}
    for label, k, f in rows + FIO_ROWS:
        ratios = [x["gbps"] / y["gbps"] for x, y in zip(res[k][:done], res[f][:done], strict=True)]
        mine = k.startswith("kv_")
        row = {
            "fio_gbps": med(res[f], "gbps"),
            "kvtier_gbps": med(res[k], "gbps") if mine else None,
            "ratio": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "host_share": med(res[k], "host_share") if mine else None,
            "cpu_s_per_gib": med(res[k], "cpu_s_per_gib") if mine else None,
        }
        figures[label] = row
        kv = (
            f"{row['kvtier_gbps']:>12.2f}"
            if mine
            else f"{med(res[k], 'gbps'):>12.2f}"  # fio's fill in the kvtier column: fio against itself
        )
        tail = f"{row['host_share'] * 100:>7.1f}%{row['cpu_s_per_gib']:>10.3f}" if mine else ""
        print(
            f"{label:<31}{row['fio_gbps']:>9.2f}{kv}{row['ratio']:>7.2f}"
            f"{row['ratio_min']:>6.2f}-{row['ratio_max']:<5.2f}{tail}"
        )
    print("ratio: median of the per-round ratios kvtier/fio; range: their lowest and highest")
    print("host %: kvtier's time outside the storage system calls, share of its per-entry time (median of rounds)")
    print("CPU s/GiB: kvtier's process CPU time per GiB moved")
    print("targets: fill >= 0.9x fio fill, overwrite >= 0.9x fio overwrite, host <= 10% (direct), CPU <= 0.5 s/GiB")
    if a.json:
        write_run_json(a.json, {"args": vars(a), "load_average": [load0, load1], "figures": figures, "rounds": res})
    return 0


if __name__ == "__main__":
    sys.exit(main())
