#!/usr/bin/env python3
"""Latency of one cold L2 hit through LMCache's L2 adapter interface alone (no vLLM, no server): kvtier's adapter vs
LMCache's fs adapter (use_odirect), same keys, same chunk size, same page-aligned memory objects.

A hit is what the LMCache MP server does for a cached prefix: lookup-and-lock of the prefix's chunk keys, then one load
task for all of them, then unlock. Before each hit the page cache is dropped (root). This separates the adapters' own
cost from what happens around them in the e2e stack (benchmarks/ttft_kvtier_vs_lmcache.py measures the whole TTFT).

  sudo .venv/bin/python benchmarks/l2_hit_latency.py --chunks 5 --chunk-kib 128 --repeats 20
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import sys
import time


def wait(query, tid):
    while (result := query(tid)) is None:
        time.sleep(0.0001)
    return result


def one_side(make, directory: str, keys, src, dst, repeats: int) -> tuple[list[float], list[float]]:
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    adapter = make(directory)
    try:
        tid = adapter.submit_store_task(keys, src)
        while tid not in adapter.pop_completed_store_tasks():
            time.sleep(0.001)
        lookups, loads = [], []
        for _ in range(repeats):
            os.system("sync; echo 1 > /proc/sys/vm/drop_caches")
            t0 = time.perf_counter()
            found = wait(adapter.query_lookup_and_lock_result, adapter.submit_lookup_and_lock_task(keys, {}))
            t1 = time.perf_counter()
            loaded = wait(adapter.query_load_result, adapter.submit_load_task(keys, dst))
            t2 = time.perf_counter()
            adapter.submit_unlock(keys)
            if found.popcount() != len(keys) or loaded.popcount() != len(keys):
                raise RuntimeError("a stored chunk was not found or not loaded")
            lookups.append((t1 - t0) * 1e3)
            loads.append((t2 - t1) * 1e3)
        return lookups, loads
    finally:
        adapter.close()
        shutil.rmtree(directory, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/var/tmp/kvtier-l2-hit")
    ap.add_argument("--chunks", type=int, default=5, help="chunk keys per hit (1.3k tokens / 256 = 5)")
    ap.add_argument("--chunk-kib", type=int, default=128, help="bytes per chunk (the tiny e2e model: 128 KiB)")
    ap.add_argument("--repeats", type=int, default=20)
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("l2_hit_latency: cold hits need root (drop_caches)", file=sys.stderr)
        return 2
    os.environ.setdefault("PYTHONHASHSEED", "0")
    os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")
    from lmcache.v1.distributed.api import ObjectKey
    from lmcache.v1.distributed.l2_adapters import create_l2_adapter
    from lmcache.v1.distributed.l2_adapters.fs_l2_adapter import FSL2AdapterConfig
    from lmcache.v1.distributed.l2_adapters.plugin_l2_adapter import PluginL2AdapterConfig
    from lmcache_vs_kvtier import make_objs

    logging.getLogger("lmcache").setLevel(logging.ERROR)
    nbytes = a.chunk_kib << 10
    keys = [ObjectKey(i.to_bytes(8, "big"), "benchmarks/model", 0) for i in range(a.chunks)]
    src_pairs, dst_pairs = make_objs(a.chunks, nbytes, True), make_objs(a.chunks, nbytes, False)
    src, dst = [o for _, o in src_pairs], [o for _, o in dst_pairs]
    sides = {
        "kvtier (direct)": lambda d: create_l2_adapter(
            PluginL2AdapterConfig.from_dict(
                {
                    "module_path": "kvconnector.lmcache.l2_adapter",
                    "class_name": "KvtierL2Adapter",
                    "adapter_params": {
                        "disk_dir": d,
                        "disk_capacity_gb": 1,
                        "io_mode": "direct",
                        "snapshot_path": "",
                        "rescan_on_start": False,
                    },
                }
            )
        ),
        "lmcache-fs (use_odirect)": lambda d: create_l2_adapter(
            FSL2AdapterConfig.from_dict({"base_path": d, "use_odirect": True})
        ),
    }
    print(f"{a.chunks} chunks of {a.chunk_kib} KiB per hit, {a.repeats} cold hits per side")
    print(f"{'side':<26}{'lookup p50 ms':>14}{'load p50 ms':>13}{'load p90 ms':>13}")
    for name, make in sides.items():
        lookups, loads = one_side(make, os.path.join(a.dir, name.split()[0]), keys, src, dst, a.repeats)
        loads.sort()
        print(
            f"{name:<26}{statistics.median(lookups):>14.2f}{statistics.median(loads):>13.2f}"
            f"{loads[int(0.9 * (len(loads) - 1))]:>13.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
