"""The no-op tier of the trace-only mode (`kvtier bench --io-trace-log FILE`), the MLPerf reference's NullBackend
(kv_cache_benchmark/kv_cache/backends.py at hazemawadalla/storage a56caea).

A NullTier stands in for a GPU, CPU or disk tier with the same name, kind and capacity: the store's decisions (which
tier, what to demote, what to evict) are those of a real run, every operation is reported to the store's op
listener with its size, and no byte is copied, stored or written. A read returns in zero time without touching
`dest`. Timings are zero, so the run's latencies say nothing about a device: the trace is for replaying elsewhere.
A no-op CPU tier hands a demotion the entry's bytes "in place" (`view`) where the real CPU tier does, for an entry of
whole pages (so the move logs a write and no read, as in a real run): a window of one anonymous mapping that nobody
writes or reads, whose pages are never faulted in. An entry that ends in a partial page the real CPU tier keeps in two
pieces and has no view of, so a move out of it reads first: the no-op tier does the same. A no-op GPU or disk tier
has no view, as the real ones: a move out of it reads the entry into a buffer of the store's first (a read row, then
a write row: the reference's Evict pair).
"""

from __future__ import annotations

import mmap
import threading

from kvconnector.entry_format import PAGE
from kvconnector.tiers import Tier
from kvconnector.timed_io import OpTiming


class NullTier(Tier):
    def __init__(self, name: str, kind: str, capacity_bytes: int) -> None:
        super().__init__(name, capacity_bytes)
        self.kind = kind
        self._sizes: dict[str, int] = {}

    def write(self, key, chunks, nbytes, shape=(), dtype="uint8"):
        self._sizes[key] = nbytes
        return OpTiming(nbytes=nbytes)

    def read(self, key, nbytes, dest=None):
        if key not in self._sizes:
            raise KeyError(key)  # as a real tier: the store never reads what it did not write
        return OpTiming(nbytes=nbytes)

    def view(self, key):
        nbytes = self._sizes.get(key)
        if nbytes is None or self.kind != "cpu" or nbytes % PAGE:  # as CPUTier.view: no view of a split entry
            return None
        return _untouched(nbytes)

    def delete(self, key):
        self._sizes.pop(key, None)

    def describe(self):
        return {**super().describe(), "no_op": True}

    def close(self):
        self._sizes.clear()


_lock = threading.Lock()
_region: mmap.mmap | None = None


def _untouched(nbytes: int) -> memoryview:
    """`nbytes` of an anonymous mapping (grown as needed, shared by every NullTier, never touched)."""
    global _region
    with _lock:
        if _region is None or len(_region) < nbytes:
            _region = mmap.mmap(-1, max(nbytes, mmap.PAGESIZE))
        return memoryview(_region)[:nbytes]
