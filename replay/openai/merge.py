"""The ranks of `mpirun -n N kvtier replay` as one run: their summaries merged the way `kvtier merge` merges bench
results (replay/merging.py), so the merged file reads like one process's:
- counts, tokens and errors add up; the run's window is the union of the ranks' windows (on each host's wall clock)
  and every throughput is over its length;
- latency percentiles (TTFT, TPOT, ITL, E2E, send lag, queue) come from the ranks' merged histograms, the mean from
  their exact sums; achieved and schedule rates from the first and last request of any rank;
- the server's metrics are rank 0's (it alone scrapes, over the whole job);
- each rank's own summary stays under `ranks` (without its encoded histograms).
"""

from __future__ import annotations

from replay.openai.driver import RunState
from replay.openai.report import run_failure

from ..merging import merged_histogram, union_s

LATENCIES = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms", "send_lag_ms", "queue_ms")
SUMMED = (
    "completed",
    "failed",
    "not_sent",
    "scheduled",
    "warmup_requests",
    "sessions_cut_by_error",
    "total_input_tokens",
    "total_output_tokens",
)
RANK_ONLY = ("rank", "sessions")


def rank_clock(state: RunState, wall_ns: int) -> dict:
    """What a merge needs of a rank beyond its summary: its window's start and its first and last requests on the wall
    clock (`wall_ns`: time.time_ns() - time.perf_counter_ns()), and the prompt tokens against their targets."""
    sent = [r for r in state.records if r.sent_ns]
    ok = [r for r in state.records if r.success and r.prompt_tokens and r.target_prompt_tokens]

    def unix(ns: int) -> float:
        return (ns + wall_ns) / 1e9

    return {
        "start_unix_s": unix(state.t0_ns) if state.t0_ns else None,
        "sent": [unix(min(r.sent_ns for r in sent)), unix(max(r.sent_ns for r in sent)), len(sent)] if sent else None,
        "scheduled": [unix(min(r.scheduled_ns for r in sent)), unix(max(r.scheduled_ns for r in sent)), len(sent)]
        if sent
        else None,
        "prompt_tokens": sum(r.prompt_tokens for r in ok),
        "target_prompt_tokens": sum(r.target_prompt_tokens for r in ok),
    }


def _rate(spans: list) -> float | None:
    """(n - 1) / (last - first) over every rank's (first, last, n), as one process's rate over its requests."""
    spans = [s for s in spans if s]
    n = sum(s[2] for s in spans)
    first, last = min((s[0] for s in spans), default=0.0), max((s[1] for s in spans), default=0.0)
    return round((n - 1) / (last - first), 4) if n > 1 and last > first else None


def _per_s(count: float, duration_s: float) -> float:
    return round(count / duration_s, 4) if duration_s else 0.0


def merge_ranks(parts: list[dict], *, percentiles, slo: dict) -> dict:
    """One summary from the ranks' parts ({rank, summary, clock, stopped_by}), in rank order."""
    docs = [p["summary"] for p in parts]
    clocks = [p["clock"] for p in parts]
    starts = [c["start_unix_s"] for c in clocks if c["start_unix_s"] is not None]
    windows = [
        (c["start_unix_s"], c["start_unix_s"] + d["duration_s"])
        for c, d in zip(clocks, docs)
        if c["start_unix_s"] is not None
    ]
    duration_s = union_s(windows)
    out = {k: v for k, v in docs[0].items() if k not in RANK_ONLY}
    for key in SUMMED:
        out[key] = sum(d[key] for d in docs)
    errors: dict[str, int] = {}
    for d in docs:
        for kind, n in d["errors_by_kind"].items():
            errors[kind] = errors.get(kind, 0) + n
    completed = out["completed"]
    out.update(
        errors_by_kind=errors,
        window_closed=any(d["window_closed"] for d in docs),
        duration_s=round(duration_s, 4),
        request_throughput=_per_s(completed, duration_s),
        output_throughput=_per_s(out["total_output_tokens"], duration_s),
        total_token_throughput=_per_s(out["total_input_tokens"] + out["total_output_tokens"], duration_s),
        achieved_rate=_rate([c["sent"] for c in clocks]),
        schedule_rate=_rate([c["scheduled"] for c in clocks]),
    )
    # The run's end as the first rank that ended it saw it; the ranks it stopped say so in their own sections.
    origins = [p for p in parts if p["summary"]["aborted"] and not p.get("stopped_by")] or [
        p for p in parts if p["summary"]["aborted"]
    ]
    out["aborted"] = f"rank {origins[0]['rank']}: {origins[0]['summary']['aborted']}" if origins else None
    hists = {}
    for key in LATENCIES:
        hist = merged_histogram(d["histograms"][key] for d in docs)
        figures = hist.summary_ms(tuple(percentiles))
        n = sum(d[key]["count"] for d in docs)
        figures["mean"] = round(sum(d[key]["mean"] * d[key]["count"] for d in docs) / n, 4) if n else 0.0
        out[key] = figures
        hists[key] = hist.encode()
    out["histograms"] = hists
    target = sum(c["target_prompt_tokens"] for c in clocks)
    if target:
        out["prompt_tokens_vs_target_mean"] = round(sum(c["prompt_tokens"] for c in clocks) / target, 4)
    if slo:
        good = sum(d["goodput"]["good_requests"] for d in docs)
        sent_or_not = completed + out["failed"]
        out["goodput"] = {
            "slo": slo,
            "good_requests": good,
            "request_goodput": _per_s(good, duration_s),
            "good_fraction": round(good / sent_or_not, 4) if sent_or_not else 0.0,
        }
    out["run_failed"] = run_failure(completed, errors)
    out["window"] = {
        "start_unix_s": min(starts, default=None),
        "end_unix_s": max((e for _, e in windows), default=None),
    }
    out["ranks"] = [
        {
            "rank": p["rank"],
            "sessions": d.get("sessions"),
            "stopped_by": p.get("stopped_by"),
            "window": {"start_unix_s": c["start_unix_s"], "end_unix_s": (c["start_unix_s"] or 0.0) + d["duration_s"]},
            **{k: v for k, v in d.items() if k not in ("histograms", *RANK_ONLY)},
        }
        for p, d, c in zip(parts, docs, clocks)
    ]
    return out
