#!/usr/bin/env python3
"""Where a disk-tier write spends its time outside the device: kvtier's per-entry host time split by phase.

A DiskTier fills an empty directory with `--entries` entries of `--object-mib` from `--workers` threads, then every
entry is deleted (its file kept as a spare) and written again (the overwrite of a full tier). Each system call
write_entry makes and the xxh3 checksum are timed where they happen (perf_counter_ns around the call, summed over
threads), so the table shows milliseconds per entry for each, next to the entry's host and total time as write_entry
itself reports them (host = total - time inside the storage system calls).

Two ways of writing alternate round by round in the same process, so a drifting disk or a changing load weighs on
both alike:
  beside   what write_entry does: the checksum computed on a hash thread while the payload is written (entries of
           OVERLAP_MIN_BYTES and more), the header page written by that thread
  serial   the checksum first, on the writer's thread, then header and payload in one pwritev (what write_entry did
           before; forced here by raising OVERLAP_MIN_BYTES)

examples:
  python benchmarks/disk_host_split.py --dir /var/tmp/host-split
  python benchmarks/disk_host_split.py --dir /var/tmp/host-split --workers 1 --entries 24 --rounds 4
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import shutil
import statistics
import sys
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from time import perf_counter_ns

import kvconnector.timed_io as tio
from kvconnector.tiers import DiskTier
from replay.synthetic.payload import RandomPayload

# The system calls write_entry makes (through timed_io's `os`), and the checksum.
CALLS = ("open", "posix_fallocate", "pwritev", "fdatasync", "close", "rename")
PHASES = ("xxh3", *CALLS)


class Timed:
    """Stands in for a module inside timed_io: the named functions are timed per call, summed into `acc`."""

    def __init__(self, module, names, acc: Counter, lock: threading.Lock) -> None:
        self._module, self._names, self._acc, self._lock = module, set(names), acc, lock

    def __getattr__(self, name):
        fn = getattr(self._module, name)
        if name not in self._names:
            return fn

        def timed(*args, **kwargs):
            t0 = perf_counter_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                dt = perf_counter_ns() - t0
                with self._lock:
                    self._acc[name] += dt

        return timed


def instrument(acc: Counter, lock: threading.Lock) -> None:
    tio.os = Timed(os, CALLS, acc, lock)
    real_checksum = tio.checksum

    def checksum(chunks):
        t0 = perf_counter_ns()
        try:
            return real_checksum(chunks)
        finally:
            dt = perf_counter_ns() - t0
            with lock:
                acc["xxh3"] += dt

    tio.checksum = checksum


def write_all(tier: DiskTier, keys: list[str], obj: int, workers: int, payload: RandomPayload) -> dict:
    rngs = threading.local()  # one generator per worker thread, seeded by its order of first use

    def put(key: str) -> tuple[int, int]:
        if not hasattr(rngs, "rng"):
            rngs.rng = random.Random(next(seeds))
        t = tier.write(key, payload.chunks(obj, rngs.rng), obj)
        return t.host_ns, t.total_ns

    seeds = itertools.count()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(workers) as ex:
        times = list(ex.map(put, keys))
    wall = time.perf_counter() - t0
    return {
        "gbps": len(keys) * obj / wall / 1e9,
        "host_ns": sum(h for h, _ in times),
        "total_ns": sum(t for _, t in times),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True, help="a new or empty directory on the disk to measure (removed after)")
    ap.add_argument("--object-mib", type=int, default=16, help="entry size in MiB (default 16)")
    ap.add_argument("--entries", type=int, default=64, help="entries per step (default 64)")
    ap.add_argument("--workers", type=int, default=8, help="writer threads (default 8)")
    ap.add_argument("--rounds", type=int, default=4, help="rounds, each writing both ways (default 4)")
    ap.add_argument("--io-mode", default="direct", choices=["direct", "buffered"])
    args = ap.parse_args(argv)
    if args.object_mib < 1 or args.entries < 1 or args.workers < 1 or args.rounds < 1:
        print("disk_host_split: sizes, entries, workers and rounds must be positive", file=sys.stderr)
        return 2
    if os.path.exists(args.dir) and (not os.path.isdir(args.dir) or os.listdir(args.dir)):
        print(
            f"disk_host_split: --dir {args.dir} must be a new or empty directory (it is removed after)", file=sys.stderr
        )
        return 2
    obj = args.object_mib << 20
    acc, lock = Counter(), threading.Lock()
    instrument(acc, lock)
    beside_min = tio.OVERLAP_MIN_BYTES
    payload = RandomPayload(256, 1)
    keys = [f"obj-{i}" for i in range(args.entries)]
    # (way, step) -> one dict per round: GB/s, host share, and ms per entry for each phase
    runs: dict[tuple[str, str], list[dict]] = defaultdict(list)
    load0 = os.getloadavg()[0]
    tier = None
    try:
        for r in range(args.rounds):
            for way in ("beside", "serial") if r % 2 == 0 else ("serial", "beside"):
                tio.OVERLAP_MIN_BYTES = beside_min if way == "beside" else 1 << 62
                if tier is not None:
                    tier.close()
                shutil.rmtree(args.dir, ignore_errors=True)
                os.sync()  # untimed: what the last step freed is committed (and discarded) now
                tier = DiskTier(args.dir, 0, args.io_mode, spare_ratio=1.0)
                for step in ("fill", "overwrite"):
                    if step == "overwrite":
                        for key in keys:
                            tier.delete(key)
                        os.sync()
                    acc.clear()
                    w = write_all(tier, keys, obj, args.workers, payload)
                    row = {"gbps": w["gbps"], "host_share": w["host_ns"] / max(w["total_ns"], 1)}
                    row["total_ms"] = w["total_ns"] / len(keys) / 1e6
                    row["host_ms"] = w["host_ns"] / len(keys) / 1e6
                    row.update({p: acc[p] / len(keys) / 1e6 for p in PHASES})
                    runs[(way, step)].append(row)
                    print(
                        f"round {r + 1}/{args.rounds} {way:<6} {step:<9} {w['gbps']:5.2f} GB/s, host "
                        f"{row['host_share'] * 100:4.1f}%, load {os.getloadavg()[0]:.1f}",
                        file=sys.stderr,
                    )
    finally:
        tio.OVERLAP_MIN_BYTES = beside_min
        if tier is not None:
            tier.close()
        shutil.rmtree(args.dir, ignore_errors=True)
    load1 = os.getloadavg()[0]
    print(
        f"\n{args.object_mib} MiB entries, {args.workers} writers, {args.entries} entries per step, medians of "
        f"{args.rounds} rounds, io-mode {tier.io_mode.value}, load average {load0:.1f} -> {load1:.1f}"
    )
    print("ms per entry (summed over the threads that did it; pwritev includes the header page's own write)")
    head = f"{'way':<7}{'step':<10}{'GB/s':>6}{'host %':>8}{'total':>8}{'host':>7}" + "".join(
        f"{p[:9]:>10}" for p in PHASES
    )
    print(head)
    for (way, step), rows in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0])):

        def med(k, rows=rows):
            return statistics.median(x[k] for x in rows)

        print(
            f"{way:<7}{step:<10}{med('gbps'):>6.2f}{med('host_share') * 100:>7.1f}%{med('total_ms'):>8.1f}"
            f"{med('host_ms'):>7.2f}" + "".join(f"{med(p):>10.2f}" for p in PHASES)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
