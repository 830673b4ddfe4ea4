"""The tiered store: a waterfall LRU over an ordered list of tiers (fastest first).

- A new entry goes to the fastest tier that can hold it; an entry larger than `large_entry_limit_ratio` of a tier
  skips that tier.
- Making room in a tier keeps it at or below `target_usage_ratio` of its capacity: the least recently used entry that
  nobody is reading is demoted to the next tier, which makes room for it the same way (recursively); the bottom tier
  deletes. An empty tier may take one entry up to `large_entry_limit_ratio` of its capacity.
- Space is reserved under the store's lock before any byte is written, so no tier ever exceeds its capacity; I/O runs
  outside the lock. An entry being read or moved is never chosen as a victim, so an eviction never breaks a read, and
  an entry is never demoted twice at once.
- With `promote_on_hit`, a hit in a lower tier moves the entry back to the top tier (what production engines do);
  off by default, which is the benchmark's no-promotion waterfall.
- A move that fails leaves the store as if the entry had been evicted: the destination's reservation is returned,
  whatever the destination wrote is removed, the entry is dropped from its source (counted as `move_failed`). A failed
  promotion only leaves the entry where it was (`promote_failed`): the read that caused it has its bytes.
Demotion and promotion I/O is recorded in the statistics of the tier that performed it and added to the latency of
the operation that caused it.

The API's contract (errors.py): arguments are checked before anything is reserved or written. A key must be a str
that every tier of the store can hold (tiers writing an entry header: at most `max_key_bytes` in UTF-8, no lone
surrogate), so a key one tier cannot hold never enters the store, where it would fail only later, when an eviction
pushes it down; chunks and destinations must be byte buffers (bytes, bytearray, memoryview, numpy arrays; read as
their raw bytes), a destination at least the entry's size. A refusal is `InvalidArgumentError`. An empty entry (0
bytes) is a value like any other. After `close()` (which waits for the operations in flight, then closes the tiers;
a second call does nothing) every operation raises `StoreClosedError`; `usage()`, `stats` and `events` still read the
figures as they were.
"""

from __future__ import annotations

import math
import numbers
import threading
import weakref
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .entry_format import check_header_fields, check_key, show_key
from .errors import (
    ConfigError,
    CorruptEntryError,
    EntryNotFound,
    InvalidArgumentError,
    StorageFullError,
    StoreClosedError,
)
from .telemetry import TierStats
from .tiers import Tier
from .timed_io import OpTiming, aligned_buffer


@dataclass(slots=True)
class _Entry:
    key: str
    nbytes: int
    tier: int
    shape: tuple = ()
    dtype: str = "uint8"
    readers: int = 0
    pins: int = 0
    moving: bool = False


@dataclass(slots=True)
class PutResult:
    stored: bool
    tier: str | None
    timing: OpTiming = field(default_factory=OpTiming)
    reason: str = ""


@dataclass(slots=True)
class GetResult:
    hit: bool
    tier: str | None
    timing: OpTiming = field(default_factory=OpTiming)


class TieredStore:
    def __init__(
        self,
        tiers: list[Tier],
        *,
        target_usage_ratio: float = 0.8,
        large_entry_limit_ratio: float = 0.95,
        promote_on_hit: bool = False,
    ) -> None:
        tiers = list(tiers)
        if not tiers:
            raise ConfigError("the store needs at least one tier with capacity > 0")
        for t in tiers:
            if not isinstance(t, Tier):
                raise ConfigError(f"the store's tiers must be Tier objects, not {type(t).__name__}")
        names = [t.name for t in tiers]
        for i, t in enumerate(tiers):
            if any(t is u for u in tiers[:i]):
                raise ConfigError(f"tier {t.name!r} is given twice: each tier object is one level of the store")
            if t.name in names[:i]:
                raise ConfigError(f"two tiers are named {t.name!r}: the store reports its tiers by name")
            owner = t._store() if t._store is not None else None
            if owner is not None and not owner.closed:
                raise ConfigError(f"tier {t.name!r} already belongs to another store that is not closed")
        ratios = {"target_usage_ratio": target_usage_ratio, "large_entry_limit_ratio": large_entry_limit_ratio}
        for what, v in ratios.items():
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or not 0 < v <= 1:
                raise ConfigError(f"{what} must be a number in (0, 1], not {v!r}")
        self.tiers = tiers
        self.target_usage_ratio = target_usage_ratio
        self.large_entry_limit_ratio = large_entry_limit_ratio
        self.promote_on_hit = promote_on_hit
        self.stats = [TierStats(t.name) for t in self.tiers]
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._entries: dict[str, _Entry] = {}
        self._pending: set[str] = set()
        self._lru: list[OrderedDict[str, _Entry]] = [OrderedDict() for _ in self.tiers]
        self._used = [0] * len(self.tiers)
        # Store-wide events (hits, misses, rejected puts); per-tier ones live in `stats`.
        self.events: Counter[str] = Counter()
        # Called after every tier operation as (op, tier, key, nbytes, timing or None, phase), phase one of
        # put/get/demote/promote/evict; runs on the I/O thread, so it must be cheap (e.g. an I/O trace writer).
        self.op_listener = None
        # Called as (key, present) whenever a key enters (True) or leaves (False) the index, under the store's lock,
        # so the calls come in the index's own order (set with `watch_keys`). It must be cheap and must not block.
        self.key_listener = None
        # The strictest key limit of the tiers (None: memory tiers only, any str).
        limits = [t.max_key_bytes for t in self.tiers if t.max_key_bytes is not None]
        self.max_key_bytes = min(limits) if limits else None
        self._closed = False
        self._active = 0  # operations past their closed check that may still do I/O; close() waits for them
        for t in self.tiers:
            t._store = weakref.ref(self)

    # ---- the API's checks ----------------------------------------------------------------------------------------
    def _check_key(self, key: object) -> None:
        check_key(key, self.max_key_bytes)

    def _check_open(self) -> None:
        """Caller holds the lock."""
        if self._closed:
            raise StoreClosedError("the store is closed")

    def _leave(self) -> None:
        """An operation counted in `_active` is done. Caller holds the lock."""
        self._active -= 1
        if self._closed and not self._active:
            self._changed.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed

    # ---- queries -------------------------------------------------------------------------------------------------
    def contains(self, key: str) -> str | None:
        self._check_key(key)
        with self._lock:
            self._check_open()
            e = self._entries.get(key)
            return self.tiers[e.tier].name if e else None

    def usage(self) -> list[dict]:
        with self._lock:
            return [
                {
                    "tier": t.name,
                    "entries": len(self._lru[i]),
                    "used_bytes": self._used[i],
                    "capacity_bytes": t.capacity_bytes,
                }
                for i, t in enumerate(self.tiers)
            ]

    def keys_by_tier(self) -> dict[str, list[str]]:
        with self._lock:
            return {t.name: list(self._lru[i]) for i, t in enumerate(self.tiers)}

    def __len__(self) -> int:
        return len(self._entries)

    def watch_keys(self, listener) -> list[str]:
        """Set `key_listener` and return the keys held now, atomically: every later change reaches the listener,
        none before it does (what a consumer announcing the store's content needs: no key missed, none twice)."""
        with self._lock:
            self.key_listener = listener
            return list(self._entries)

    def _tell(self, key: str, present: bool) -> None:
        """Under the lock: a key entered or left the index. A failing listener is counted, never the store's error."""
        if self.key_listener is not None:
            try:
                self.key_listener(key, present)
            except Exception:
                self.events["key_listener_errors"] += 1

    def entry_info(self, key: str) -> tuple[int, tuple, str, str] | None:
        """(nbytes, shape, dtype, tier name) of a stored entry, or None."""
        self._check_key(key)
        with self._lock:
            self._check_open()
            e = self._entries.get(key)
            return (e.nbytes, e.shape, e.dtype, self.tiers[e.tier].name) if e else None

    def adopt(
        self, t: int, key: str, nbytes: int, shape: tuple = (), dtype: str = "uint8", make_room: bool = True
    ) -> bool:
        """Register an entry whose bytes are already in tier t (found by a rescan after a restart, or written to a
        shared tier by another instance). Room is made as for a put (LRU entries of tier t are demoted or deleted);
        False if the key is already known or the tier cannot take it, and the caller decides what to do with the
        bytes. Adopted entries become the most recently used ones, so adopt in oldest-first order. With
        make_room=False only free room is taken, nothing is evicted (a shared tier's entries are others' too)."""
        self._check_key(key)
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise InvalidArgumentError(f"adopt: nbytes must be an int >= 0, not {nbytes!r}")
        if not 0 <= t < len(self.tiers):
            raise InvalidArgumentError(f"adopt: tier index {t!r} is not one of the store's {len(self.tiers)} tiers")
        with self._lock:
            self._check_open()
            if key in self._entries or key in self._pending:
                return False
            self._pending.add(key)
            self._active += 1
        try:
            if nbytes > self.large_entry_limit_ratio * self.tiers[t].capacity_bytes:
                return False
            if make_room:
                if not self._reserve(t, nbytes, OpTiming()):
                    return False
            else:
                with self._lock:
                    if self._used[t] + nbytes > self._limit(t):
                        return False
                    self._used[t] += nbytes
            with self._lock:
                e = _Entry(key, nbytes, t, tuple(shape), dtype)
                self._entries[key] = e
                self._lru[t][key] = e
                self._tell(key, True)
            self.stats[t].count("adopted")
            return True
        finally:
            with self._lock:
                self._pending.discard(key)
                self._leave()

    # ---- put -------------------------------------------------------------------------------------------------------
    def put(self, key: str, chunks: list[memoryview], shape: tuple = (), dtype: str = "uint8") -> PutResult:
        """Store an entry (the concatenation of `chunks`: byte buffers, or one buffer alone) in the fastest tier that
        takes it. An existing key is left as it is (`stored=False`, reason "exists"); an entry no tier has room for
        is not stored (reason "no tier has room"). InvalidArgumentError for a key, chunk, shape or dtype the store
        cannot hold; StoreClosedError after close()."""
        self._check_key(key)
        chunks = byte_chunks(chunks)
        if self.max_key_bytes is not None:  # a tier writes them into an entry header
            check_header_fields(shape, dtype)
        nbytes = sum(len(c) for c in chunks)
        timing = OpTiming()
        with self._lock:
            self._check_open()
            if key in self._entries or key in self._pending:
                return PutResult(False, None, timing, "exists")
            self._pending.add(key)
            self._active += 1
        try:
            for t in range(len(self.tiers)):
                if nbytes > self.large_entry_limit_ratio * self.tiers[t].capacity_bytes:
                    self.stats[t].count("too_large_skipped")
                    continue
                if not self._reserve(t, nbytes, timing):
                    self.stats[t].count("full_skipped")
                    continue
                try:
                    w = self.tiers[t].write(key, chunks, nbytes, shape, dtype)
                except BaseException as exc:
                    with self._lock:
                        self._used[t] -= nbytes
                    self._discard_bytes(t, key)
                    self.stats[t].count("enospc" if isinstance(exc, StorageFullError) else "write_errors")
                    raise
                self._record(t, "write", key, w, "put")
                timing.add(w)
                with self._lock:
                    e = _Entry(key, nbytes, t, tuple(shape), dtype)
                    self._entries[key] = e
                    self._lru[t][key] = e
                    self._tell(key, True)
                return PutResult(True, self.tiers[t].name, timing)
            self._count("put_rejected")
            return PutResult(False, None, timing, "no tier has room")
        finally:
            with self._lock:
                self._pending.discard(key)
                self._leave()

    def _record(self, t: int, op: str, key: str, timing: OpTiming, phase: str) -> None:
        (self.stats[t].read if op == "read" else self.stats[t].write).record(timing)
        self._notify(t, op, key, timing.nbytes, timing, phase)

    def _notify(self, t: int, op: str, key: str, nbytes: int, timing: OpTiming | None, phase: str) -> None:
        if self.op_listener is not None:
            self.op_listener(op, self.tiers[t].name, key, nbytes, timing, phase)

    def _count(self, event: str) -> None:
        with self._lock:
            self.events[event] += 1

    def _limit(self, t: int) -> float:
        cap = self.tiers[t].capacity_bytes
        # An empty tier may take one large entry; otherwise keep the target headroom.
        return self.large_entry_limit_ratio * cap if self._used[t] == 0 else self.target_usage_ratio * cap

    def _reserve(self, t: int, nbytes: int, timing: OpTiming) -> bool:
        """Reserve `nbytes` in tier t, demoting or deleting LRU entries as needed. False if it cannot."""
        bottom = t == len(self.tiers) - 1
        while True:
            with self._lock:
                if self._used[t] + nbytes <= self._limit(t):
                    self._used[t] += nbytes
                    return True
                victim = next((e for e in self._lru[t].values() if not (e.readers or e.pins or e.moving)), None)
                if victim is None:
                    return False
                del self._lru[t][victim.key]
                if bottom:
                    del self._entries[victim.key]
                    self._tell(victim.key, False)
                    self._used[t] -= victim.nbytes
                    self._pending.add(victim.key)
                else:
                    victim.moving = True
            if bottom:
                self._delete_bytes(t, victim.key)
                self.stats[t].count("evictions")
                self._notify(t, "evict", victim.key, victim.nbytes, None, "evict")
                continue
            self._move(victim, t, t + 1, timing)

    def _move(self, e: _Entry, src: int, dst: int, timing: OpTiming) -> None:
        """Move a `moving` entry from tier src to dst; on any failure the entry is dropped (it is only a cache) and
        the error raised, unless the source was bad or gone."""
        fits = e.nbytes <= self.large_entry_limit_ratio * self.tiers[dst].capacity_bytes
        try:
            reserved = fits and self._reserve(dst, e.nbytes, timing)
        except BaseException:
            # Making room below failed (a deeper move's write): nothing reserved in dst, the entry leaves src.
            self._drop(e, src)
            self.stats[src].count("move_failed")
            raise
        if not reserved:
            self._drop(e, src)
            self.stats[src].count("evictions")
            return
        try:
            buf = self.tiers[src].view(e.key)
            if buf is None:  # not in host memory: read it out first
                buf = aligned_buffer(e.nbytes)[: e.nbytes]
                r = self.tiers[src].read(e.key, e.nbytes, buf)
                self._record(src, "read", e.key, r, "demote")
                timing.add(r)
            w = self.tiers[dst].write(e.key, [buf], e.nbytes, e.shape, e.dtype)
            self._record(dst, "write", e.key, w, "demote" if dst > src else "promote")
            timing.add(w)
        except BaseException as exc:
            with self._lock:
                self._used[dst] -= e.nbytes
            self._discard_bytes(dst, e.key)
            self._drop(e, src)
            self.stats[src].count("move_failed")
            if isinstance(exc, (CorruptEntryError, EntryNotFound)):
                return  # the source was bad or gone (a shared tier): nothing to move, the entry is dropped
            raise
        with self._lock:
            e.tier, e.moving = dst, False
            self._used[src] -= e.nbytes
            self._lru[dst][e.key] = e
            self._changed.notify_all()
        self.tiers[src].delete(e.key)
        self.stats[src].count("demotions_out" if dst > src else "promotions_out")
        self.stats[dst].count("demotions_in" if dst > src else "promotions_in")

    def _drop(self, e: _Entry, t: int) -> None:
        with self._lock:
            if self._entries.pop(e.key, None) is not None:
                self._tell(e.key, False)
            self._lru[t].pop(e.key, None)
            self._used[t] -= e.nbytes
            e.moving = False
            self._pending.add(e.key)
            self._changed.notify_all()
        self._delete_bytes(t, e.key)

    def _discard_bytes(self, t: int, key: str) -> None:
        """Remove what a failed write or move may have left in tier t, on the way out of that failure: a second error
        here is counted (`delete_errors`), not raised, so it cannot hide the first or skip the clean-up after it."""
        try:
            self.tiers[t].delete(key)
        except Exception:
            self.stats[t].count("delete_errors")

    def _delete_bytes(self, t: int, key: str) -> None:
        """Remove the bytes of an entry the index has just forgotten (the caller marked the key pending under the
        lock): until they are gone a put of the same key is refused, so it cannot write a file this removes."""
        try:
            self.tiers[t].delete(key)
        finally:
            with self._lock:
                self._pending.discard(key)

    # ---- get -------------------------------------------------------------------------------------------------------
    def get(self, key: str, dest: memoryview | None = None) -> GetResult:
        """Read an entry (into the first bytes of `dest`, a writable byte buffer at least the entry's size, or
        through scratch). A hit is counted only once the read has succeeded; a corrupt entry is dropped and counts as
        a miss. InvalidArgumentError for a key the store cannot hold or a `dest` that cannot take the entry (the entry
        stays); StoreClosedError after close()."""
        self._check_key(key)
        if dest is not None:
            dest = byte_view(dest, "dest", writable=True)
        with self._lock:
            self._check_open()
            e = self._entries.get(key)
            if e is not None and e.moving:
                self._changed.wait_for(lambda: not e.moving)
                self._check_open()  # closed while it waited
                e = self._entries.get(key)
            if e is None:
                self.events["misses"] += 1
                return GetResult(False, None)
            if dest is not None and len(dest) < e.nbytes:
                raise InvalidArgumentError(
                    f"dest holds {len(dest)} bytes, entry {show_key(key)} has {e.nbytes}: nothing was read"
                )
            e.readers += 1
            self._active += 1
            t = e.tier
            self._lru[t].move_to_end(key)
        try:
            return self._read(e, key, t, dest)
        finally:
            with self._lock:
                self._leave()

    def _read(self, e: _Entry, key: str, t: int, dest: memoryview | None) -> GetResult:
        """get() once the entry is counted as read (e.readers) in tier t."""
        if dest is not None and len(dest) != e.nbytes:
            dest = dest[: e.nbytes]
        promote = self.promote_on_hit and t > 0
        buf = dest if dest is not None or not promote else aligned_buffer(e.nbytes)[: e.nbytes]
        try:
            r = self.tiers[t].read(key, e.nbytes, buf)
        except BaseException as exc:
            self._release_reader(e)
            if not isinstance(exc, (CorruptEntryError, EntryNotFound)):
                raise
            # A corrupt entry, or one another instance removed from a shared tier: dropped, counted, a miss.
            self.stats[t].count("corrupt_dropped" if isinstance(exc, CorruptEntryError) else "vanished")
            self._remove(key)
            self._count("misses")
            return GetResult(False, None)
        self._record(t, "read", key, r, "get")
        self.stats[t].count("hits")
        result = GetResult(True, self.tiers[t].name, r)
        with self._lock:
            self.events["hits"] += 1
            e.readers -= 1
            if e.readers == 0:
                self._changed.notify_all()
            start_move = promote and e.readers == 0 and not e.pins and not e.moving and e.tier == t
            if start_move:
                e.moving = True
                del self._lru[t][key]
        if start_move:
            self._promote(e, t, buf, result.timing)
        return result

    def _promote(self, e: _Entry, src: int, data: memoryview, timing: OpTiming) -> None:
        """Write an entry just read from tier src into the top tier (making room there by waterfall). Should that
        fail, the entry stays in src (counted as `promote_failed`): the read that asked for it has its bytes."""
        reserved = False
        try:
            reserved = e.nbytes <= self.large_entry_limit_ratio * self.tiers[0].capacity_bytes and self._reserve(
                0, e.nbytes, timing
            )
            if reserved:
                w = self.tiers[0].write(e.key, [data], e.nbytes, e.shape, e.dtype)
        except BaseException as exc:
            if reserved:
                with self._lock:
                    self._used[0] -= e.nbytes
                self._discard_bytes(0, e.key)
                reserved = False
            self.stats[src].count("promote_failed")
            if not isinstance(exc, Exception):
                self._stay(e, src)
                raise
        if not reserved:
            self._stay(e, src)
            return
        self._record(0, "write", e.key, w, "promote")
        timing.add(w)
        with self._lock:
            e.tier, e.moving = 0, False
            self._used[src] -= e.nbytes
            self._lru[0][e.key] = e
            self._changed.notify_all()
        self.tiers[src].delete(e.key)
        self.stats[src].count("promotions_out")
        self.stats[0].count("promotions_in")

    def _stay(self, e: _Entry, src: int) -> None:
        """A promotion that did not happen: the entry is back in src's LRU, as the most recently used."""
        with self._lock:
            e.moving = False
            self._lru[src][e.key] = e
            self._changed.notify_all()

    def _release_reader(self, e: _Entry) -> None:
        with self._lock:
            e.readers -= 1
            if e.readers == 0:
                self._changed.notify_all()

    # ---- pins and removal ------------------------------------------------------------------------------------------
    def pin(self, key: str) -> bool:
        self._check_key(key)
        with self._lock:
            self._check_open()
            e = self._entries.get(key)
            if e is None:
                return False
            e.pins += 1
            return True

    def unpin(self, key: str) -> bool:
        self._check_key(key)
        with self._lock:
            self._check_open()
            e = self._entries.get(key)
            if e is None or e.pins == 0:
                return False
            e.pins -= 1
            return True

    def touch(self, keys: list[str]) -> list[bool]:
        """Make each key held here the most recently used of its tier's LRU, without I/O (LMCache 0.5.7's
        `submit_touch`); an entry being moved between tiers is in no LRU and stays so. Which keys are held."""
        keys = list(keys)
        for key in keys:
            self._check_key(key)
        held = []
        with self._lock:
            self._check_open()
            for key in keys:
                e = self._entries.get(key)
                held.append(e is not None)
                if e is not None and key in self._lru[e.tier]:
                    self._lru[e.tier].move_to_end(key)
        return held

    def delete(self, key: str) -> bool:
        """Remove an entry once nobody reads or moves it. False if the key is not here."""
        self._check_key(key)
        with self._lock:
            self._check_open()
            self._active += 1
        try:
            return self._remove(key)
        finally:
            with self._lock:
                self._leave()

    def _remove(self, key: str) -> bool:
        with self._lock:
            e = self._entries.get(key)
            if e is None:
                return False
            self._changed.wait_for(lambda: not (e.moving or e.readers))
            if self._entries.get(key) is not e:
                return False
            del self._entries[key]
            self._tell(key, False)
            self._lru[e.tier].pop(key, None)
            self._used[e.tier] -= e.nbytes
            self._pending.add(key)
            t = e.tier
        self._delete_bytes(t, key)
        return True

    def close(self) -> None:
        """Wait for the operations in flight, then close every tier (their memory, files and connections go). Any
        later operation raises StoreClosedError; a second close() does nothing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._changed.wait_for(lambda: not self._active)
        for tier in self.tiers:
            tier._store = None
            tier.close()

    def reset_stats(self) -> None:
        """Start the statistics afresh (after set-up I/O that a benchmark must not count); entries stay."""
        with self._lock:
            self.stats = [TierStats(t.name) for t in self.tiers]
            self.events.clear()


def byte_view(obj: object, what: str, writable: bool = False) -> memoryview:
    """`obj`'s raw bytes as a flat unsigned-byte memoryview (the same memory, no copy), or InvalidArgumentError: not a
    buffer (a torch tensor: pass `tensor.numpy()`), not contiguous, or read-only where the bytes are to be written."""
    mv = obj if type(obj) is memoryview else None
    if mv is None:
        try:
            mv = memoryview(obj)
        except TypeError:
            raise InvalidArgumentError(
                f"{what} must be a byte buffer (bytes, bytearray, memoryview, numpy array), not {type(obj).__name__}"
            ) from None
    if writable and mv.readonly:
        raise InvalidArgumentError(f"{what} is read-only ({type(obj).__name__}); a destination must be writable")
    if mv.format != "B" or mv.ndim != 1 or not mv.c_contiguous:
        if not mv.c_contiguous:
            raise InvalidArgumentError(f"{what} is not contiguous in memory")
        mv = mv.cast("B")
    return mv


def byte_chunks(chunks: object) -> Sequence[memoryview]:
    """put()'s chunks as flat byte views: a sequence of buffers (a list, a tuple, a lazy Sequence such as the
    benchmark's) or one buffer alone. The sequence itself when every item already is a flat byte memoryview (what
    every caller here passes), so the common put builds nothing."""
    if isinstance(chunks, (bytes, bytearray, memoryview, np.ndarray)):
        return [byte_view(chunks, "chunks")]
    if not isinstance(chunks, Sequence):
        if isinstance(chunks, (str, int, float)) or chunks is None:
            raise InvalidArgumentError(f"chunks must be a sequence of byte buffers, not {type(chunks).__name__}")
        return [byte_view(chunks, "chunks")]  # another buffer type, or a clear refusal
    for c in chunks:
        if type(c) is not memoryview or c.format != "B" or c.ndim != 1 or not c.c_contiguous:
            return [byte_view(c, "a chunk") for c in chunks]
    return chunks
