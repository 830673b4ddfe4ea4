"""Timed entry I/O that really reaches the device, with host and device time kept apart.

Device time is the time spent inside the system calls that move or allocate data (`os.preadv`, `os.pwritev`,
`os.fdatasync`, `fallocate`); host time is everything else the operation costs (opening, header, checksum,
copies, rename, page-cache advice). Both use `perf_counter_ns`. When two writes of one entry are in the kernel at once
(payload and header, below), device time is the span either is in, counted once.

Two modes:
- direct: O_DIRECT with page-aligned buffers and sizes; payload views that are already aligned (the benchmark's
  random buffer, LMCache's CPU buffers) go to the kernel with no copy; the tail is padded through a scratch page.
- buffered: plain write + fdatasync; before each read posix_fadvise(DONTNEED) drops the file's (clean) pages, so the
  read is served by the device, not the page cache.
Both modes write a temp file and rename it into place, so an entry is never seen half-written. How durable it is
when the write returns is the tier's sync policy (`Sync`):
- entry (the default): the file is fdatasynced before the rename and the directory fsynced after it (`files.sync_dir`,
  one fsync shared by concurrent writers), so an acknowledged entry and its name survive a power cut;
- none: neither; visible means written (in the page cache, or on the device's volatile cache for O_DIRECT). A power
  cut may lose the latest entries, or leave any mix of their old and new blocks under any of their names. None of
  that is served: the order of the system calls orders nothing on the device without a sync, so the guarantee comes
  from the checks every read and rescan makes, not from the order of the writes: the header's own checksum, the key
  in the header against the name (rescan) and the key asked for (read), the file's length against the header's, and
  the payload's xxh3 in the header (a torn or stale block fails one of them; see kvconnector/README.md).
A write may instead overwrite a spare file (a retired entry's file of the same size): its blocks are already allocated
and written, so neither the write nor the fdatasync changes metadata, and no fresh block is touched (fio's layout
trick).

Large payloads are checksummed beside their own write: the payload goes to the device from the writer's thread while
a hash thread computes the xxh3 and then writes the header page (the checksum is in it) into the same file, so the
hash (about 1 ms per 32 MiB out of cache here, xxh3 at 31 GB/s) is hidden under the payload's transfer instead of
delaying it. A payload in registered memory is submitted through io_uring and the writer's own thread hashes it.
Writing the header beside the payload is safe because nothing reads the file before the rename that follows both
writes: a process killed in between leaves a temp file, which a rescan removes (a power cut: see `Sync`).

Large reads are pipelined the same way: piece k's checksum is computed on a hash thread while piece k+1 is read.

Transfers of memory its owner registered with io_uring (LMCache's CPU buffers, through the adapters) go through the
ring instead of preadv/pwritev, so their pages are not pinned again for every transfer (kvconnector/uring.py). A read
into such memory is submitted whole, in 16 MiB pieces, and each piece is hashed as soon as it lands while the device
still has the later ones queued.

System calls and xxh3 release the GIL, so worker threads overlap I/O. Buffers are per thread and reused.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import fcntl
import logging
import mmap
import os
import stat
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import StrEnum
from time import perf_counter_ns

import xxhash

from . import uring
from .entry_format import PAGE, EntryHeader, aligned, checksum, pack_header, probe_name, temp_path_for, unpack_header
from .errors import CorruptEntryError, StorageFullError
from .files import sync_dir, unlink_quietly

log = logging.getLogger(__name__)

# One system call moves at most this much; also the size of a thread's scratch buffer for reads with no destination.
CHUNK_BYTES = 64 << 20
_IOV_MAX = 1024
# Payloads from this size on are hashed beside their write; below it the hash costs less than handing it to another
# thread plus the header's own system call.
OVERLAP_MIN_BYTES = 1 << 20
# Payloads from this size on are read in pieces of READ_PIECE_BYTES, each checksummed on a hash thread while the next
# is read. Below it one read then one hash is cheaper: the hash runs at about 40 GB/s here (xxh3, 0.023 CPU-s/GB), so
# it adds about 2% to a read from the disk, while a piece in flight per reader instead of the whole entry lowers the
# device's queue: 8 readers of 32 MiB entries on the virtio disk, 5 rounds alternating, medians: 4 MiB pieces 2.69
# GB/s, 16 MiB pieces 3.52, one read then the hash 3.63 (and 0.061 CPU-s/GB against 0.078). From CHUNK_BYTES on an
# entry is read in several calls anyway, and pieces of 16 MiB hide the hash (64 MiB entries: 3.67 GB/s, 4 MiB pieces
# 2.96). With the storage in memory (tmpfs) the hand-offs cost 14-17% more CPU.
PIPELINE_MIN_BYTES = 64 << 20
READ_PIECE_BYTES = 16 << 20
# A read into registered memory (io_uring) is submitted whole in pieces of this size, each hashed as soon as it lands.
# Each piece is a completion to hand over and a wake-up of its reader: 8 readers of 32 MiB entries, 4 rounds each
# alternating in one process (benchmarks/lmcache_vs_kvtier.py's load pass), medians: 4 MiB pieces 0.079 CPU-s/GB at
# 3.41 GB/s, 16 MiB 0.072 at 3.45; 16 MiB 0.068 at 3.35 against one piece (64 MiB) 0.068 at 3.30.
RING_PIECE_BYTES = 16 << 20
# More writers in flight than this (far more than any disk tier runs) wait for a hash thread.
HASH_THREADS_MAX = 64
# Transfers of registered memory go through io_uring (kvconnector/uring.py); False: always preadv/pwritev.
fixed_buffers = True
# 0 where the platform has no O_DIRECT (`probe_direct` then says False).
O_DIRECT = getattr(os, "O_DIRECT", 0)


class IOMode(StrEnum):
    DIRECT = "direct"
    BUFFERED = "buffered"


class Sync(StrEnum):
    """When a written entry is durable (module docstring). entry: before the write returns (fdatasync of the file,
    fsync of its directory); none: whenever the kernel writes it back, so a power cut may lose recent entries but the
    checks on read and rescan never let a torn one be served."""

    ENTRY = "entry"
    NONE = "none"


@dataclass(slots=True)
class OpTiming:
    host_ns: int = 0
    device_ns: int = 0
    nbytes: int = 0

    @property
    def total_ns(self) -> int:
        return self.host_ns + self.device_ns

    def add(self, other: OpTiming) -> None:
        self.host_ns += other.host_ns
        self.device_ns += other.device_ns
        self.nbytes += other.nbytes


_MAP_FLAGS = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
# madvise(MADV_POPULATE_WRITE) (Linux 5.14) faults a range in inside the kernel, several times cheaper than touching
# it page by page; unlike MAP_POPULATE it runs after MADV_HUGEPAGE, so what it faults in are huge pages where asked.
# Python 3.11's mmap module does not name it.
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)


def aligned_buffer(nbytes: int, huge: bool = False) -> memoryview:
    """Page-aligned, zero-filled anonymous memory (mmap), faulted in, suitable for O_DIRECT.

    `huge`: back it with transparent huge pages (2 MiB) where the kernel allows (THP "madvise" or "always"), for
    buffers that live long and carry O_DIRECT transfers. O_DIRECT pins every page of a transfer; with 4 KiB pages that
    pinning was most of the kernel's CPU per stored GB here (32 MiB writes, 8 in flight: 0.04-0.06 system CPU-s/GB
    with 4 KiB pages, 0.01 with huge pages; benchmarks/README.md). Not for short-lived buffers: a huge page may make
    the kernel compact memory first (0.2-1 s for 256 MiB once here)."""
    m = mmap.mmap(-1, max(PAGE, aligned(nbytes)), flags=_MAP_FLAGS)
    try:
        if huge:
            m.madvise(mmap.MADV_HUGEPAGE)
        m.madvise(MADV_POPULATE_WRITE)
    except OSError:  # an older kernel, or THP compiled out: the pages fault in on first use
        pass
    return memoryview(m)


def is_aligned(view: memoryview) -> bool:
    return uring.address(view) % PAGE == 0


class Scratch(threading.local):
    """Page-aligned buffers of this thread: a header page, a tail page, and a data buffer that grows on demand. They
    are not offered to io_uring: the data buffers are on huge pages, whose pinning costs little per transfer (and
    through the ring a read of them cost more CPU here, 0.077 against 0.069 CPU-s/GiB for 16 MiB entries)."""

    def __init__(self) -> None:
        self.header = aligned_buffer(PAGE)
        self.tail = aligned_buffer(PAGE)
        self.data: memoryview | None = None

    def data_buffer(self, nbytes: int) -> memoryview:
        if self.data is None or len(self.data) < nbytes:
            # At least double it (up to CHUNK_BYTES): a thread that meets ever larger entries grows it a few times,
            # not once per size, and every new buffer's pages are zeroed by the kernel (in this VM, first-touched
            # memory cost up to 2.4 CPU-s per GiB on huge pages).
            grown = min(2 * len(self.data), CHUNK_BYTES) if self.data is not None else 0
            self.data = aligned_buffer(max(nbytes, grown), huge=True)
        return self.data[:nbytes]

    def piece_buffer(self, slot: int, nbytes: int) -> memoryview:
        """One of two buffers a pipelined read alternates between (one is read into while the other is hashed): the
        two halves of the data buffer, so a thread holds one scratch buffer, not three (each new one is zeroed)."""
        span = READ_PIECE_BYTES + PAGE
        return self.data_buffer(2 * span)[slot * span : slot * span + nbytes]


# Per thread: what the tiers read into when a caller gives no destination.
scratch = Scratch()


def probe_direct(directory: str) -> bool:
    """Whether the filesystem under `directory` accepts an aligned O_DIRECT write and read."""
    if not O_DIRECT:
        return False
    path = os.path.join(directory, probe_name(os.getpid(), threading.get_ident()))
    buf = aligned_buffer(PAGE)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | O_DIRECT | os.O_CLOEXEC, 0o600)
        try:
            os.pwritev(fd, [buf], 0)
            os.preadv(fd, [buf], 0)
        finally:
            os.close(fd)
        return True
    except OSError:
        return False
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass


def write_entry(
    path: str,
    key: str,
    chunks: list[memoryview],
    mode: IOMode,
    shape: tuple[int, ...] = (),
    dtype: str = "uint8",
    spare: str | None = None,
    lock_tmp: bool = False,
    sync: Sync = Sync.ENTRY,
) -> OpTiming:
    """Write one entry (temp file, rename; with `sync` entry: fdatasync before the rename, directory fsync after).
    Raises StorageFullError on ENOSPC/EDQUOT.
    `spare`: a file of exactly this entry's file size, owned by the caller, to overwrite in place of a new temp file;
    it is consumed (renamed into place, or removed on failure). `lock_tmp`: hold a lock on the temp file until it is
    renamed, so that other instances sharing the directory see a live writer's file (persistence.rescan_dir)."""
    t0 = perf_counter_ns()
    nbytes = sum(len(c) for c in chunks)
    tmp = spare or temp_path_for(path, os.getpid(), threading.get_ident())
    flags = os.O_WRONLY | os.O_CLOEXEC | (O_DIRECT if mode is IOMode.DIRECT else 0)
    device_ns = 0
    fd = -1
    try:
        payload = _payload_iov(chunks, nbytes, mode)
        fd = os.open(tmp, flags if spare else flags | os.O_CREAT | os.O_TRUNC, 0o600)
        if lock_tmp:
            _lock_quietly(fd)
        if not spare:
            d0 = perf_counter_ns()
            # Block allocation is storage work the write would otherwise do inside pwritev: device time.
            _preallocate(fd, PAGE + sum(len(v) for v in payload))
            device_ns += perf_counter_ns() - d0
        header = EntryHeader(key, nbytes, 0, dtype, tuple(shape))  # the checksum is filled in below
        if nbytes >= OVERLAP_MIN_BYTES:
            device_ns += _write_hashing_beside(fd, chunks, payload, header)
        else:
            pack_header(scratch.header, dataclasses.replace(header, checksum=checksum(chunks)))
            device_ns += _pwritev_all(fd, [scratch.header, *payload])
        durable = sync is Sync.ENTRY
        if durable:
            d0 = perf_counter_ns()
            os.fdatasync(fd)
            device_ns += perf_counter_ns() - d0
        # Renamed while still open: a lock on the temp file (lock_tmp) covers it until it has its final name.
        os.rename(tmp, path)
        tmp = path  # published: a failure from here removes the entry, which the caller does not count as stored
        fd, done = -1, fd
        os.close(done)
        if durable:
            # The entry counts as stored only once its name is durable. Device time: the wait is for the journal
            # commit, whichever writer's fsync it is.
            d0 = perf_counter_ns()
            sync_dir(os.path.dirname(path))
            device_ns += perf_counter_ns() - d0
    except BaseException as exc:
        # Whatever failed (an I/O error, a header that cannot hold the key, an interrupt), no temp file or spare is
        # left behind: nothing else would ever remove it while this process lives.
        if fd >= 0:
            os.close(fd)
        unlink_quietly(tmp)
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise StorageFullError(exc.errno, f"no space left for a {nbytes}-byte entry", path) from exc
        raise
    total = perf_counter_ns() - t0
    return OpTiming(host_ns=total - device_ns, device_ns=device_ns, nbytes=nbytes)


def _lock_quietly(fd: int) -> None:
    # A filesystem without flock: the temp file is then protected by its age alone (shared_stale_tmp_s).
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def _write_hashing_beside(fd: int, chunks, payload: list[memoryview], header: EntryHeader) -> int:
    """The payload written at PAGE while `chunks` are checksummed and the header page (the checksum is in it) written
    at 0. Returns the device time: the span during which either write was in the kernel (their union), so a hash that
    outlasts the payload's write counts as host time, as it did before it was overlapped.
    Payload in registered memory: submitted through io_uring, and this thread hashes while the device writes (no
    second thread: handing the hash to one cost two thread switches per entry). Otherwise this thread writes with
    pwritev while a hash thread checksums and writes the header."""
    iov = [v for group in _groups(payload) for v in group]  # no view above CHUNK_BYTES (an SQE's length is 32 bits)
    p0 = perf_counter_ns()
    batch = uring.start(True, fd, iov, PAGE) if fixed_buffers else None
    if batch is not None:
        try:
            h0, h1 = _hash_and_write_header(fd, chunks, header)
        finally:
            batch.wait_all()  # also on an error: the kernel reads the caller's memory and writes `fd` until done
        p1, moved = batch.done_ns(), batch.moved()
        if moved < sum(map(len, iov)):  # a short write: the rest through pwritev
            _vectored_all(os.pwritev, fd, _skip(iov, moved), PAGE + moved, _short_write)
            p1 = perf_counter_ns()
        return (p1 - p0) + (h1 - h0) - max(0, min(p1, h1) - max(p0, h0))
    job = _hash_pool().submit(_hash_and_write_header, fd, chunks, header)
    p0 = perf_counter_ns()
    try:
        payload_ns = _vectored_all(os.pwritev, fd, payload, PAGE, _short_write)
        p1 = perf_counter_ns()
    finally:
        # Waits, also on an error: the hash thread writes into `fd`, which must not be closed (and its number reused)
        # before that write is done.
        failed = job.exception()
    if failed is not None:
        raise failed
    h0, h1 = job.result()
    return payload_ns + (h1 - h0) - max(0, min(p1, h1) - max(p0, h0))


def _hash_and_write_header(fd: int, chunks, header: EntryHeader) -> tuple[int, int]:
    """The checksum, then the header page (this thread's own aligned page) written at 0; on a hash thread, or on the
    writer's own while io_uring writes the payload.
    Returns when that write began and ended."""
    page = scratch.header
    pack_header(page, dataclasses.replace(header, checksum=checksum(chunks)))
    h0 = perf_counter_ns()
    _vectored_all(os.pwritev, fd, [page], 0, _short_write)
    return h0, perf_counter_ns()


_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _hash_pool() -> ThreadPoolExecutor:
    """The hash threads, made on demand: up to one per writer in flight (the executor starts a thread only when none is
    idle), so a hash never queues for a thread. Queued hashes outlast their payloads' writes: with 2 hash threads for
    8 writers the host share of 16 MiB writes rose from 13% to 30% here instead of falling to 4-7%."""
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                _pool = ThreadPoolExecutor(HASH_THREADS_MAX, thread_name_prefix="kvtier-hash")
    return _pool


def _forget_pool() -> None:
    # A forked child has none of the parent's threads: it starts its own pool when it needs one.
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)


# Linux's fallocate(2) itself, not posix_fallocate(3): where a filesystem cannot allocate (FUSE ones such as s3fs, NFS
# before 4.2), glibc's posix_fallocate emulates it by writing a byte into every block of the range (its man page,
# NOTES), which on a FUSE mount is one round trip to the daemon per 4 KiB (a 2 s bench on s3fs was still writing
# those bytes minutes later).
_libc = ctypes.CDLL(None, use_errno=True)
_fallocate = getattr(_libc, "fallocate64", None) or _libc.fallocate
_fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)


def _preallocate(fd: int, nbytes: int) -> None:
    """Reserve the file's blocks up front: a full filesystem fails here, before any data moves, and the data
    write does not allocate extents piecemeal. A filesystem that cannot allocate says so and the write goes on."""
    if _fallocate(fd, 0, 0, nbytes) == 0:
        return
    err = ctypes.get_errno()
    if err not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
        raise OSError(err, os.strerror(err))


def _payload_iov(chunks: list[memoryview], nbytes: int, mode: IOMode) -> list[memoryview]:
    """The payload as iovecs padded to a page multiple. In direct mode, aligned views go as they are; a tail that does
    not fill its page is copied into a zeroed scratch page; anything else misaligned is copied once into scratch."""
    sc = scratch
    tail_len = nbytes % PAGE
    # The tail page is made from the last chunk alone: chunks whose last one is shorter than the tail (small pieces
    # at the end) are copied.
    zero_copy = (not chunks or len(chunks[-1]) >= tail_len) and (
        mode is IOMode.BUFFERED
        or all(is_aligned(c) and (len(c) % PAGE == 0 or i == len(chunks) - 1) for i, c in enumerate(chunks))
    )
    if not zero_copy:
        buf = sc.data_buffer(aligned(nbytes))
        pos = 0
        for c in chunks:
            buf[pos : pos + len(c)] = c
            pos += len(c)
        buf[pos:] = bytes(len(buf) - pos)
        return [buf]
    iov = [c.cast("B") if c.format != "B" else c for c in chunks[:-1]]
    last = chunks[-1] if chunks else memoryview(b"")
    body = len(last) - tail_len if tail_len else len(last)
    if body:
        iov.append(last[:body])
    if tail_len:
        sc.tail[:tail_len] = last[body:]
        sc.tail[tail_len:] = bytes(PAGE - tail_len)
        iov.append(sc.tail)
    return iov


def _vectored_all(call, fd: int, iov: list[memoryview], offset: int, on_short) -> int:
    """os.preadv/os.pwritev in groups of at most CHUNK_BYTES/IOV_MAX, resuming after short transfers; `on_short()`
    returns the exception for a call that moved nothing. A group with a view in registered memory goes through
    io_uring instead (uring.transfer; the rest of a short transfer then through the call). Returns the ns spent inside
    the calls (device time)."""
    device_ns = 0
    for group in _groups(iov):
        want = sum(len(v) for v in group)
        done = 0
        if fixed_buffers:
            d0 = perf_counter_ns()
            done = uring.transfer(call is os.pwritev, fd, group, offset) or 0
            device_ns += perf_counter_ns() - d0
        while done < want:
            d0 = perf_counter_ns()
            n = call(fd, _skip(group, done), offset + done)
            device_ns += perf_counter_ns() - d0
            if n <= 0:
                raise on_short()
            done += n
        offset += want
    return device_ns


def _short_write() -> OSError:
    return OSError(errno.EIO, "short write")


def _pwritev_all(fd: int, iov: list[memoryview]) -> int:
    return _vectored_all(os.pwritev, fd, iov, 0, _short_write)


def _groups(iov: list[memoryview]):
    group, size = [], 0
    for v in iov:
        while len(v) > CHUNK_BYTES:  # split huge views so one call stays bounded
            if group:
                yield group
                group, size = [], 0
            yield [v[:CHUNK_BYTES]]
            v = v[CHUNK_BYTES:]
        if group and (size + len(v) > CHUNK_BYTES or len(group) >= _IOV_MAX):
            yield group
            group, size = [], 0
        if len(v):
            group.append(v)
            size += len(v)
    if group:
        yield group


def _skip(group: list[memoryview], nbytes: int) -> list[memoryview]:
    if nbytes == 0:
        return group
    out = []
    for v in group:
        if nbytes >= len(v):
            nbytes -= len(v)
            continue
        out.append(v[nbytes:])
        nbytes = 0
    return out


def read_entry(path: str, key: str, payload_nbytes: int, mode: IOMode, dest: memoryview | None = None) -> OpTiming:
    """Read and verify one entry. With `dest` (exactly payload_nbytes long) the payload lands there; without, it
    streams through a per-thread scratch buffer (what a benchmark needs: the bytes are read and checked, then dropped).
    Raises CorruptEntryError for a file that is short, has a bad header, another key, or a checksum mismatch."""
    try:
        return _read_entry(path, key, payload_nbytes, mode, dest)
    except CorruptEntryError:
        if dest is None or not len(dest) or not uring.registry.covers(uring.address(dest)):
            raise
        # `dest` is registered memory of a caller: if its owner freed it and got other pages at the same address, the
        # kernel wrote into the old pages and the check failed on a sound file. A second read without the ring tells.
        with uring.bypassed():
            timing = _read_entry(path, key, payload_nbytes, mode, dest)
        log.warning("kvtier: a registered buffer no longer holds its memory (freed and reused by its owner): withdrawn")
        uring.registry.withdraw_containing(uring.address(dest))
        return timing


def _read_entry(path: str, key: str, payload_nbytes: int, mode: IOMode, dest: memoryview | None) -> OpTiming:
    t0 = perf_counter_ns()
    sc = scratch
    flags = os.O_RDONLY | os.O_CLOEXEC | (O_DIRECT if mode is IOMode.DIRECT else 0)
    fd = os.open(path, flags)
    device_ns = 0
    try:
        if mode is IOMode.BUFFERED:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        if dest is not None and len(dest) != payload_nbytes:
            raise ValueError(f"destination holds {len(dest)} bytes, entry has {payload_nbytes}")
        direct_into_dest = dest is not None and (mode is IOMode.BUFFERED or is_aligned(dest))
        h = xxhash.xxh3_64()
        if payload_nbytes >= PIPELINE_MIN_BYTES:
            pipe_ns, hdr = _read_hashing_behind(fd, path, key, payload_nbytes, dest, direct_into_dest, h)
            device_ns += pipe_ns
        elif direct_into_dest:
            tail_len = payload_nbytes % PAGE
            body = payload_nbytes - tail_len
            pieces = [dest[p : min(p + RING_PIECE_BYTES, body)] for p in range(0, body, RING_PIECE_BYTES)]
            iov = [sc.header, *pieces] + ([sc.tail] if tail_len else [])
            batch = uring.start(False, fd, iov, 0) if fixed_buffers and len(pieces) > 1 else None
            if batch is not None:
                ring_ns, hdr = _hash_pieces_as_they_land(batch, path, key, payload_nbytes, pieces, h)
                device_ns += ring_ns
            else:
                device_ns += _preadv_all(fd, iov, path)
                hdr = _check_header(sc.header, key, payload_nbytes, path)
                h.update(dest[:body])
            if tail_len:
                dest[body:] = sc.tail[:tail_len]
                h.update(dest[body:])
        else:
            first = True
            hdr = None
            remaining = PAGE + aligned(payload_nbytes)
            offset = 0
            out_pos = 0
            while remaining:
                n = min(remaining, CHUNK_BYTES)
                buf = sc.data_buffer(n)
                device_ns += _preadv_all(fd, [buf], path, offset)
                start = 0
                if first:
                    hdr = _check_header(buf[:PAGE], key, payload_nbytes, path)
                    start, first = PAGE, False
                useful = min(n - start, payload_nbytes - out_pos)
                piece = buf[start : start + useful]
                h.update(piece)
                if dest is not None:
                    dest[out_pos : out_pos + useful] = piece
                out_pos += useful
                offset += n
                remaining -= n
        if h.intdigest() != hdr.checksum:
            raise CorruptEntryError(f"{path}: payload checksum mismatch")
    finally:
        os.close(fd)
    total = perf_counter_ns() - t0
    return OpTiming(host_ns=total - device_ns, device_ns=device_ns, nbytes=payload_nbytes)


def _read_hashing_behind(fd, path, key, payload_nbytes, dest, into_dest, h) -> tuple[int, EntryHeader]:
    """Read the entry in pieces of READ_PIECE_BYTES; piece k is checksummed (and, when it was read into scratch,
    copied to `dest`) on a hash thread while piece k+1 is read, so the hash (about 0.5 ms per 16 MiB here) hides under
    the transfer instead of following it. Pieces land in `dest` when `into_dest`, else in two scratch buffers used in
    turn (the hash of piece k-1 is done before piece k+1 overwrites its buffer). Returns the device time and the
    header; `h` holds the payload's hash."""
    sc = scratch
    tail_len = payload_nbytes % PAGE
    body = payload_nbytes - tail_len
    device_ns = 0
    hdr = None
    job = failed = None
    pos = 0  # payload offset of the piece
    slot = 0
    try:
        while pos < payload_nbytes:
            end = min(payload_nbytes, pos + READ_PIECE_BYTES)
            first, last = pos == 0, end == payload_nbytes
            if into_dest:
                iov = ([sc.header] if first else []) + ([dest[pos : min(end, body)]] if min(end, body) > pos else [])
                iov += [sc.tail] if last and tail_len else []
                useful = None
            else:
                buf = sc.piece_buffer(slot, (PAGE if first else 0) + aligned(end - pos))
                slot ^= 1
                iov = [buf]
                useful = buf[PAGE:] if first else buf
            device_ns += _preadv_all(fd, iov, path, 0 if first else PAGE + pos)
            if first:
                hdr = _check_header(sc.header if into_dest else buf[:PAGE], key, payload_nbytes, path)
            if into_dest and last and tail_len:
                dest[body:] = sc.tail[:tail_len]
            if job is not None:
                job.result()  # hashes stay in payload order; its scratch buffer is free for the next piece
            job = _hash_pool().submit(_finish_piece, h, dest, pos, end, useful)
            pos = end
    finally:
        if job is not None:
            # Also on an error: the job reads a buffer this thread reuses and writes into `dest`.
            failed = job.exception()
    if failed is not None:
        raise failed
    return device_ns, hdr


def _hash_pieces_as_they_land(batch, path, key, payload_nbytes, pieces, h) -> tuple[int, EntryHeader]:
    """A read submitted whole through io_uring (header page, the pieces of the body, the tail page): piece k is hashed
    as soon as it has landed, while the later ones are still on their way, and the device has every piece queued from
    the start (unlike reading piece by piece, which lowered its queue: PIPELINE_MIN_BYTES). Returns the time spent
    waiting for the device and the header; `h` holds the hash of the body."""
    wait_ns = 0
    try:
        t = perf_counter_ns()
        short = batch.result(0) < PAGE
        wait_ns += perf_counter_ns() - t
        hdr = None if short else _check_header(scratch.header, key, payload_nbytes, path)
        for i, piece in enumerate(pieces, 1):
            t = perf_counter_ns()
            short = short or batch.result(i) < len(piece)
            wait_ns += perf_counter_ns() - t
            if not short:
                h.update(piece)
    finally:
        t = perf_counter_ns()
        results = batch.wait_all()  # also on an error: the kernel writes into these buffers until it is done
        wait_ns += perf_counter_ns() - t
    if short or any(r < n for r, n in zip(results, batch.sizes)):
        raise CorruptEntryError(f"{path}: file shorter than its header says")
    return wait_ns, hdr


def _finish_piece(h, dest, pos: int, end: int, useful: memoryview | None) -> None:
    """Runs on a hash thread: the piece [pos, end) of the payload copied from scratch into `dest` if it was read into
    scratch, then hashed."""
    if useful is None:
        h.update(dest[pos:end])
        return
    piece = useful[: end - pos]
    if dest is not None:
        dest[pos:end] = piece
    h.update(piece)


def _preadv_all(fd: int, iov: list[memoryview], path: str, offset: int = 0) -> int:
    return _vectored_all(
        os.preadv, fd, iov, offset, lambda: CorruptEntryError(f"{path}: file shorter than its header says")
    )


def _check_header(page: memoryview, key: str, payload_nbytes: int, path: str) -> EntryHeader:
    hdr = unpack_header(page, path)
    if hdr.key != key or hdr.payload_nbytes != payload_nbytes:
        raise CorruptEntryError(f"{path}: holds key {hdr.key!r} of {hdr.payload_nbytes} bytes, expected {key!r}")
    return hdr


def read_header(path: str) -> EntryHeader:
    """The header of an entry file (for rescans after a restart). Raises CorruptEntryError for a bad one, and
    FileNotFoundError for a name that is not a regular file: a FIFO, directory or symlink is nothing kvtier wrote,
    so it is neither followed, nor waited on, nor reported as corrupt (which would get it removed)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a symlink
            raise FileNotFoundError(errno.ENOENT, "not a regular file", path) from exc
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileNotFoundError(errno.ENOENT, "not a regular file", path)
        page = os.pread(fd, PAGE, 0)
    finally:
        os.close(fd)
    hdr = unpack_header(page, path)
    if st.st_size < hdr.file_nbytes:
        raise CorruptEntryError(f"{path}: truncated ({st.st_size} < {hdr.file_nbytes} bytes)")
    return hdr
