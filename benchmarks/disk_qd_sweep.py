#!/usr/bin/env python3
"""kvtier's disk tier vs fio over queue depth and entry size: writes of new files and reads, same run, same settings.

Each cell is one entry size and one number of operations in flight (queue depth). fio: `direct=1`, psync, `numjobs`
= the queue depth (one object per call per job, as each kvtier worker thread does), one file per object created inside
the timed run, `fdatasync=1` + `end_fsync=1` on writes (as disk_vs_fio). kvtier: a fresh DiskTier (O_DIRECT) in
an empty directory, that many worker threads storing whole entries (temp file, fallocate, write, fdatasync, rename,
directory fsync) and then reading and verifying them (xxh3). Per cell and round the two sides run in turn (fio first in
odd rounds); the table gives the median of the per-round ratios kvtier/fio, with their range.

CPU-s/GiB: kvtier's process CPU time (all its threads) per GiB moved; fio's is what its jobs report (usr + sys over
their runtime; fio's start-up is not in it, kvtier's thread pool start is).
host %: kvtier's time outside the storage system calls, share of its per-entry time; where kvtier falls below 0.9x,
it says whether the gap is on the host (Python, checksum, GIL) or in the storage calls (per-entry metadata: create,
allocate, rename, directory fsync, which fio's writes of new files do fewer of).

examples:
  python -m benchmarks.disk_qd_sweep --dir /var/tmp/kvtier-qd --json results/disk_qd_sweep.json
  python -m benchmarks.disk_qd_sweep --quick --dir /tmp/qd
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

from benchmarks.disk_vs_fio import run_fio, run_kvtier
from kvconnector.tiers import DiskTier
from kvconnector.units import parse_size
from replay.outputs.provenance import write_run_json
from replay.synthetic.payload import RandomPayload

GIB = 1 << 30
KIB = 1 << 10


def fio_side(directory: str, rw: str, obj: int, qd: int, count: int) -> dict:
    """One fio run laid out as disk_vs_fio's (one new file per object, created inside the timed run), `count` objects
    over `qd` jobs; its CPU is what its jobs report, so fio's own start-up is not in it."""
    res = run_fio(directory, rw, obj, qd, (count // qd) * obj)
    return {"gbps": res["gbps"], "bytes": res["bytes"], "cpu_s_per_gib": res["cpu_s"] / (res["bytes"] / GIB)}


def cell_count(obj: int, qd: int, cell_bytes: int) -> int:
    """Entries per cell: about `cell_bytes`, at least one per worker, a multiple of the workers (fio's jobs then write
    exactly kvtier's entries)."""
    return max(1, cell_bytes // obj // qd) * qd


def fresh(directory: str) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    os.sync()  # untimed: the removed files' blocks are freed (and discarded) now, not in the next timed step


def measure_cell(obj: int, qd: int, count: int, rounds: int, fio_dir: str, kv_dir: str, payload) -> dict:
    """`count` entries of `obj` bytes written as new files then read, `qd` at a time, by fio and by kvtier in turn,
    `rounds` times; the medians of the per-round ratios and of each side's CPU per GiB."""
    keys = [f"e{i}" for i in range(count)]
    runs: dict[str, list[dict]] = {k: [] for k in ("fio_write", "kv_write", "fio_read", "kv_read")}

    def fio_steps():
        fresh(fio_dir)
        runs["fio_write"].append(fio_side(fio_dir, "write", obj, qd, count))
        runs["fio_read"].append(fio_side(fio_dir, "read", obj, qd, count))

    def kv_steps():
        fresh(kv_dir)
        tier = DiskTier(kv_dir, 0, "direct", spare_ratio=0)
        try:
            runs["kv_write"].append(run_kvtier(tier, "write", keys, obj, qd, payload))
            runs["kv_read"].append(run_kvtier(tier, "read", keys, obj, qd, payload))
        finally:
            tier.close()

    for r in range(rounds):
        for step in (fio_steps, kv_steps) if r % 2 == 0 else (kv_steps, fio_steps):
            step()
    cell = {"entry_bytes": obj, "in_flight": qd, "entries": count}
    for op in ("write", "read"):
        ratios = [k["gbps"] / f["gbps"] for k, f in zip(runs[f"kv_{op}"], runs[f"fio_{op}"], strict=True)]
        cell[op] = {
            "ratio": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "kvtier_cpu_s_per_gib": statistics.median(x["cpu_s_per_gib"] for x in runs[f"kv_{op}"]),
            "fio_cpu_s_per_gib": statistics.median(x["cpu_s_per_gib"] for x in runs[f"fio_{op}"]),
            "kvtier_host_share": statistics.median(x["host_share"] for x in runs[f"kv_{op}"]),
            "kvtier_bytes": [x["bytes"] for x in runs[f"kv_{op}"]],
            "fio_bytes": [x["bytes"] for x in runs[f"fio_{op}"]],
        }
    return cell


def entry_size(text: str) -> int:
    """An entry size as every kvtier size is read (kvconnector.units: 128k is 128,000 B, 128KiB is 131,072 B)."""
    try:
        return int(parse_size(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--sizes: {exc}") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=None, help="directory on the device to test (default a temp dir in /var/tmp)")
    ap.add_argument(
        "--sizes", default="128KiB,2MiB,32MiB", help="entry sizes, comma-separated (default 128KiB,2MiB,32MiB)"
    )
    ap.add_argument("--depths", default="1,4,16,32", help="operations in flight, comma-separated (default 1,4,16,32)")
    ap.add_argument("--cell-mib", type=int, default=256, help="data per cell and step, MiB (default 256)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="a smoke run: 128KiB and 2MiB, depths 1 and 4, 8 MiB, 1 round")
    ap.add_argument("--json", help="also write the figures here")
    a = ap.parse_args(argv)
    if not shutil.which("fio"):
        print("disk_qd_sweep: fio is not installed (apt-get install fio)", file=sys.stderr)
        return 2
    try:
        sizes = [entry_size(s) for s in a.sizes.split(",")]
        depths = [int(d) for d in a.depths.split(",")]
    except (argparse.ArgumentTypeError, ValueError) as exc:
        ap.error(str(exc))
    if a.quick:
        sizes, depths, a.cell_mib, a.rounds = [128 * KIB, 2 << 20], [1, 4], 8, 1
    if a.rounds < 1 or a.cell_mib < 1 or min(sizes) < 1 or min(depths) < 1:
        ap.error("sizes, depths, --cell-mib and --rounds must be positive")
    base = a.dir or tempfile.mkdtemp(prefix="kvtier-qd-", dir="/var/tmp")
    fio_dir, kv_dir = os.path.join(base, "fio"), os.path.join(base, "kvtier")
    payload = RandomPayload(256, 1)

    load0 = os.getloadavg()[0]
    t0 = time.monotonic()
    cells = []
    try:
        for obj in sizes:
            for qd in depths:
                count = cell_count(obj, qd, a.cell_mib << 20)
                cell = measure_cell(obj, qd, count, a.rounds, fio_dir, kv_dir, payload)
                cells.append(cell)
                print(
                    f"{_size(obj):>7} x{qd:<3} ({time.monotonic() - t0:.0f} s, load {os.getloadavg()[0]:.1f}): "
                    f"write {cell['write']['ratio']:.2f}x fio, read {cell['read']['ratio']:.2f}x fio",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        shutil.rmtree(fio_dir, ignore_errors=True)
        shutil.rmtree(kv_dir, ignore_errors=True)
        if not a.dir:
            shutil.rmtree(base, ignore_errors=True)
    load1 = os.getloadavg()[0]
    print(
        f"\nkvtier disk tier vs fio (O_DIRECT, psync, one job per operation in flight), {a.rounds} rounds (medians), "
        f"about {a.cell_mib} MiB per cell and step, dir {base}, load average {load0:.1f} at the start, {load1:.1f} at "
        f"the end, {time.monotonic() - t0:.0f} s"
    )
    head = f"{'entry':>7}{'in flight':>10}{'':>3}{'ratio':>7}{'range':>12}{'kvtier CPU-s/GiB':>18}{'fio CPU-s/GiB':>15}"
    print(head + f"{'host %':>8}")
    for c in cells:
        for op in ("write", "read"):
            x = c[op]
            print(
                f"{_size(c['entry_bytes']):>7}{c['in_flight']:>10}{op[0]:>3}{x['ratio']:>7.2f}"
                f"{x['ratio_min']:>6.2f}-{x['ratio_max']:<5.2f}{x['kvtier_cpu_s_per_gib']:>18.3f}"
                f"{x['fio_cpu_s_per_gib']:>15.3f}{x['kvtier_host_share'] * 100:>7.1f}%"
            )
    print("w: writes of new files (kvtier: new entries in an empty tier), r: reads (kvtier verifies each checksum)")
    print("ratio: median over rounds of kvtier GB/s / fio GB/s from the same round; range: lowest and highest")
    if a.json:
        write_run_json(a.json, {"args": vars(a), "load_average": [load0, load1], "cells": cells}, argv=argv)
    return 0


def _size(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


if __name__ == "__main__":
    sys.exit(main())
