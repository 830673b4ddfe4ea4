"""Arrival schedules, computed up front: offsets in ns from the run start, slept to as absolute deadlines.

- constant: one request every 1/rate s.
- poisson: exponential gaps of mean 1/rate (gamma with shape 1).
- gamma: gaps drawn from Gamma(shape=burstiness, scale=1/(rate*burstiness)): the mean rate is kept, burstiness < 1 is
  burstier than Poisson, > 1 smoother (the convention of vLLM's bench).
- trace: the trace's own timestamps (seconds from its start) divided by a speed-up factor.
A rate of 0 or inf means "everything at once" (offset 0). The same seed gives the same schedule.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["arrival_offsets_ns", "trace_offsets_ns"]


def arrival_offsets_ns(
    n: int, rate: float, kind: str = "poisson", burstiness: float = 1.0, seed: int = 0, duration_s: float | None = None
) -> list[int]:
    """Offsets of n arrivals at `rate` per second; with duration_s, only those before it."""
    if n <= 0:
        return []
    if rate <= 0 or math.isinf(rate):
        return [0] * n
    rng = np.random.default_rng(seed)
    if kind == "constant":
        gaps = np.full(n, 1.0 / rate)
    elif kind == "poisson":
        gaps = rng.exponential(1.0 / rate, size=n)
    elif kind == "gamma":
        if burstiness <= 0:
            raise ValueError(f"burstiness must be > 0, got {burstiness}")
        gaps = rng.gamma(burstiness, 1.0 / (rate * burstiness), size=n)
    else:
        raise ValueError(f"unknown arrival process {kind!r} (constant, poisson, gamma)")
    gaps[0] = 0.0  # the first request goes at the start
    offsets = np.cumsum(gaps)
    out = [int(round(x * 1e9)) for x in offsets]
    if duration_s is not None:
        limit = int(duration_s * 1e9)
        out = [o for o in out if o < limit]
    return out


def trace_offsets_ns(timestamps_s: list[float], speedup: float = 1.0, duration_s: float | None = None) -> list[int]:
    """Trace timestamps -> offsets from the first one, divided by `speedup` (2 = twice as fast)."""
    if speedup <= 0:
        raise ValueError(f"trace speed-up must be > 0, got {speedup}")
    if not timestamps_s:
        return []
    t0 = min(timestamps_s)
    out = [int(round((t - t0) / speedup * 1e9)) for t in timestamps_s]
    if duration_s is not None:
        limit = int(duration_s * 1e9)
        out = [o if o < limit else -1 for o in out]
    return out
