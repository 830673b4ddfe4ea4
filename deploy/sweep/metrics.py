"""The figures a sweep reads from each driver run's results file, and how they are compared with the reference."""

from __future__ import annotations

import statistics
from typing import Any

# (key, heading, where in the driver's results document, lower is better). Paths are tuples of keys.
BENCH_METRICS = (
    ("service_p50_ms", "service p50 ms", ("summary", "storage_io_latency_ms", "p50"), True),
    ("service_p95_ms", "service p95 ms", ("summary", "storage_io_latency_ms", "p95"), True),
    ("disk_read_p50_ms", "disk read p50 ms", ("summary", "cache_stats", "storage_read_p50_ms"), True),
    ("generation_p50_ms", "generation p50 ms", ("summary", "generation_latency_ms", "p50"), True),
    ("requests_per_s", "requests/s", ("summary", "requests_per_second"), False),
    ("l2_hit_share", "L2 hit share", None, False),
)
REPLAY_METRICS = (
    ("ttft_p50_ms", "TTFT p50 ms", ("ttft_ms", "p50"), True),
    ("ttft_p95_ms", "TTFT p95 ms", ("ttft_ms", "p95"), True),
    ("tpot_p50_ms", "TPOT p50 ms", ("tpot_ms", "p50"), True),
    ("output_tok_s", "output tok/s", ("output_throughput",), False),
    ("l2_hit_share", "L2 hit share", ("server_metrics", "external_prefix_cache_hit_rate"), False),
)
METRICS = {"bench": BENCH_METRICS, "replay": REPLAY_METRICS}
# the figure each driver's heat maps lead with (TTFT, as in the JGU Mainz storage-tiering case study; the bench
# driver has no model, so storage service)
HEADLINE = {"bench": "service_p50_ms", "replay": "ttft_p50_ms"}


def _get(doc: dict, path: tuple[str, ...]) -> float | None:
    cur: Any = doc
    for key in path:
        if not isinstance(cur, dict) or key not in cur:
            return None
        if cur.get("count") == 0:  # a latency summary of no requests: its percentiles read 0, not "fast"
            return None
        cur = cur[key]
    return float(cur) if isinstance(cur, int | float) and not isinstance(cur, bool) else None


def _bench_l2_share(doc: dict) -> float | None:
    """Share of lookups served by a tier below CPU memory (here: the disk tier on the mount)."""
    c = (doc.get("summary") or {}).get("cache_stats") or {}
    hits, misses, fast = c.get("cache_hits"), c.get("cache_misses"), c.get("fast_tier_hits", 0)
    if hits is None or misses is None or hits + misses == 0:
        return None
    return (hits - fast) / (hits + misses)


def extract(driver: str, doc: dict) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for key, _, path, _ in METRICS[driver]:
        out[key] = _bench_l2_share(doc) if path is None else _get(doc, path)
    return out


def median(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def relative(value: float | None, ref: float | None) -> float | None:
    """value / reference, None where either is missing or the reference is 0."""
    if value is None or ref is None or ref == 0:
        return None
    return value / ref


__all__ = ["HEADLINE", "METRICS", "extract", "median", "relative"]
