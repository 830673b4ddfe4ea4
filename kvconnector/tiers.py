"""Storage tiers: where an entry's bytes live. The store decides which tier; a tier only moves bytes and times it.

Every tier reads into a caller's buffer (`dest`) or, with no destination, through a per-thread scratch buffer (what
the benchmark does: the bytes cross the bus and are dropped). For memory tiers "device" time is the copy into or out
of the tier's memory; for disk tiers it is the time inside the read/write/fdatasync system calls.
"""

from __future__ import annotations

import errno
import itertools
import logging
import math
import numbers
import os
import shutil
import threading
from abc import ABC, abstractmethod
from collections import Counter
from time import perf_counter_ns

import numpy as np

from .cpu_pool import BufferPool, PoolBuffer
from .entry_format import MAX_KEY_BYTES, file_name_for, file_nbytes, spare_name
from .errors import ConfigError, EntryNotFound
from .persistence import claim_dir
from .timed_io import CHUNK_BYTES, PAGE, IOMode, OpTiming, Sync, probe_direct, read_entry, scratch, write_entry

log = logging.getLogger(__name__)


def capacity_bytes_of(name: str, value: object, auto_zero: bool = False) -> int:
    """A tier's capacity as whole bytes, or ConfigError: a finite number of at least one byte (a float is cut to
    whole bytes); not a bool (True is not 1 byte), not a str, NaN or infinity. `auto_zero`: 0 is allowed (it asks
    the caller to pick, as the disk tier's "all the free space" does)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(f"tier {name}: capacity must be a number of bytes, not {type(value).__name__} {value!r}")
    if not math.isfinite(value):
        raise ConfigError(f"tier {name}: capacity must be a finite number of bytes, not {value!r}")
    if auto_zero and value == 0:
        return 0
    if value < 1:
        raise ConfigError(f"tier {name}: capacity must be at least one byte, not {value!r}")
    return int(value)


class Tier(ABC):
    kind: str = "tier"
    # The longest key (UTF-8 bytes) the tier can hold, for tiers that write keys into an entry header (which also
    # need keys UTF-8 can encode); None: any str. The store checks every key against its strictest tier up front.
    max_key_bytes: int | None = None
    # The open store this tier is a level of (a weak reference, set by TieredStore): a tier serves one store.
    _store = None

    def __init__(self, name: str, capacity_bytes: int) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"a tier's name must be a non-empty str, not {name!r}")
        self.capacity_bytes = capacity_bytes_of(name, capacity_bytes)
        self.name = name
        # Fallbacks and other non-silent degradations, reported with the results.
        self.fallbacks: Counter[str] = Counter()
        # Events only the tier sees (spare_writes), reported with the store's per-tier events.
        self.counters: Counter[str] = Counter()

    @abstractmethod
    def write(
        self, key: str, chunks: list[memoryview], nbytes: int, shape: tuple = (), dtype: str = "uint8"
    ) -> OpTiming: ...

    @abstractmethod
    def read(self, key: str, nbytes: int, dest: memoryview | None = None) -> OpTiming: ...

    @abstractmethod
    def delete(self, key: str) -> None: ...

    def view(self, key: str) -> memoryview | None:
        """The entry's bytes in place, for tiers in host memory (so moving it to another tier needs no extra copy)."""
        return None

    def describe(self) -> dict:
        return {"name": self.name, "kind": self.kind, "capacity_bytes": self.capacity_bytes}

    @abstractmethod
    def close(self) -> None:
        """Release what the tier holds (memory, file handles, connections); the store calls it once, at its end."""


class _CPUEntry:
    """An entry in the CPU tier: the page-multiple body in a pooled buffer, the last partial page (if any) in a
    bytearray beside it. `readers` and `deleted` keep a buffer out of the pool while a read copies from it."""

    __slots__ = ("body", "buf", "deleted", "readers", "tail")

    def __init__(self, buf: PoolBuffer | None, tail_len: int) -> None:
        self.buf = buf
        self.body = buf.held if buf is not None else None
        self.tail = np.zeros(tail_len, dtype=np.uint8) if tail_len else None
        self.readers = 0
        self.deleted = False

    def segments(self) -> list[np.ndarray]:
        return [a for a in (self.body, self.tail) if a is not None]


class CPUTier(Tier):
    """Host memory from a size-classed buffer pool (kvconnector/cpu_pool.py): a put copies into a buffer mapped
    earlier, a delete hands the buffer back for the next entry of its size class, so writes are bound by memcpy, not
    by faulting in fresh pages.

    Capacity holds in real memory: the pool keeps every page it has faulted in (buffers in use, their slack, free
    buffers) plus the entries' tails within `capacity_bytes`, releasing free buffers and slack to make room. An
    entry's body is its length rounded down to a page and lives page-aligned in a pooled buffer (so it can feed
    O_DIRECT writes on demotion); the rest (< 4 KiB) is a small array counted at its length. What an entry holds in
    memory is thus exactly the store's count of it, and slack and free buffers only ever use what the store leaves
    free. Entries whose length is a page multiple (the KV chunks of every catalog model but the MLA one) have no
    tail, and view() hands them to a demotion in place.
    """

    kind = "cpu"

    def __init__(self, capacity_bytes: int, name: str = "cpu") -> None:
        super().__init__(name, capacity_bytes)
        self.pool = BufferPool(self.capacity_bytes, self.counters)
        self._data: dict[str, _CPUEntry] = {}
        self._lock = threading.Lock()

    def write(self, key, chunks, nbytes, shape=(), dtype="uint8"):
        t0 = perf_counter_ns()
        tail_len = nbytes % PAGE
        buf = self.pool.acquire(nbytes - tail_len, tail_len)
        try:
            entry = _CPUEntry(buf, tail_len)
            t1 = perf_counter_ns()
            if len(chunks) == 1 and entry.body is not None and not tail_len:
                np.copyto(entry.body, np.frombuffer(chunks[0], dtype=np.uint8))
            else:
                _scatter([np.frombuffer(c, dtype=np.uint8) for c in chunks], entry.segments())
            t2 = perf_counter_ns()
        except BaseException:
            self.pool.release(buf, tail_len)
            raise
        with self._lock:
            old = self._data.pop(key, None)
            self._data[key] = entry
            if old is not None:  # the store never writes a key it holds; should anyone, the old bytes go back
                old.deleted = True
                old = old if not old.readers else None
        if old is not None:
            self._release(old)
        return OpTiming(host_ns=(t1 - t0) + (perf_counter_ns() - t2), device_ns=t2 - t1, nbytes=nbytes)

    def read(self, key, nbytes, dest=None):
        t0 = perf_counter_ns()
        with self._lock:
            entry = self._data[key]
            entry.readers += 1
        t1 = perf_counter_ns()
        try:
            if dest is not None:
                _scatter(entry.segments(), [np.frombuffer(dest, dtype=np.uint8)[:nbytes]])
            else:
                for seg in entry.segments():
                    for pos in range(0, len(seg), CHUNK_BYTES):
                        n = min(CHUNK_BYTES, len(seg) - pos)
                        np.copyto(np.frombuffer(scratch.data_buffer(n), dtype=np.uint8), seg[pos : pos + n])
            t2 = perf_counter_ns()
        finally:
            with self._lock:
                entry.readers -= 1
                retire = entry.deleted and entry.readers == 0
            if retire:
                self._release(entry)
        return OpTiming(host_ns=t1 - t0, device_ns=t2 - t1, nbytes=nbytes)

    def view(self, key):
        # Valid until the entry is deleted: the store deletes no entry while it moves it, which is when it asks.
        with self._lock:
            entry = self._data.get(key)
            return entry.buf.data() if entry is not None and entry.tail is None and entry.buf is not None else None

    def delete(self, key):
        with self._lock:
            entry = self._data.pop(key, None)
            if entry is None:
                return
            entry.deleted = True
            if entry.readers:
                return  # the last reader releases it
        self._release(entry)

    def _release(self, entry: _CPUEntry) -> None:
        buf, tail_len = entry.buf, len(entry.tail) if entry.tail is not None else 0
        entry.buf = entry.body = entry.tail = None
        self.pool.release(buf, tail_len)

    def describe(self):
        counters = {k: n for k, n in self.counters.items() if k.startswith("pool_")}
        return {**super().describe(), **self.pool.describe(), **counters}

    def close(self):
        with self._lock:
            keys = list(self._data)
        for key in keys:
            self.delete(key)
        self.pool.close()


def _scatter(src: list[np.ndarray], dst: list[np.ndarray]) -> None:
    """Copy the concatenation of `src` into the concatenation of `dst` (same total length)."""
    di, dpos = 0, 0
    for s in src:
        spos = 0
        while spos < len(s):
            d = dst[di]
            n = min(len(s) - spos, len(d) - dpos)
            np.copyto(d[dpos : dpos + n], s[spos : spos + n])
            spos += n
            dpos += n
            if dpos == len(d):
                di, dpos = di + 1, 0


class DiskTier(Tier):
    """One file per entry under `directory`, written and read with timed O_DIRECT (or buffered+fadvise), made durable
    per entry or left to the kernel's writeback (`sync`, timed_io.Sync).

    A deleted entry's file is kept as a spare (up to `spare_ratio` of the capacity, so with the store's
    large_entry_limit_ratio of 0.95 the directory never holds more than its capacity) and the next entry of the same
    size overwrites it in place: no block allocation, no metadata for fdatasync to commit, no freshly discarded
    blocks (which thin-provisioned and discard-mounted disks write slowly). KV chunks have one size, so a tier in its
    steady state (full, evicting) writes almost only spares. Spares are temp files: a restart's rescan removes them.
    The directory is claimed with a marker file first (persistence.claim_dir): kvtier never mixes into a directory
    holding files it did not write.
    """

    kind = "disk"
    max_key_bytes = MAX_KEY_BYTES  # the key is in each file's header
    # Several instances write the directory at once (SharedDirTier): its lock is shared, and each write in flight
    # holds a lock on its temp file so that another instance's rescan never removes it (persistence.py).
    shared = False

    def __init__(
        self,
        directory: str,
        capacity_bytes: int = 0,
        io_mode: IOMode | str = IOMode.DIRECT,
        name: str = "disk",
        spare_ratio: float = 0.05,
        sync: Sync | str = Sync.ENTRY,
    ) -> None:
        if not isinstance(directory, (str, os.PathLike)) or "\0" in os.fspath(directory) or not os.fspath(directory):
            raise ConfigError(f"tier {name}: directory must be a non-empty path without NUL bytes, not {directory!r}")
        try:
            io_mode = IOMode(io_mode)
        except ValueError:
            modes = ", ".join(m.value for m in IOMode)
            raise ConfigError(f"tier {name}: io_mode must be one of {modes}, not {io_mode!r}") from None
        try:
            sync = Sync(sync)
        except ValueError:
            policies = ", ".join(p.value for p in Sync)
            raise ConfigError(f"tier {name}: sync must be one of {policies}, not {sync!r}") from None
        if isinstance(spare_ratio, bool) or not isinstance(spare_ratio, numbers.Real) or not 0 <= spare_ratio <= 1:
            raise ConfigError(f"tier {name}: spare_ratio must be a number from 0 to 1, not {spare_ratio!r}")
        # Only 0 means "all the free space": a negative or NaN capacity is refused, not read as "auto".
        capacity_bytes = capacity_bytes_of(name, capacity_bytes, auto_zero=True)
        directory = os.path.abspath(directory)
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
        except OSError as exc:
            if os.path.exists(directory) and not os.path.isdir(directory):
                raise ConfigError(f"cache dir {directory} exists and is not a directory") from exc
            raise ConfigError(f"cannot create cache dir {directory}: {exc.strerror}") from exc
        if not os.access(directory, os.W_OK | os.X_OK):
            raise ConfigError(f"cache dir {directory} is not writable")
        # Before anything is written: a non-empty directory that kvtier did not make is refused, not mixed into, and
        # one that another live process holds is refused (a private tier) or shared with it (a shared one).
        self._dir_lock = claim_dir(directory, shared=self.shared)
        try:
            if capacity_bytes == 0:  # auto: what the filesystem has free now
                capacity_bytes = shutil.disk_usage(directory).free
            super().__init__(name, capacity_bytes)
        except BaseException:
            self._release_dir()
            raise
        if self._dir_lock is None:
            self.fallbacks["tier_lock_unavailable"] += 1
            log.warning("%s: the filesystem under %s has no flock: the directory is used unlocked", name, directory)
        self.directory = directory
        self.io_mode = IOMode(io_mode)
        self.sync = sync  # when a write is durable: timed_io.Sync
        if self.io_mode is IOMode.DIRECT and not probe_direct(directory):
            self.fallbacks["o_direct_unavailable"] += 1
            log.warning(
                "%s: filesystem under %s refuses O_DIRECT; using buffered I/O + fdatasync + fadvise", name, directory
            )
            self.io_mode = IOMode.BUFFERED
        self._spare_limit = int(spare_ratio * self.capacity_bytes)
        self._spares: dict[int, list[str]] = {}  # file size -> spare paths
        self._spare_bytes = 0
        self._spare_seq = itertools.count()
        self._spare_lock = threading.Lock()

    def path_for(self, key: str) -> str:
        return os.path.join(self.directory, file_name_for(key))

    def write(self, key, chunks, nbytes, shape=(), dtype="uint8"):
        path = self.path_for(key)  # before a spare is taken: a key with no file name must not cost one
        size = file_nbytes(nbytes)
        with self._spare_lock:
            spare = self._spares[size].pop() if self._spares.get(size) else None
            if spare:
                self._spare_bytes -= size
                self.counters["spare_writes"] += 1
        return write_entry(
            path, key, chunks, self.io_mode, shape, dtype, spare=spare, lock_tmp=self.shared, sync=self.sync
        )

    def read(self, key, nbytes, dest=None):
        try:
            return read_entry(self.path_for(key), key, nbytes, self.io_mode, dest)
        except OSError as exc:
            # Removed behind the store's back (another instance of a shared directory, a person): a miss. A network
            # file system's client that still has the name cached answers ESTALE instead (GlusterFS for about 1 s).
            if isinstance(exc, FileNotFoundError) or exc.errno == errno.ESTALE:
                raise EntryNotFound(key) from exc
            raise

    def delete(self, key):
        path = self.path_for(key)
        if self._spare_limit and self._keep_as_spare(path):
            return
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def _keep_as_spare(self, path: str) -> bool:
        try:
            size = os.stat(path).st_size
        except OSError:
            return False
        with self._spare_lock:
            if self._spare_bytes + size > self._spare_limit:
                return False
            self._spare_bytes += size
            spare = os.path.join(self.directory, spare_name(next(self._spare_seq)))
        try:
            os.rename(path, spare)
        except OSError:
            with self._spare_lock:
                self._spare_bytes -= size
            return False
        with self._spare_lock:
            self._spares.setdefault(size, []).append(spare)
        return True

    def describe(self):
        return {
            **super().describe(),
            "directory": self.directory,
            "io_mode": self.io_mode.value,
            "sync": self.sync.value,
            "spare_writes": self.counters["spare_writes"],
            "spare_bytes": self._spare_bytes,
        }

    def drop_spares(self) -> None:
        """Remove the spare files kept for reuse (the next writes allocate fresh blocks, as into an empty directory)."""
        with self._spare_lock:
            spares = [p for paths in self._spares.values() for p in paths]
            self._spares.clear()
            self._spare_bytes = 0
        for p in spares:
            try:
                os.unlink(p)
            except OSError:
                pass

    def close(self):
        self.drop_spares()
        self._release_dir()

    def _release_dir(self) -> None:
        fd, self._dir_lock = self._dir_lock, None
        if fd is not None:
            os.close(fd)


class GPUTier(Tier):
    """CUDA device memory through torch (imported only when this tier is built). Copies are synchronised so the
    timing covers the transfer, not just its launch."""

    kind = "gpu"

    def __init__(self, capacity_bytes: int, device: str = "cuda:0", name: str = "gpu") -> None:
        super().__init__(name, capacity_bytes)
        torch = cuda_torch()
        if torch is None:
            raise ConfigError("--gpu-mem-gb > 0 needs a CUDA device and torch with CUDA; none found")
        self._torch = torch
        self._device = torch.device(device)
        self._data: dict[str, object] = {}
        self._lock = threading.Lock()

    def write(self, key, chunks, nbytes, shape=(), dtype="uint8"):
        torch = self._torch
        t0 = perf_counter_ns()
        dev = torch.empty(nbytes, dtype=torch.uint8, device=self._device)
        t1 = perf_counter_ns()
        pos = 0
        for c in chunks:
            dev[pos : pos + len(c)].copy_(torch.frombuffer(c, dtype=torch.uint8))
            pos += len(c)
        torch.cuda.synchronize(self._device)
        t2 = perf_counter_ns()
        with self._lock:
            self._data[key] = dev
        return OpTiming(host_ns=(t1 - t0) + (perf_counter_ns() - t2), device_ns=t2 - t1, nbytes=nbytes)

    def read(self, key, nbytes, dest=None):
        torch = self._torch
        t0 = perf_counter_ns()
        with self._lock:
            dev = self._data[key]
        t1 = perf_counter_ns()
        for pos in range(0, nbytes, CHUNK_BYTES):
            n = min(CHUNK_BYTES, nbytes - pos)
            out = dest[pos : pos + n] if dest is not None else scratch.data_buffer(n)
            torch.frombuffer(out, dtype=torch.uint8).copy_(dev[pos : pos + n])
        torch.cuda.synchronize(self._device)
        t2 = perf_counter_ns()
        return OpTiming(host_ns=t1 - t0, device_ns=t2 - t1, nbytes=nbytes)

    def delete(self, key):
        with self._lock:
            self._data.pop(key, None)

    def close(self):
        with self._lock:
            self._data.clear()  # device memory goes back to torch now, not whenever the tier is collected


def cuda_torch():
    """torch, if it is installed and sees a CUDA device; else None. Never raises."""
    if not (os.path.exists("/proc/driver/nvidia") or os.path.exists("/dev/nvidia0")):
        return None  # no NVIDIA driver: skip importing torch (seconds) to learn what we already know
    try:
        import torch
    except Exception:
        return None
    try:
        return torch if torch.cuda.is_available() else None
    except Exception:
        return None
