"""`--validation-trace FILE`: the MLPerf reference's check of a run against a trace of a real system.

What the reference does (kv_cache_benchmark/kv_cache/workload.py, ValidationEngine, at hazemawadalla/storage
a56caea): the file is a JSON list of per-request records of a real deployment (its RealTraceEntry: timestamp,
request_id, user_id, context_tokens, generation_tokens, phase, cache_hit, cache_tier, read_bytes, write_bytes,
read_latency_ms, write_latency_ms, model_name, ...). After the run it compares the run's cache hit rate with the
share of the trace's records that were cache hits: error_pct = |run - trace| / trace x 100, passed when within 5%.
Its results get `validation` = {passed, avg_error_pct, comparison: {cache_hit_rate: {benchmark, trace, error_pct,
within_5pct}}, trace_stats}.

kvtier does the same, with two differences a user would want: the quantity compared is the reference's
`cache_hit_rate` (reads served from any tier; kvtier's `store_hit_rate`, since kvtier's `cache_hit_rate` is the
spec's fast-tier share), and a file that is missing or not such a list is an error (exit 2) where the reference
silently compares with built-in numbers.
"""

from __future__ import annotations

import math
import statistics

from kvconnector.errors import ConfigError

from ..common.json_files import MALFORMED, describe_malformed, loads_json, open_regular

__all__ = ["REQUIRED", "TOLERANCE_PCT", "load_validation_trace", "validate_run"]

# The record fields the comparison and the trace's statistics use.
REQUIRED = ("cache_hit", "context_tokens", "generation_tokens", "read_bytes", "write_bytes")
TOLERANCE_PCT = 5.0
_LARGEST = 2**63  # above any token or byte count of a request


def load_validation_trace(path: str) -> dict:
    """The trace's statistics (the reference's trace_stats); ConfigError naming the file for anything unreadable."""
    where = f"--validation-trace {path}"
    try:
        with open_regular(path) as f:
            records = loads_json(f.read())
    except OSError as exc:
        raise ConfigError(f"{where}: {exc.strerror or exc}") from exc
    except MALFORMED as exc:
        raise ConfigError(f"{where}: {describe_malformed(exc)}") from None
    if not isinstance(records, list) or not records:
        raise ConfigError(f"{where}: expected a non-empty JSON list of request records")
    for i, rec in enumerate(records):
        missing = [k for k in REQUIRED if not isinstance(rec, dict) or k not in rec]
        if missing:
            raise ConfigError(f"{where}: record {i} lacks {', '.join(missing)}")
        if not isinstance(rec["cache_hit"], bool):
            raise ConfigError(f"{where}: record {i}: cache_hit must be true or false")
        for k in REQUIRED[1:]:
            v = rec[k]
            # compared as it is: an int past a float's range has no float (OverflowError), and no count is so large
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < _LARGEST:
                raise ConfigError(f"{where}: record {i}: {k} must be a number from 0 to 2^63, got {str(v)[:40]}")
    written = sum(r["write_bytes"] for r in records)
    return {
        "file": path,
        "total_requests": len(records),
        "cache_hit_rate": sum(r["cache_hit"] for r in records) / len(records),
        "read_write_ratio": sum(r["read_bytes"] for r in records) / max(written, 1),
        "context_tokens_mean": statistics.fmean(r["context_tokens"] for r in records),
        "generation_tokens_mean": statistics.fmean(r["generation_tokens"] for r in records),
    }


def validate_run(trace_stats: dict, run_summary: dict) -> dict:
    """The run's any-tier hit rate against the trace's, in the reference's `validation` shape."""
    run = run_summary["cache_stats"]["store_hit_rate"]
    trace = trace_stats["cache_hit_rate"]
    if trace > 0:
        error = abs(run - trace) / trace * 100
    else:  # the reference divides by zero here; a trace without hits agrees only with a run without them
        error = 0.0 if run == 0 else math.inf
    within = error <= TOLERANCE_PCT
    return {
        "passed": within,
        "avg_error_pct": round(error, 3) if math.isfinite(error) else None,
        "comparison": {
            "cache_hit_rate": {
                "benchmark": run,
                "benchmark_key": "summary.cache_stats.store_hit_rate",
                "trace": trace,
                "error_pct": round(error, 3) if math.isfinite(error) else None,
                "within_5pct": within,
            }
        },
        "trace_stats": trace_stats,
    }
