"""What runs are compared on, and how a figure is shown: one definition for `kvtier compare` (a terminal table,
replay/synthetic/compare.py) and `kvtier report` (the HTML summary table, replay/outputs/html/), so both print the
same number the same way.

A row is (metric, unit, path into the document or a function of it, which direction is better). A unit of "%" marks
a share: the document holds a fraction (0.25) and the table shows a percentage (25.00%). Values are shown with 4
significant digits (thousands separated, and whole from 10,000 up), so the text reads back to the number within
0.05% however small a latency is; a ratio to the first run with 2 decimals, `better` telling whether it is good.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvconnector.units import GB

from ._common import sla_verdict_text

__all__ = [
    "Getter",
    "Row",
    "bench_rows",
    "format_ratio",
    "format_value",
    "metric_label",
    "ratio",
    "ratio_verdict",
    "value_at",
]

Getter = tuple[str, ...] | Callable[[Any], Any]
# Units the metric's name already says (or that the value's text shows): not repeated after it.
_UNITS_IN_NAME = ("", "1/s", "tokens/s", "GB/s", "x", "%")
# A ratio is coloured good or bad past this difference from 1.
RATIO_NOTICE = 0.05


@dataclass(frozen=True)
class Row:
    metric: str
    unit: str
    get: Getter
    better: str | None = None  # "higher", "lower" or None (no direction)


def value_at(doc: Any, get: Getter) -> Any:
    """The value a row shows: `get(doc)`, or the value at a path of keys (list indices as text, -1 the last); None
    where the path is absent, and for a percentile of a latency summary of no requests (it reads 0, not "fast")."""
    if callable(get):
        return get(doc)
    cur = doc
    for key in get:
        if isinstance(cur, dict) and cur.get("count") == 0 and key != "count":
            return None
        if (
            isinstance(cur, list)
            and isinstance(key, str)
            and key.lstrip("-").isdigit()
            and -len(cur) <= int(key) < len(cur)
        ):
            cur = cur[int(key)]
        elif isinstance(cur, dict) and key in cur:
            cur = cur[key]
        else:
            return None
    return cur


def format_value(value: Any, unit: str) -> str:
    """A value as a table shows it: 4 significant digits, whole from 10,000 up; a share (unit "%") as a percentage
    with 2 decimals; "-" for none (and NaN), yes/no for a flag."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        if unit == "%":
            return f"{value * 100:.2f}%"
        return f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    return str(value)


def metric_label(metric: str, unit: str) -> str:
    """The metric's name with its unit, where the name does not say it already: `end-to-end p99 (ms)`."""
    return f"{metric} ({unit})" if unit not in _UNITS_IN_NAME else metric


def ratio(value: Any, base: Any) -> float | None:
    """`value / base`, or None where either is not a number (a flag is not) or the base is 0."""
    if isinstance(value, bool) or isinstance(base, bool):
        return None
    if not isinstance(value, int | float) or not isinstance(base, int | float) or base == 0:
        return None
    return value / base


def format_ratio(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}x"


def ratio_verdict(r: float | None, better: str | None) -> str | None:
    """ "good" or "bad" for a ratio more than RATIO_NOTICE from 1 on a row with a direction, else None."""
    if r is None or not better or abs(r - 1) <= RATIO_NOTICE:
        return None
    return "good" if (r > 1) == (better == "higher") else "bad"


# ---- the rows of a kvtier bench result (a run, --trials, a merge) ---------------------------------------------------


def _sla_verdict(cls: str) -> Callable[[dict], Any]:
    def get(doc: dict) -> Any:
        c = value_at(doc, ("summary", "qos_metrics", cls))
        return sla_verdict_text(c) if isinstance(c, dict) else None

    return get


def _tier_gbps(name: str, op: str) -> Callable[[dict], Any]:
    def get(doc: dict) -> Any:
        o = ((doc.get("tiers") or {}).get(name) or {}).get(op)
        elapsed = (doc.get("summary") or {}).get("elapsed_time")
        if not o or "bytes" not in o or not elapsed:
            return None
        return o["bytes"] / GB / elapsed

    return get


def bench_rows(docs: list[dict]) -> list[Row]:
    """The rows `kvtier bench` results are compared on: the summary, each tier any of them has (read and write), the
    caches, and each QoS class any of them has."""
    rows = [
        Row("status", "", ("status",)),
        Row("elapsed", "s", ("summary", "elapsed_time")),
        Row("requests completed", "", ("summary", "total_requests")),  # depends on the duration
        Row("requests/s", "1/s", ("summary", "requests_per_second"), "higher"),
        Row("tokens/s", "tokens/s", ("summary", "avg_throughput_tokens_per_sec"), "higher"),
        Row("tokens / storage I/O s", "tokens/s", ("summary", "storage_throughput_tokens_per_sec"), "higher"),
        Row("storage tier tokens/s", "tokens/s", ("summary", "storage_tier_tokens_per_sec"), "higher"),
        Row("end-to-end p50", "ms", ("summary", "end_to_end_latency_ms", "p50"), "lower"),
        Row("end-to-end p95", "ms", ("summary", "end_to_end_latency_ms", "p95"), "lower"),
        Row("end-to-end p99", "ms", ("summary", "end_to_end_latency_ms", "p99"), "lower"),
        Row("storage I/O p95", "ms", ("summary", "storage_io_latency_ms", "p95"), "lower"),
    ]
    tiers: list[str] = []
    for d in docs:
        tiers += [t for t in d.get("tiers") or {} if t not in tiers]
    for t in tiers:
        for op in ("read", "write"):
            rows.append(Row(f"{t} {op} GB/s", "GB/s", _tier_gbps(t, op), "higher"))
            rows.append(Row(f"{t} {op} p99", "ms", ("tiers", t, op, "latency_ms", "p99"), "lower"))
    rows += [
        Row("cache hit rate", "%", ("summary", "cache_stats", "cache_hit_rate"), "higher"),
        Row("block device read GB/s", "GB/s", ("block_device", "read_gbps"), "higher"),
        Row("block device write GB/s", "GB/s", ("block_device", "write_gbps"), "higher"),
    ]
    if any(value_at(d, ("summary", "prefix_cache_stats")) for d in docs):
        rows.append(Row("prefix cache hit rate", "%", ("summary", "prefix_cache_stats", "hit_rate"), "higher"))
    classes: list[str] = []
    for d in docs:
        classes += [c for c in value_at(d, ("summary", "qos_metrics")) or {} if c not in classes]
    for c in classes:
        rows.append(
            Row(f"QoS {c} service p99", "ms", ("summary", "qos_metrics", c, "service_latency_ms", "p99"), "lower")
        )
        rows.append(Row(f"QoS {c} SLA", "", _sla_verdict(c)))
    return rows
