"""When a block-hash trace's requests are sent: the two timings of `--trace-timing`, and the order each gives on an
ideal server (what `kvtier plan --trace` models).

- ``timestamps``: open loop, each request at its own time from the trace (divided by --trace-speedup).
- ``think``: closed loop, for a trace whose calls carry sessions (TraceRequest.session: Weka's conversations and
  sub-agents). A call starts its pause (``delay_s``: the file's think time) after the request it follows ended,
  and not before the sub-agents it joins have ended; so a slower server stretches the session as a real agent's
  would. A request without a session keeps its own time. Each pause is capped at ``max_idle_s``: a pause of many
  minutes in an agent's trace is a person away from the keyboard, not the agent thinking, and replayed whole it
  stretches a run by hours (trace_0291.json of callanjfox/kv-cache-tester pauses 528 s). The default cap, 60 s, is
  the delay past which AIPerf 0.13 warns that a replay will sit idle (ai-dynamo/aiperf,
  src/aiperf/dataset/loader/_delay_cap.py, UNCAPPED_DELAY_WARN_MS).

On an ideal server each call takes as long as it took when recorded (``api_s``; 0 where the trace has none), so
`ideal_starts` reproduces the trace's own times, give or take the capped pauses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from .block_traces import BlockTrace, TraceRequest

__all__ = ["DEFAULT_MAX_IDLE_S", "TIMINGS", "has_sessions", "ideal_starts", "in_timing_order", "pause_s"]

TIMINGS = ("timestamps", "think")
DEFAULT_MAX_IDLE_S = 60.0


def has_sessions(trace: BlockTrace) -> bool:
    return any(r.session >= 0 for r in trace.requests)


def pause_s(req: TraceRequest, max_idle_s: float | None) -> float:
    """The pause before `req` once its predecessor ended, capped."""
    return req.delay_s if max_idle_s is None else min(req.delay_s, max_idle_s)


def ideal_starts(
    requests: Sequence[TraceRequest], max_idle_s: float | None = DEFAULT_MAX_IDLE_S, *, with_api: bool = True
) -> list[float]:
    """Each request's start under the think timing on a server that takes each call's recorded `api_s` (without
    `with_api`: no time at all, the earliest any server could start it). Links point to earlier requests only (the
    readers keep it so), so one pass in trace order suffices."""
    starts: list[float] = []
    ends: list[float] = []
    for r in requests:
        if r.session < 0:
            start = r.arrival_s
        else:
            start = (ends[r.after] if r.after >= 0 else 0.0) + pause_s(r, max_idle_s)
            for j in r.joins:
                start = max(start, ends[j])
        starts.append(start)
        ends.append(start + ((r.api_s or 0.0) if with_api else 0.0))
    return starts


def in_timing_order(trace: BlockTrace, timing: str, max_idle_s: float | None = DEFAULT_MAX_IDLE_S) -> BlockTrace:
    """The trace as `timing` sends it on an ideal server: its requests at their start times, in that order (equal
    starts keep the trace's order). ``timestamps`` is the trace as read."""
    if timing == "timestamps":
        return trace
    starts = ideal_starts(trace.requests, max_idle_s)
    order = sorted(range(len(starts)), key=lambda i: (starts[i], i))
    index = {old: new for new, old in enumerate(order)}
    requests = tuple(
        replace(
            trace.requests[i],
            arrival_s=starts[i],
            after=index.get(trace.requests[i].after, -1),
            joins=tuple(index[j] for j in trace.requests[i].joins),
        )
        for i in order
    )
    return replace(trace, requests=requests)
