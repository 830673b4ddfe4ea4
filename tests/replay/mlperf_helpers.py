"""Run trees of rank files for the tests of `kvtier mlperf summary` and of its agreement with mlpstorage's own
aggregation: `rank_doc` is a rank file as kvtier bench writes it, reduced to the keys the aggregation reads."""

from __future__ import annotations

import json
from pathlib import Path


def rank_doc(read, write, tps, stps, p95, dev_read, dev_write, entries=10) -> dict:
    """A rank file as kvtier bench writes it, reduced to the keys the aggregation reads."""
    return {
        "summary": {
            "status": "completed",
            "avg_throughput_tokens_per_sec": tps,
            "storage_throughput_tokens_per_sec": stps,
            "storage_io_latency_ms": {"p50": p95 / 2, "p95": p95},
            "cache_stats": {
                "tier_storage_read_bandwidth_gbps": read,
                "tier_storage_write_bandwidth_gbps": write,
                "storage_read_device_p95_ms": dev_read,
                "storage_write_device_p95_ms": dev_write,
                "storage_entries": entries,
            },
        }
    }


def put(run: Path, option: int, trial: int, rank: int, doc, name: str = "kvcache_results_20260101_120000.json"):
    d = run / f"option_{option}" / f"trial_{trial}" / f"rank_{rank}"
    d.mkdir(parents=True, exist_ok=True)
    path = d / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


# Option 1: 2 ranks x 3 trials, every file complete.
#   (read, write, tokens/s, storage tokens/s, io p95, device read p95, device write p95) per trial, rank 0 / rank 1
FULL = {
    0: [(1.0, 0.2, 100, 10, 5, 2, 1), (2.0, 0.3, 200, 20, 7, 3, 6)],
    1: [(1.5, 0.4, 150, 5, 12, 8, 2), (2.5, 0.4, 150, 10, 3, 1, 2)],
    2: [(0.5, 0.1, 90, 40, 4, 4, 3), (1.5, 0.1, 120, 20, 9, 4, 5)],
}


def full_tree(run: Path) -> None:
    for trial, ranks in FULL.items():
        for rank, figures in enumerate(ranks):
            put(run, 1, trial, rank, rank_doc(*figures))
