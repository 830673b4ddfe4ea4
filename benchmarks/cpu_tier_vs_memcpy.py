#!/usr/bin/env python3
"""CPU-tier put and get against a plain numpy copy of the same bytes, per entry size, in one run.

The CPU tier should be bound by memcpy, not by allocation. Three sides, in alternating rounds
(medians reported, so a neighbour's burst on this shared VM hits every side alike):
- memcpy: np.copyto from the source into destination buffers mapped and touched beforehand (the floor);
- tier: CPUTier in its steady state: full of entries, each put first deletes the oldest (as the store's eviction
  does), so the put reuses the pooled buffer the delete gave back; a get reads an entry into a warm destination;
- mmap per entry: what CPUTier did before its pool, a fresh MAP_POPULATE mapping per put (writes only).
Every side copies a working set several times the last-level cache, cycling through distinct buffers, so no side
copies cache-hot bytes. Sizes are those of real KV entries: 128 KiB to 32 MiB chunks, and whole-request entries of
hundreds of MB whose sizes vary from put to put (tokens x 24 KiB, tiny-1b's bytes per token), as `kvtier bench`
makes them, so the pool's size classes and their slack are exercised.

  python benchmarks/cpu_tier_vs_memcpy.py                      # all sizes, 11 rounds, about a minute
  python benchmarks/cpu_tier_vs_memcpy.py --sizes 1MiB,32MiB --rounds 9 --json out.json
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from datetime import UTC, datetime

import numpy as np

from kvconnector.tiers import CPUTier
from kvconnector.timed_io import aligned_buffer
from kvconnector.units import GB, parse_size
from replay.outputs.provenance import write_run_json

KiB, MiB = 1024, 1024 * 1024
TOKEN_BYTES = 24576  # tiny-1b, bf16
WHOLE = "whole"  # whole-request entries: 8k-16k tokens, 192-384 MiB, size varies per put


def label(size: int | str) -> str:
    if size == WHOLE:
        return "192-384 MiB (whole request)"
    return f"{size // MiB} MiB" if size >= MiB else f"{size // KiB} KiB"


def sizes_for(size: int | str, count: int, rng: random.Random) -> list[int]:
    if size == WHOLE:
        return [rng.randint(8192, 16384) * TOKEN_BYTES for _ in range(count)]
    return [size] * count


def clock() -> tuple[int, int]:
    return time.perf_counter_ns(), time.thread_time_ns()


def elapsed(t0: tuple[int, int]) -> tuple[float, float]:
    """(wall, this thread's CPU) seconds since t0: CPU time is what a neighbour's load on this shared VM does not
    inflate by descheduling us (memory-bandwidth contention still shows in both)."""
    t1 = clock()
    return (t1[0] - t0[0]) / 1e9, (t1[1] - t0[1]) / 1e9


def copy(dst: memoryview, src: memoryview) -> None:
    np.copyto(np.frombuffer(dst, dtype=np.uint8), np.frombuffer(src, dtype=np.uint8))


class Case:
    """One entry size: the source bytes, the warm destinations, and a tier in its steady state."""

    def __init__(self, size: int | str, working_set: int, seed: int) -> None:
        self.rng = random.Random(seed)
        top = 16384 * TOKEN_BYTES if size == WHOLE else size
        self.count = max(3, -(-working_set // top))
        self.sizes = sizes_for(size, self.count, self.rng)
        # Source: one region as large as the working set, random bytes (the bench's payload buffer does the same).
        src = aligned_buffer(sum(self.sizes))
        np.frombuffer(src, dtype=np.uint8)[:] = np.random.default_rng(seed).integers(0, 256, len(src), dtype=np.uint8)
        offsets = np.cumsum([0, *self.sizes])
        self.src = [src[offsets[i] : offsets[i] + n] for i, n in enumerate(self.sizes)]
        self.dst = [aligned_buffer(n)[:n] for n in self.sizes]  # MAP_POPULATE: faulted in, warm
        self.tier = CPUTier(int(sum(self.sizes) * 1.3))
        self.seq = 0
        self.live: list[tuple[str, int]] = []  # (key, index of its source), oldest first
        for i in range(self.count):  # fill, then one full cycle so every buffer has been reused once
            self._put(i)
        for i in range(self.count):
            self._put(i)
        self.maps_after_fill = self.tier.counters["pool_maps"]

    def _put(self, i: int) -> None:
        if len(self.live) >= self.count:
            self.tier.delete(self.live.pop(0)[0])
        key = f"k{self.seq}"
        self.seq += 1
        self.tier.write(key, [self.src[i]], len(self.src[i]))
        self.live.append((key, i))

    # ---- sides: each returns (wall, CPU) seconds for one pass over the working set ----------------------------
    def memcpy_put(self) -> tuple[float, float]:
        t0 = clock()
        for i in range(self.count):
            copy(self.dst[i], self.src[i])
        return elapsed(t0)

    def tier_put(self) -> tuple[float, float]:
        t0 = clock()
        for i in range(self.count):
            self._put(i)
        return elapsed(t0)

    def mmap_put(self) -> tuple[float, float]:
        t0 = clock()
        for i in range(self.count):
            buf = aligned_buffer(len(self.src[i]))[: len(self.src[i])]
            copy(buf, self.src[i])
            del buf
        return elapsed(t0)

    def tier_get(self) -> tuple[float, float]:
        t0 = clock()
        for key, i in self.live:
            self.tier.read(key, self.sizes[i], self.dst[i])
        return elapsed(t0)

    def close(self) -> None:
        self.tier.close()


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  python benchmarks/cpu_tier_vs_memcpy.py\n"
        "  python benchmarks/cpu_tier_vs_memcpy.py --sizes 1MiB,32MiB --rounds 9",
    )
    ap.add_argument(
        "--sizes", default="128KiB,1MiB,8MiB,32MiB,whole", help="entry sizes (KiB/MiB or KB/MB ...) and 'whole'"
    )
    ap.add_argument("--rounds", type=int, default=11, help="alternating rounds per size (median reported)")
    ap.add_argument("--working-set-mb", type=int, default=128, help="bytes each side copies per round")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    try:
        sizes = [WHOLE if s == WHOLE else int(parse_size(s)) for s in args.sizes.split(",")]
    except ValueError as exc:
        ap.error(f"--sizes: {exc}")
    rows = []
    print(
        f"{'entry size':<28} {'memcpy GB/s':>11} {'put GB/s':>8} {'put/memcpy':>10} {'get GB/s':>8} "
        f"{'get/memcpy':>10} {'mmap put/memcpy':>15} {'CPU-time ratios put get mmap':>28} {'new maps':>8}"
    )
    for size in sizes:
        case = Case(size, args.working_set_mb * MiB, args.seed)
        nbytes = sum(case.sizes)
        sides = {"memcpy": case.memcpy_put, "put": case.tier_put, "get": case.tier_get, "mmap": case.mmap_put}
        wall: dict[str, list[float]] = {k: [] for k in sides}
        cpu: dict[str, list[float]] = {k: [] for k in sides}
        for r in range(args.rounds):
            for k in list(sides) if r % 2 == 0 else list(reversed(sides)):
                w, c = sides[k]()
                wall[k].append(w)
                cpu[k].append(c)
        gbps = {k: nbytes / GB / statistics.median(v) for k, v in wall.items()}
        cpu_gbps = {k: nbytes / GB / statistics.median(v) for k, v in cpu.items()}
        ratio = {k: gbps[k] / gbps["memcpy"] for k in sides}
        cpu_ratio = {k: cpu_gbps[k] / cpu_gbps["memcpy"] for k in sides}
        maps = case.tier.counters["pool_maps"] - case.maps_after_fill
        row = {
            "size": label(size),
            "entries": case.count,
            "bytes_per_round": nbytes,
            "wall_gbps": gbps,
            "wall_ratio_to_memcpy": ratio,
            "cpu_time_gbps": cpu_gbps,
            "cpu_time_ratio_to_memcpy": cpu_ratio,
            "spread": {k: (max(v) - min(v)) / statistics.median(v) for k, v in wall.items()},
            "pool_maps_in_rounds": maps,
            "tier": case.tier.describe(),
        }
        rows.append(row)
        print(
            f"{row['size']:<28} {gbps['memcpy']:>11.2f} {gbps['put']:>8.2f} {ratio['put']:>10.2f} "
            f"{gbps['get']:>8.2f} {ratio['get']:>10.2f} {ratio['mmap']:>15.2f} "
            f"{cpu_ratio['put']:>14.2f} {cpu_ratio['get']:>6.2f} {cpu_ratio['mmap']:>6.2f} {maps:>8}",
            flush=True,
        )
        case.close()
    worst = max(max(r["spread"].values()) for r in rows)
    print(f"{args.rounds} alternating rounds, medians; worst (max-min)/median of one side's round times: {worst:.0%}")
    if args.json:
        doc = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "args": vars(args), "rows": rows}
        write_run_json(args.json, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
