"""Mergeable latency histograms: percentiles without keeping raw samples.

An HDR histogram with 3 significant digits (0.1% relative error) records any duration from 1 ns to one hour in
fixed memory. Histograms from threads, tiers or client processes are merged by adding counts, so a merged p99 is the
p99 of the pooled samples (never an average or max of per-part percentiles).
"""

from __future__ import annotations

import threading
from functools import lru_cache

import numpy as np
from hdrh.histogram import HdrHistogram

_LOWEST_NS = 1
_HIGHEST_NS = 3_600 * 1_000_000_000
_DIGITS = 3

PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9)


@lru_cache(maxsize=1)
def _bucket_values() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Lowest, highest and median value each counts index stands for (the same for every histogram here). hdrh
    computes percentiles and means by walking every index in Python; with these, numpy does it in microseconds."""
    h = HdrHistogram(_LOWEST_NS, _HIGHEST_NS, _DIGITS)
    low = np.array([h.get_value_from_index(i) for i in range(h.counts_len)], dtype=np.float64)
    high = np.array([h.get_highest_equivalent_value(int(v)) for v in low], dtype=np.float64)
    return low, high, (low + high + 1) / 2


class LatencyHistogram:
    """Thread-safe histogram of durations in nanoseconds."""

    __slots__ = ("_h", "_lock")

    def __init__(self) -> None:
        self._h = HdrHistogram(_LOWEST_NS, _HIGHEST_NS, _DIGITS)
        self._lock = threading.Lock()

    def record_ns(self, value_ns: int, count: int = 1) -> None:
        # Clamp rather than drop: a zero-length or over-an-hour op is still an op.
        value_ns = min(max(int(value_ns), _LOWEST_NS), _HIGHEST_NS)
        with self._lock:
            self._h.record_value(value_ns, count)

    @property
    def count(self) -> int:
        return self._h.get_total_count()

    def merge(self, other: LatencyHistogram) -> None:
        with self._lock:
            self._h.add(other._h)

    def _counts(self) -> np.ndarray:
        return np.ctypeslib.as_array(self._h.counts)

    def percentile_ms(self, pct: float) -> float:
        """The value at `pct` (the highest value equivalent to its bucket, as HdrHistogram reports it)."""
        if self.count == 0:
            return 0.0
        low, high, _ = _bucket_values()
        target = self._h.get_target_count_at_percentile(pct)
        idx = int(np.searchsorted(np.cumsum(self._counts()), target))
        return float(high[idx] if pct else low[idx]) / 1e6

    def mean_ms(self) -> float:
        if self.count == 0:
            return 0.0
        _, _, mid = _bucket_values()
        return float(np.dot(self._counts().astype(np.float64), mid) / self.count) / 1e6

    def cumulative_counts(self, bounds_ns) -> list[int]:
        """How many values fall at or below each bound (Prometheus `le` buckets); a bucket counts once its highest
        equivalent value is within the bound."""
        _, high, _ = _bucket_values()
        with self._lock:
            cum = np.cumsum(self._counts())
        idx = np.searchsorted(high, np.asarray(bounds_ns, dtype=np.float64), side="right")
        return [int(cum[i - 1]) if i else 0 for i in idx]

    @property
    def max_ns(self) -> int:
        return self._h.get_max_value() if self.count else 0

    def max_ms(self) -> float:
        return self.max_ns / 1e6

    def recorded_buckets(self) -> tuple[np.ndarray, np.ndarray]:
        """(highest value in ns, count) of each bucket that holds values, in value order: what hdrh's
        get_recorded_iterator() yields, found with numpy instead of a Python walk over every bucket (~0.1 s)."""
        _, high, _ = _bucket_values()
        with self._lock:
            counts = self._counts().copy()
        idx = np.flatnonzero(counts)
        return high[idx], counts[idx]

    def summary_ms(self, percentiles: tuple[float, ...] = PERCENTILES) -> dict[str, float]:
        """mean, p50, ..., max in milliseconds, keyed like `p99` / `p999` (the naming the MLPerf and vLLM benches
        use)."""
        out = {"count": self.count, "mean": round(self.mean_ms(), 4)}
        for pct in percentiles:
            out[_pct_key(pct)] = round(self.percentile_ms(pct), 4)
        out["max"] = round(self.max_ms(), 4)
        return out

    def encode(self) -> str:
        """The HDR histogram's standard compressed base64 form; `decode` restores it for merging."""
        with self._lock:
            return self._h.encode().decode("ascii")

    @classmethod
    def decode(cls, text: str) -> LatencyHistogram:
        hist = cls()
        if text:
            hist._h.add(HdrHistogram.decode(text.encode("ascii")))
        return hist


def _pct_key(pct: float) -> str:
    """50 -> p50, 99.9 -> p999, 99.99 -> p9999."""
    return "p" + f"{pct:g}".replace(".", "")
