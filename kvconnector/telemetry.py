"""Per-tier, per-operation measurements: mergeable histograms of total, host and device time, bytes and counters."""

from __future__ import annotations

import threading
from collections import Counter

from .histogram import LatencyHistogram
from .timed_io import OpTiming


class OpStats:
    """One operation (read or write) on one tier."""

    __slots__ = ("_lock", "device", "host", "nbytes", "ops", "total")

    def __init__(self) -> None:
        self.total = LatencyHistogram()
        self.host = LatencyHistogram()
        self.device = LatencyHistogram()
        self.ops = 0
        self.nbytes = 0
        self._lock = threading.Lock()

    def record(self, t: OpTiming) -> None:
        self.total.record_ns(t.total_ns)
        self.host.record_ns(t.host_ns)
        self.device.record_ns(t.device_ns)
        with self._lock:
            self.ops += 1
            self.nbytes += t.nbytes

    def merge(self, other: OpStats) -> None:
        self.total.merge(other.total)
        self.host.merge(other.host)
        self.device.merge(other.device)
        self.ops += other.ops
        self.nbytes += other.nbytes

    def to_dict(self) -> dict:
        return {
            "ops": self.ops,
            "bytes": self.nbytes,
            "latency_ms": self.total.summary_ms(),
            "host_ms": self.host.summary_ms(),
            "device_ms": self.device.summary_ms(),
            "histograms": {"total": self.total.encode(), "host": self.host.encode(), "device": self.device.encode()},
        }

    @classmethod
    def from_dict(cls, d: dict) -> OpStats:
        s = cls()
        s.ops, s.nbytes = d["ops"], d["bytes"]
        s.total = LatencyHistogram.decode(d["histograms"]["total"])
        s.host = LatencyHistogram.decode(d["histograms"]["host"])
        s.device = LatencyHistogram.decode(d["histograms"]["device"])
        return s


class TierStats:
    """Reads, writes and events (hits, demotions, evictions, errors) of one tier."""

    __slots__ = ("_lock", "events", "name", "read", "write")

    def __init__(self, name: str) -> None:
        self.name = name
        self.read = OpStats()
        self.write = OpStats()
        self.events: Counter[str] = Counter()
        self._lock = threading.Lock()

    def count(self, event: str, n: int = 1) -> None:
        with self._lock:
            self.events[event] += n

    def merge(self, other: TierStats) -> None:
        self.read.merge(other.read)
        self.write.merge(other.write)
        self.events.update(other.events)

    def to_dict(self) -> dict:
        return {"read": self.read.to_dict(), "write": self.write.to_dict(), "events": dict(sorted(self.events.items()))}

    @classmethod
    def from_dict(cls, name: str, d: dict) -> TierStats:
        s = cls(name)
        s.read, s.write = OpStats.from_dict(d["read"]), OpStats.from_dict(d["write"])
        s.events.update(d["events"])
        return s
