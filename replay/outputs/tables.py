"""The closing tables a person reads in the terminal (rich), from a results document.

`kvtier replay`: latency percentiles per metric with the run's counts in the caption; a per-round table for a run in
rounds; bytes per kvtier tier when the server's /metrics had kvtier's exporter (which tier the KV cache really went
to). `kvtier bench`'s tables are in replay/synthetic/view.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.table import Table

__all__ = ["cell_text", "replay_tables", "rows_table"]

_LATENCY_KEYS = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms", "send_lag_ms", "queue_ms")
_LATENCY_COLS = ("mean", "p50", "p90", "p99")
_ROUND_COLS = (
    ("round", "round"),
    ("hit_rate", "hit"),
    ("ideal_hit_rate", "ideal"),
    ("hit_to_ideal", "hit/ideal"),
    ("ttft_p50_ms", "TTFT p50 ms"),
    ("tpot_p50_ms", "TPOT p50"),
    ("requests_per_s", "req/s"),
    ("recomputed_tokens_per_request", "recomp/req"),
    ("excess_recompute_per_request", "excess/req"),
    ("kv_written_bytes", "KV written B"),
    ("errors", "err"),
    ("wall_s", "wall s"),
)


def cell_text(value: Any) -> str:
    """A table cell: '-' for a missing value, floats with 4 decimals, anything else as str()."""
    if value is None:
        return "-"
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def rows_table(title: str, rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]]) -> Table:
    """A right-aligned table of `rows`, one column per (key, heading) of `columns`."""
    t = Table(title=title, show_header=True)
    for _, head in columns:
        t.add_column(head, justify="right")
    for r in rows:
        t.add_row(*(cell_text(r.get(key)) for key, _ in columns))
    return t


def replay_tables(summary: dict[str, Any]) -> list[Table]:
    """The tables of a `kvtier replay` summary, in print order."""
    t = Table(title="kvtier replay", show_header=True)
    t.add_column("metric")
    for c in _LATENCY_COLS:
        t.add_column(c, justify="right")
    for key in _LATENCY_KEYS:
        v = summary[key]
        t.add_row(key, *(f"{v.get(c, 0):.2f}" for c in _LATENCY_COLS))
    t.caption = (
        f"completed {summary['completed']}  failed {summary['failed']}  "
        f"req/s {summary['request_throughput']:.2f}  out tok/s {summary['output_throughput']:.1f}  "
        f"achieved rate {summary['achieved_rate'] or 0:.2f}"
    )
    if summary.get("errors_by_kind"):
        errs = sorted(summary["errors_by_kind"].items(), key=lambda kv: -kv[1])
        t.caption += "\nerrors: " + ", ".join(f"{k} {n}" for k, n in errs)
    if summary.get("run_failed"):
        t.caption += f"\nRUN FAILED: {summary['run_failed']}"
    tables = [t]
    if summary.get("rounds"):
        tables.append(rows_table("per round", summary["rounds"], _ROUND_COLS))
    server = summary.get("server_metrics") or {}
    if server.get("kv_bytes_by_tier"):
        tables.append(tier_bytes_table(server["kv_bytes_by_tier"]))
    if server.get("prompt_tokens_by_tier"):
        tables.append(prompt_sources_table(server["prompt_tokens_by_tier"]))
    if summary.get("target_hit_rate"):
        tables.append(target_hit_rate_table(summary["target_hit_rate"], "server /metrics"))
    return tables


def target_hit_rate_table(t: dict[str, Any], measured_by: str) -> Table:
    """--target-hit-rate: the target, what the sessions plan for the whole run and for what completed, the measure."""
    rows = [
        {"what": "target", "hit rate": t["target"]},
        {"what": f"planned ({t['requests']:,} requests)", "hit rate": t["planned_hit_rate"]},
        {"what": "planned (the requests completed)", "hit rate": t["planned_hit_rate_of_completed"]},
        {"what": f"measured ({measured_by})", "hit rate": t["measured_hit_rate"]},
    ]
    table = rows_table("prefix hit rate against the target", rows, (("what", ""), ("hit rate", "hit rate")))
    table.columns[0].justify = "left"
    table.caption = (
        f"{t['sessions']:,} sessions, {t['shared_blocks'] * t['block_tokens']:,} of {t['prompt_tokens']:,} prompt "
        f"tokens shared a turn, cache {t['cache_tokens']:,} tokens"
    )
    return table


def prompt_sources_table(parts: dict[str, int]) -> Table:
    """Prompt tokens over the run by where they came from (server_metrics.prompt_tokens_by_tier), with shares."""
    total = sum(parts.values())
    rows = [
        {"source": k, "tokens": f"{v:,}", "share": f"{v / total:.1%}" if total else "-"}
        for k, v in sorted(parts.items(), key=lambda kv: source_order(kv[0]))
    ]
    t = rows_table("prompt tokens by where they came from (server /metrics)", rows, _SOURCE_COLS)
    t.columns[0].justify = "left"
    t.caption = f"{total:,} prompt tokens"
    return t


_SOURCE_COLS = (("source", "source"), ("tokens", "tokens"), ("share", "share"))


def source_order(name: str) -> tuple[int, str]:
    """Nearest the GPU first: vLLM's own cache, LMCache's memory, kvtier's tiers, L2 unsplit, recomputed last."""
    first = ("vllm_prefix_cache", "lmcache_l1")
    last = ("lmcache_l2", "external_kv_transfer", "recomputed")
    if name in first:
        return first.index(name), ""
    if name in last:
        return 10 + last.index(name), ""
    return 5, name


def tier_bytes_table(by_tier: dict[str, dict[str, float]]) -> Table:
    """Bytes written and read per kvtier tier over the run (deltas of `kvtier_bytes_total{tier,op}`)."""
    ops = sorted({op for v in by_tier.values() for op in v}, key=lambda op: ({"write": 0, "read": 1}.get(op, 2), op))
    rows = [{"tier": tier, **{op: f"{int(v.get(op, 0)):,}" for op in ops}} for tier, v in by_tier.items()]
    t = rows_table(
        "kvtier bytes per tier (server /metrics)", rows, [("tier", "tier")] + [(op, f"{op} B") for op in ops]
    )
    t.columns[0].justify = "left"
    return t
