"""Turns a finished (or cut-short) run into the results document and writes it atomically.

Keys follow the MLPerf KV Cache benchmark where the concept is the same (`summary.avg_throughput_tokens_per_sec`,
`end_to_end_latency_ms`, `cache_stats.tier_<name>_kv_bytes_read_gb`, ...). Tier names in `cache_stats` use that
benchmark's words: gpu, cpu, storage (our disk tier). Every latency is a summary of a mergeable histogram, and the
histograms themselves are included (`tiers.<name>.read.histograms`) so runs can be merged later.
"""

from __future__ import annotations

import json
import os
import tempfile

from kvconnector.store import TieredStore

GB = 1e9
PEER_TIER_NAMES = {"gpu": "gpu", "cpu": "cpu", "disk": "storage"}


def tier_label(kind: str, name: str) -> str:
    return PEER_TIER_NAMES.get(kind, name)


def cache_stats(store: TieredStore, elapsed_s: float) -> dict:
    hits, misses = store.events["hits"], store.events["misses"]
    out: dict = {
        "cache_hits": hits,
        "cache_misses": misses,
        "cache_hit_rate": round(hits / (hits + misses), 4) if hits + misses else 0.0,
        "put_rejected": store.events["put_rejected"],
    }
    usage = {u["tier"]: u for u in store.usage()}
    for tier, st in zip(store.tiers, store.stats):
        label = tier_label(tier.kind, tier.name)
        out[f"{label}_entries"] = usage[tier.name]["entries"]
        out[f"tier_{label}_kv_bytes_read_gb"] = round(st.read.nbytes / GB, 4)
        out[f"tier_{label}_kv_bytes_written_gb"] = round(st.write.nbytes / GB, 4)
        out[f"tier_{label}_read_bandwidth_gbps"] = round(st.read.nbytes / GB / elapsed_s, 4) if elapsed_s else 0.0
        out[f"tier_{label}_write_bandwidth_gbps"] = round(st.write.nbytes / GB / elapsed_s, 4) if elapsed_s else 0.0
        for op_name, op in (("read", st.read), ("write", st.write)):
            for pct, key in ((50, "p50"), (95, "p95"), (99, "p99"), (99.9, "p999")):
                out[f"tier_{label}_{op_name}_{key}_ms"] = round(op.total.percentile_ms(pct), 4)
            if tier.kind == "disk":
                for part, hist in (("device", op.device), ("host", op.host)):
                    for pct, key in ((50, "p50"), (95, "p95"), (99, "p99")):
                        out[f"storage_{op_name}_{part}_{key}_ms"] = round(hist.percentile_ms(pct), 4)
    return out


def tier_details(store: TieredStore) -> dict:
    usage = {u["tier"]: u for u in store.usage()}
    return {
        tier.name: {**tier.describe(), **usage[tier.name], **st.to_dict(), "fallbacks": dict(tier.fallbacks)}
        for tier, st in zip(store.tiers, store.stats)
    }


def write_json(path: str, doc: dict) -> None:
    """Write to a temp file in the same directory and rename, so a reader never sees half a file."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".kvtier-", suffix=".json.tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=2, sort_keys=False)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
