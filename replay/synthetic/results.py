"""Turns a finished (or cut-short) run into the results document and writes it atomically.

Keys follow the MLPerf KV Cache benchmark where the concept is the same (`summary.avg_throughput_tokens_per_sec`,
`end_to_end_latency_ms`, `cache_stats.tier_<name>_kv_bytes_read_gb`, ...). Tier names in `cache_stats` use that
benchmark's words: gpu, cpu, storage (our disk tier). Every latency is a summary of a mergeable histogram, and the
histograms themselves are included (`tiers.<name>.read.histograms`) so runs can be merged later.
"""

from __future__ import annotations

from kvconnector.store import TieredStore
from kvconnector.telemetry import OpStats, TierStats

GB = 1e9
PEER_TIER_NAMES = {"gpu": "gpu", "cpu": "cpu", "disk": "storage"}


def tier_label(kind: str, name: str) -> str:
    return PEER_TIER_NAMES.get(kind, name)


def cache_stats(tiers: dict, events: dict, elapsed_s: float) -> dict:
    """The MLPerf-style `cache_stats` block from `tier_details` (a live store's, or merged clients')."""
    hits, misses = events.get("hits", 0), events.get("misses", 0)
    out: dict = {
        "cache_hits": hits,
        "cache_misses": misses,
        "cache_hit_rate": round(hits / (hits + misses), 4) if hits + misses else 0.0,
        "put_rejected": events.get("put_rejected", 0),
    }
    for name, t in tiers.items():
        label = tier_label(t["kind"], name)
        out[f"{label}_entries"] = t["entries"]
        for op in ("read", "write"):
            st = OpStats.from_dict(t[op])
            verb = "read" if op == "read" else "written"
            out[f"tier_{label}_kv_bytes_{verb}_gb"] = round(st.nbytes / GB, 4)
            out[f"tier_{label}_{op}_bandwidth_gbps"] = round(st.nbytes / GB / elapsed_s, 4) if elapsed_s else 0.0
            for pct, key in ((50, "p50"), (95, "p95"), (99, "p99"), (99.9, "p999")):
                out[f"tier_{label}_{op}_{key}_ms"] = round(st.total.percentile_ms(pct), 4)
            if t["kind"] == "disk":
                for part, hist in (("device", st.device), ("host", st.host)):
                    for pct, key in ((50, "p50"), (95, "p95"), (99, "p99")):
                        out[f"storage_{op}_{part}_{key}_ms"] = round(hist.percentile_ms(pct), 4)
    return out


def tier_details(store: TieredStore) -> dict:
    usage = {u["tier"]: u for u in store.usage()}
    return {
        tier.name: {**tier.describe(), **usage[tier.name], **st.to_dict(), "fallbacks": dict(tier.fallbacks)}
        for tier, st in zip(store.tiers, store.stats)
    }


def merge_tier_details(parts: list[dict]) -> dict:
    """Tiers of several clients as one: entries, bytes and capacities add up; histograms merge (never averaged)."""
    out: dict = {}
    for tiers in parts:
        for name, t in tiers.items():
            if name not in out:
                out[name] = {k: v for k, v in t.items() if k not in ("read", "write", "events", "fallbacks")}
                out[name].update(_stats=TierStats(name), fallbacks={})
                out[name]["entries"] = out[name]["used_bytes"] = out[name]["capacity_bytes"] = 0
            m = out[name]
            m["entries"] += t["entries"]
            m["used_bytes"] += t["used_bytes"]
            m["capacity_bytes"] += t["capacity_bytes"]
            m["_stats"].merge(TierStats.from_dict(name, t))
            for k, v in t.get("fallbacks", {}).items():
                m["fallbacks"][k] = m["fallbacks"].get(k, 0) + v
    for m in out.values():
        m.update(m.pop("_stats").to_dict())
    return out


def sla_verdict(service, target_p95_ms: float, target_p99_ms: float) -> dict:
    """A QoS class's SLA judged on its service-latency histogram: met True/False, or None with verdict "no data"
    when the class completed no request (nothing was measured, so nothing was missed either)."""
    if not service.count:
        return {"met": None, "verdict": "no data"}
    met = service.percentile_ms(95) <= target_p95_ms and service.percentile_ms(99) <= target_p99_ms
    return {"met": met, "verdict": "met" if met else "missed"}
