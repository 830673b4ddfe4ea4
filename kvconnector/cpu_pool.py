"""Host-memory buffers for the CPU tier, reused by size class, so that storing an entry is a copy, not an allocation.

Fresh anonymous memory costs a page fault per 4 KiB (about 2 GB/s on the development VM, a fraction of what a copy
into memory already mapped reaches); LMCache keeps a pinned pool for the same reason. A buffer is mapped once, then
goes back to its size class when its entry is deleted and is handed to the next entry of that class.

Size classes: a page multiple up to 64 KiB is its own class; above that, eight classes per doubling (sizes rounded up
to 1/8 of the power of two below them, so at most 12.5% larger than asked). An entry takes the free buffer of its
class, or else the best-fitting free one up to twice its class (fewest pages to fault in, then least slack).
Buffers of 1 MiB and more are mapped with 50% headroom, so that whole-request entries, whose sizes vary from one to
the next, can reuse each other's buffers. Class rounding and headroom are address space only: a buffer's pages are
faulted in as far as its holder's length (`MADV_POPULATE_WRITE`), and only pages faulted in count. A buffer reused by
a shorter entry keeps the longer one's pages resident past the new length: that slack is real memory, counts in
full, and is released when room is needed and the free buffers have given theirs.

Invariants (all state under the pool's lock):
- `resident_bytes` (every page the pool has faulted in and not released, in buffers in use or free, plus the
  `extra_bytes` callers charge for memory they keep beside a buffer) never exceeds `limit_bytes`. Room for a new or
  longer buffer is made first from free buffers (least recently freed first; a buffer gives up only as many of its
  last pages as are needed, and is dropped once it has none), then from the slack of buffers in use (the pages past
  their holder's length, which the holder never touches). If that is still not enough, acquire
  waits for a release: the store gives bytes back to its count just before it deletes the entry that held them, so a
  put may briefly run ahead of the delete that makes its room. A wait is counted (`pool_waits`); one longer than
  `wait_s` fails with StorageFullError rather than exceed the limit.
- A buffer in use belongs to its holder until release(): the pool touches only its slack, never the first `length`
  bytes, and the holder must not touch the buffer after release().
- Released memory is returned with MADV_DONTNEED before the pool forgets the buffer, so it leaves the process's
  resident set at once even if a stale memoryview of the mapping is still alive somewhere.
Counters (`pool_maps`, `pool_reuses`, `pool_released`, `pool_trims`, `pool_waits`, `pool_populate_fallbacks`) go to
the Counter given at construction (the tier's, reported with its events).
"""

from __future__ import annotations

import errno
import mmap
import threading
from collections import Counter, OrderedDict
from dataclasses import dataclass
from time import monotonic

import numpy as np

from .errors import StorageFullError
from .timed_io import MADV_POPULATE_WRITE, PAGE

_EXACT_CLASS_LIMIT = 16 * PAGE
_HEADROOM_FROM = 1 << 20


def size_class(nbytes: int) -> int:
    """The buffer size that holds `nbytes` (a positive page multiple)."""
    if nbytes <= _EXACT_CLASS_LIMIT:
        return nbytes
    step = 1 << (nbytes.bit_length() - 4)
    return -(-nbytes // step) * step


@dataclass(eq=False, slots=True)
class PoolBuffer:
    """One mapping of `size` bytes; `resident` bytes from its start are faulted in and counted; `length` is the
    holder's (0 while free). `arr` is the whole mapping as a uint8 array; `held` is arr[:length], the holder's bytes
    (kept across holders of one length, so the steady state builds no array per entry)."""

    mm: mmap.mmap
    arr: np.ndarray
    size: int
    resident: int = 0
    length: int = 0
    held: np.ndarray | None = None

    def data(self) -> memoryview:
        """The holder's bytes, page-aligned."""
        return memoryview(self.mm)[: self.length]


class BufferPool:
    def __init__(self, limit_bytes: int, counters: Counter | None = None, wait_s: float = 30.0) -> None:
        self.limit_bytes = int(limit_bytes)
        self.counters: Counter[str] = counters if counters is not None else Counter()
        self.wait_s = wait_s
        self.resident_bytes = 0  # faulted-in pages of every buffer held + extra bytes charged
        self.in_use_bytes = 0  # lengths of buffers in use + extra bytes charged
        self.peak_resident_bytes = 0
        self._lock = threading.Lock()
        self._released = threading.Condition(self._lock)
        self._free: dict[int, list[PoolBuffer]] = {}
        self._free_order: OrderedDict[PoolBuffer, None] = OrderedDict()  # least recently freed first
        self._slack: dict[PoolBuffer, None] = {}  # in use, with pages resident past their length
        self._populate = True
        self._waiters = 0
        self._held: dict[PoolBuffer, None] = {}  # every buffer mapped and not yet released, in use or free

    # ---- acquire / release ---------------------------------------------------------------------------------------
    def acquire(self, nbytes: int, extra_bytes: int = 0) -> PoolBuffer | None:
        """A buffer of at least `nbytes` (a page multiple; 0 gives None) with its first `nbytes` faulted in, and
        `extra_bytes` charged besides (memory the caller keeps elsewhere for this holder, returned by release)."""
        if nbytes % PAGE or nbytes < 0 or extra_bytes < 0:
            raise ValueError(f"acquire({nbytes}, {extra_bytes}): nbytes must be a non-negative page multiple")
        size = size_class(nbytes) if nbytes else 0
        with self._lock:
            # The steady state of a tier of one entry size: the last buffer freed in this class fits exactly.
            free = self._free.get(size)
            if free and free[-1].resident == nbytes and self.resident_bytes + extra_bytes <= self.limit_bytes:
                buf = free.pop()
                if not free:
                    del self._free[size]
                del self._free_order[buf]
                buf.length = nbytes
                if buf.held is None or len(buf.held) != nbytes:
                    buf.held = buf.arr[:nbytes]
                self.resident_bytes += extra_bytes
                self.in_use_bytes += nbytes + extra_bytes
                self.peak_resident_bytes = max(self.peak_resident_bytes, self.resident_bytes)
                self.counters["pool_reuses"] += 1
                return buf
        deadline = None
        with self._lock:
            while True:
                buf = self._pick(nbytes, size) if size else None
                grow = max(nbytes - buf.resident, 0) if buf is not None else nbytes
                if self._make_room(grow + extra_bytes, keep=buf, keep_len=nbytes):
                    break
                if deadline is None:
                    deadline = monotonic() + self.wait_s
                    self.counters["pool_waits"] += 1
                left = deadline - monotonic()
                if left <= 0:
                    raise StorageFullError(
                        errno.ENOMEM,
                        f"CPU tier: {nbytes + extra_bytes} bytes do not fit in {self.limit_bytes} "
                        f"({self.in_use_bytes} in use) after {self.wait_s:g} s",
                    )
                self._waiters += 1
                try:
                    self._released.wait(left)
                finally:
                    self._waiters -= 1
            self.resident_bytes += grow + extra_bytes
            self.in_use_bytes += nbytes + extra_bytes
            self.peak_resident_bytes = max(self.peak_resident_bytes, self.resident_bytes)
            if buf is None:
                if not size:
                    return None
                self.counters["pool_maps"] += 1
                populate_from = 0
            else:
                free = self._free[buf.size]
                free.pop()  # _pick takes the last of a class
                if not free:
                    del self._free[buf.size]
                del self._free_order[buf]
                self.counters["pool_reuses"] += 1
                populate_from = buf.resident if grow else nbytes
                buf.resident = max(buf.resident, nbytes)
                buf.length = nbytes
                buf.held = buf.arr[:nbytes]
                if buf.resident > nbytes:
                    self._slack[buf] = None
        # Outside the lock: the counted pages are ours; mapping and faulting them in takes time.
        if buf is None:
            # Large buffers are mapped with headroom: address space only (pages past `nbytes` are not faulted in),
            # so a later, longer entry can reuse the buffer by faulting in just the difference.
            if nbytes >= _HEADROOM_FROM:
                size = size_class(nbytes + nbytes // 2)
            mm = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            arr = np.frombuffer(mm, dtype=np.uint8)
            buf = PoolBuffer(mm, arr, size, nbytes, nbytes, arr[:nbytes])
            with self._lock:
                self._held[buf] = None
        if populate_from < nbytes:
            self._fault_in(buf, populate_from, nbytes)
        return buf

    def release(self, buf: PoolBuffer | None, extra_bytes: int = 0) -> None:
        """Give a buffer (and the extra bytes charged with it) back; the buffer goes to its size class's free list."""
        with self._lock:
            self.in_use_bytes -= extra_bytes
            self.resident_bytes -= extra_bytes
            if buf is not None:
                self.in_use_bytes -= buf.length
                buf.length = 0
                self._slack.pop(buf, None)
                self._free.setdefault(buf.size, []).append(buf)
                self._free_order[buf] = None
            if self._waiters:
                self._released.notify_all()

    def close(self) -> None:
        """Release every free buffer; buffers still in use are forgotten (their holders drop them)."""
        with self._lock:
            while self._free_order:
                self._drop_free(next(iter(self._free_order)))
            self._slack.clear()
            self._held.clear()

    def buffers(self) -> list[PoolBuffer]:
        """Every buffer the pool holds (in use or free), for inspection: their `resident` bytes plus the extra bytes
        charged make up `resident_bytes`."""
        with self._lock:
            return list(self._held)

    def describe(self) -> dict:
        with self._lock:
            return {
                "pool_resident_bytes": self.resident_bytes,
                "pool_in_use_bytes": self.in_use_bytes,
                "pool_free_buffers": len(self._free_order),
                "pool_peak_resident_bytes": self.peak_resident_bytes,
            }

    # ---- under the lock --------------------------------------------------------------------------------------------
    def _pick(self, nbytes: int, size: int) -> PoolBuffer | None:
        """The free buffer to reuse for `nbytes`: one at least that large and at most twice its size class, with the
        fewest pages to fault in, then the least slack. Caller holds the lock."""
        best, best_cost = None, None
        for cls, free in self._free.items():
            if nbytes <= cls <= 2 * size:
                b = free[-1]  # the most recently freed of its class
                cost = (max(nbytes - b.resident, 0), abs(b.resident - nbytes))
                if best_cost is None or cost < best_cost:
                    best, best_cost = b, cost
                    if cost == (0, 0):
                        break
        return best

    def _make_room(self, need: int, keep: PoolBuffer | None, keep_len: int = 0) -> bool:
        """Release free buffers (not `keep`), then slack, then `keep`'s pages past `keep_len` (the buffer being
        reused holds more than the new entry needs), until `need` more bytes fit. Caller holds the lock."""
        while self.resident_bytes + need > self.limit_bytes:
            # Only as many pages as the shortfall: the rest stay faulted in for the next entry.
            cut = -(-(self.resident_bytes + need - self.limit_bytes) // PAGE) * PAGE
            victim = next((b for b in self._free_order if b is not keep), None)
            if victim is not None:
                if cut >= victim.resident:
                    self._drop_free(victim)
                else:
                    self._trim(victim, cut)
            elif self._slack:
                b, _ = self._slack.popitem()
                self._trim(b, b.resident - b.length)
            elif keep is not None and keep.resident > keep_len:
                self._trim(keep, min(cut, keep.resident - keep_len))
            else:
                return False
        return True

    def _trim(self, buf: PoolBuffer, cut: int) -> None:
        """Give the last `cut` bytes of `buf`'s faulted-in pages back to the kernel. Caller holds the lock."""
        self._advise(buf.mm, buf.resident - cut, cut, mmap.MADV_DONTNEED)
        buf.resident -= cut
        self.resident_bytes -= cut
        self.counters["pool_trims"] += 1

    def _drop_free(self, buf: PoolBuffer) -> None:
        del self._free_order[buf]
        free = self._free[buf.size]
        free.remove(buf)
        if not free:
            del self._free[buf.size]
        self._held.pop(buf, None)
        if buf.resident:
            self._advise(buf.mm, 0, buf.resident, mmap.MADV_DONTNEED)
        self.resident_bytes -= buf.resident
        buf.resident = 0
        self.counters["pool_released"] += 1
        # Unmapped when the last reference goes (its uint8 array, a stale view); its pages are already returned.

    @staticmethod
    def _advise(mm: mmap.mmap, start: int, length: int, advice: int) -> None:
        if length > 0:
            mm.madvise(advice, start, length)

    def _fault_in(self, buf: PoolBuffer, start: int, end: int) -> None:
        if not self._populate:
            return
        try:
            buf.mm.madvise(MADV_POPULATE_WRITE, start, end - start)
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.ENOSYS):
                raise
            # Kernel before 5.14: the first copy faults the pages in, one by one. Counted, not silent.
            self._populate = False
            self.counters["pool_populate_fallbacks"] += 1
