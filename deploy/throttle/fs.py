"""The throttling passthrough: every operation is done on the backing directory, then held until the throttle says.

Invariants (the tests check them with real fio through a mount):
- An operation's real I/O is never delayed; it is *held back* afterwards until `max(end of real I/O, its slot in the
  direction's pipe) + added latency`. So a backing store faster than the cap is hidden under the cap, and added
  latency adds to whatever the I/O took (QD1 latency rises by exactly L).
- Bandwidth is a token bucket per direction (GCRA form): an op of n bytes books n / rate seconds of the direction's
  pipe from `max(pipe free, now - burst / rate)`. Booking happens before the I/O, under a lock held for a few
  arithmetic operations only; sleeping happens outside it. Concurrent operations share the pipe, so the cap holds at
  any queue depth, while their added latencies overlap (it is per operation, like a device's or a network's).
- Settings are one frozen value swapped whole (`set_settings`); an operation reads it once, so a change while mounted
  applies from the next operation on and is never seen half-made.
- Sleeps are shortened by the recent mean lateness of sleeps, so holds are right on average (a loaded machine wakes
  threads late); what each op got beyond or short of its hold is summed in `hold_error_ns`, not hidden.
- Counters are plain integers under one lock, read by the metrics endpoint at scrape time: nothing is formatted or
  allocated per operation on the I/O path.
- O_DIRECT is passed to the backing file (the client asked to bypass the page cache, so the backing must too). The
  buffers libfuse hands over are not page-aligned, so O_DIRECT transfers go through a per-thread aligned bounce
  buffer; those copies are counted (`direct_bounces`), not hidden.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import random
import threading
import time
from typing import Any

from .settings import OPS, Settings

O_DIRECT = getattr(os, "O_DIRECT", 0)
ALIGN = 4096
COUNTERS = ("ops", "bytes", "bw_wait_ns", "lat_ns", "hold_error_ns", "errors")


class Pipe:
    """One direction's bandwidth: a token bucket of depth `burst` bytes refilled at `rate` bytes/s (GCRA form)."""

    __slots__ = ("_lock", "_tat_ns")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tat_ns = 0  # when the pipe is free again (theoretical arrival time)

    def book(self, nbytes: int, now_ns: int, rate: float, burst: float) -> int:
        """Book n bytes; returns the time (monotonic ns) before which the operation must not complete."""
        if rate <= 0 or nbytes <= 0:
            return now_ns
        cost_ns = int(nbytes * 1e9 / rate)
        tol_ns = int(burst * 1e9 / rate)
        with self._lock:
            # Credit (time since the pipe was last free) is capped at the bucket's depth; the op's bytes are paid,
            # and it may complete, once the pipe has caught up with them.
            self._tat_ns = max(self._tat_ns, now_ns - tol_ns) + cost_ns
            return self._tat_ns


class Throttle:
    """Settings, the two pipes and the counters: the part of the filesystem that needs no FUSE (tested on its own)."""

    def __init__(self, settings: Settings, rng: random.Random | None = None) -> None:
        self.settings = settings
        self.pipes = {"read": Pipe(), "write": Pipe()}
        self._lock = threading.Lock()
        self.counters: dict[str, dict[str, int]] = {op: dict.fromkeys(COUNTERS, 0) for op in OPS}
        self.direct_bounces = 0
        self.in_flight = 0  # operations begun and not yet finished (counted when they finish)
        self.peak_in_flight = 0  # the most ever in flight at once: how many the server really serves in parallel
        self._idle = threading.Condition(self._lock)
        self.started_ns = time.monotonic_ns()
        self._late_ewma_ns = 0.0  # how late time.sleep wakes, on average of the last ~16 sleeps (updated racily: fine)
        self._rng = rng or random.Random()

    def set_settings(self, settings: Settings) -> None:
        self.settings = settings  # one reference store: atomic for the readers

    def begin(self, op: str, nbytes: int) -> tuple[int, Settings]:
        """Before the real I/O: the pipe slot of a read or write (0 for others), and the settings to finish with."""
        s = self.settings
        with self._lock:
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        now = time.monotonic_ns()
        if op == "read":
            return self.pipes["read"].book(nbytes, now, s.read_bw_bytes_s, s.burst_bytes), s
        if op == "write":
            return self.pipes["write"].book(nbytes, now, s.write_bw_bytes_s, s.burst_bytes), s
        return 0, s

    def finish(self, op: str, nbytes: int, slot_ns: int, s: Settings, failed: bool = False) -> None:
        """Call after the real I/O: sleeps until the slot has passed, then for the added latency; counts both."""
        now = time.monotonic_ns()
        bw_wait = max(0, slot_ns - now)
        lat_ms = s.latency_ms(op)
        if s.jitter_ms:
            lat_ms = max(0.0, lat_ms + self._rng.uniform(-s.jitter_ms, s.jitter_ms))
        lat_ns = int(lat_ms * 1e6)
        hold = bw_wait + lat_ns
        late = 0
        if hold:
            # One sleep for both components, shortened by how late sleeps have been waking up lately (scheduler
            # delay: 0.5-1 ms on a loaded 2-core machine), so the time held averages what was asked for.
            ask = max(0, hold - int(self._late_ewma_ns))
            time.sleep(ask / 1e9)
            woke = time.monotonic_ns()
            self._late_ewma_ns += ((woke - now - ask) - self._late_ewma_ns) / 16
            late = woke - now - hold  # signed: what this op was held beyond (or short of) its hold
        with self._lock:
            c = self.counters[op]
            c["ops"] += 1
            c["bytes"] += nbytes
            c["bw_wait_ns"] += bw_wait
            c["lat_ns"] += lat_ns
            c["hold_error_ns"] += late
            if failed:
                c["errors"] += 1
            self.in_flight -= 1
            if not self.in_flight:
                self._idle.notify_all()

    def wait_idle(self, timeout_s: float) -> int:
        """Wait until every operation begun has finished (and is counted), at most timeout_s; returns how many are
        still in flight."""
        with self._lock:
            self._idle.wait_for(lambda: not self.in_flight, timeout_s)
            return self.in_flight

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            ops = {op: dict(c) for op, c in self.counters.items()}
            bounces = self.direct_bounces
            in_flight, peak = self.in_flight, self.peak_in_flight
        return {
            "uptime_s": (time.monotonic_ns() - self.started_ns) / 1e9,
            "settings": self.settings.to_json(),
            "ops": ops,
            "direct_bounces": bounces,
            "in_flight": in_flight,
            "peak_in_flight": peak,
        }

    def count_bounce(self) -> None:
        with self._lock:
            self.direct_bounces += 1


def _addr(buf) -> int:
    return ctypes.cast(buf, ctypes.c_void_p).value or 0


class Passthrough:
    """mfusepy operations over `backing`: paths map 1:1, file handles are the backing file descriptors."""

    use_ns = True  # nanosecond times in utimens (mfusepy's non-deprecated mode)

    def __init__(self, backing: str, throttle: Throttle, max_request_bytes: int, on_mounted=None) -> None:
        self.root = os.path.realpath(backing)
        self.t = throttle
        self.max_request_bytes = max_request_bytes
        self._direct: set[int] = set()  # fds opened with O_DIRECT
        self._local = threading.local()
        self._on_mounted = on_mounted

    def _p(self, path: str) -> str:
        return self.root + path

    # -- life cycle -------------------------------------------------------------------------------------------------
    def init_with_config(self, conn, config) -> None:
        if conn is not None:
            # Up to max_request_bytes per FUSE request (libfuse turns max_write into the kernel's max_pages, which
            # bounds reads too): fewer trips through Python per MB.
            conn.max_write = self.max_request_bytes
        if self._on_mounted is not None:
            self._on_mounted()

    def destroy(self, path: str) -> None:
        pass

    # -- metadata: passed through, not throttled --------------------------------------------------------------------
    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        st = os.fstat(fh) if fh is not None else os.lstat(self._p(path))
        keys = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_ino", "st_dev", "st_blocks", "st_blksize")
        d = {k: getattr(st, k) for k in keys}
        d.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
        return d

    def access(self, path: str, amode: int) -> int:
        if not os.access(self._p(path), amode):
            raise OSError(errno.EACCES, "access")
        return 0

    def readdir(self, path: str, fh: int):
        # (name, attrs, 0): with use_ino an entry whose st_ino is 0 would be skipped by readdir(3).
        out = [(".", {"st_mode": 0o040000, "st_ino": 1}, 0), ("..", {"st_mode": 0o040000, "st_ino": 1}, 0)]
        with os.scandir(self._p(path)) as it:
            for e in it:
                out.append((e.name, {"st_mode": e.stat(follow_symlinks=False).st_mode, "st_ino": e.inode()}, 0))
        return out

    def readlink(self, path: str) -> str:
        return os.readlink(self._p(path))

    def mknod(self, path: str, mode: int, dev: int) -> int:
        os.mknod(self._p(path), mode, dev)
        return 0

    def mkdir(self, path: str, mode: int) -> int:
        os.mkdir(self._p(path), mode)
        return 0

    def rmdir(self, path: str) -> int:
        os.rmdir(self._p(path))
        return 0

    def unlink(self, path: str) -> int:
        os.unlink(self._p(path))
        return 0

    def symlink(self, target: str, source: str) -> int:
        os.symlink(source, self._p(target))
        return 0

    def link(self, target: str, source: str) -> int:
        os.link(self._p(source), self._p(target))
        return 0

    def rename(self, old: str, new: str) -> int:
        os.rename(self._p(old), self._p(new))
        return 0

    def chmod(self, path: str, mode: int) -> int:
        os.chmod(self._p(path), mode)
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        os.chown(self._p(path), uid, gid, follow_symlinks=False)
        return 0

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        if fh is not None:
            os.ftruncate(fh, length)
        else:
            os.truncate(self._p(path), length)
        return 0

    def utimens(self, path: str, times=None) -> int:
        os.utime(self._p(path), ns=times, follow_symlinks=False)
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        sv = os.statvfs(self._p(path))
        keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_flag")
        return {k: getattr(sv, k) for k in keys} | {"f_frsize": sv.f_frsize, "f_namemax": sv.f_namemax}

    def fallocate(self, path: str, mode: int, offset: int, size: int, fh: int) -> int:
        if mode:
            raise OSError(errno.EOPNOTSUPP, "fallocate mode")
        os.posix_fallocate(fh, offset, size)
        return 0

    # -- throttled: open, read, write, fsync --------------------------------------------------------------------------
    def _opened(self, fd: int, flags: int) -> int:
        if flags & O_DIRECT:
            self._direct.add(fd)
        return fd

    def open(self, path: str, flags: int) -> int:
        slot, s = self.t.begin("open", 0)
        try:
            fd = os.open(self._p(path), flags & ~os.O_CREAT)
        except OSError:
            self.t.finish("open", 0, slot, s, failed=True)
            raise
        self.t.finish("open", 0, slot, s)
        return self._opened(fd, flags)

    def create(self, path: str, mode: int, flags: int) -> int:
        slot, s = self.t.begin("open", 0)
        try:
            fd = os.open(self._p(path), flags | os.O_CREAT, mode)
        except OSError:
            self.t.finish("open", 0, slot, s, failed=True)
            raise
        self.t.finish("open", 0, slot, s)
        return self._opened(fd, flags)

    def release(self, path: str, fh: int) -> int:
        self._direct.discard(fh)
        os.close(fh)
        return 0

    def flush(self, path: str, fh: int) -> int:
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        slot, s = self.t.begin("fsync", 0)
        failed = False
        try:
            (os.fdatasync if datasync else os.fsync)(fh)
        except OSError:
            failed = True
            raise
        finally:
            self.t.finish("fsync", 0, slot, s, failed)
        return 0

    def _bounce(self, size: int) -> tuple[memoryview, int]:
        """This thread's aligned buffer (a view of `size` bytes, and its address), grown when a request is larger."""
        have = getattr(self._local, "bounce", None)
        if have is None or len(have[0]) < size:
            buf = mmap.mmap(-1, max(size, self.max_request_bytes) + ALIGN - 1 & ~(ALIGN - 1))
            have = (buf, ctypes.addressof(ctypes.c_char.from_buffer(buf)))
            self._local.bounce = have
        return memoryview(have[0])[:size], have[1]

    def read_into(self, fh: int, buf, size: int, offset: int) -> int:
        slot, s = self.t.begin("read", size)
        n, failed = 0, True
        try:
            addr = _addr(buf)
            if fh in self._direct and addr % ALIGN:
                view, baddr = self._bounce(size)
                n = os.preadv(fh, [view], offset)
                ctypes.memmove(addr, baddr, n)
                self.t.count_bounce()
            else:
                n = os.preadv(fh, [(ctypes.c_char * size).from_address(addr)], offset)
            failed = False
        finally:
            # Tokens are booked for the size asked (the pipe was reserved before the I/O); bytes count what came back.
            self.t.finish("read", n, slot, s, failed)
        return n

    # mfusepy registers a libfuse callback only where the operations object has the method; ThrottleFUSE's own
    # read/write call read_into/write_from with the C buffer instead.
    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        raise OSError(errno.ENOSYS, "read goes through read_into")

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        raise OSError(errno.ENOSYS, "write goes through write_from")

    def write_from(self, fh: int, buf, size: int, offset: int) -> int:
        slot, s = self.t.begin("write", size)
        n, failed = 0, True
        try:
            addr = _addr(buf)
            if fh in self._direct and addr % ALIGN:
                view, baddr = self._bounce(size)
                ctypes.memmove(baddr, addr, size)
                n = os.pwritev(fh, [view], offset)
                self.t.count_bounce()
            else:
                n = os.pwritev(fh, [(ctypes.c_char * size).from_address(addr)], offset)
            failed = False
        finally:
            self.t.finish("write", n, slot, s, failed)
        return n


def make_fuse_class():
    """mfusepy.FUSE with read and write handing the C buffer straight to preadv/pwritev (no bytes objects per op)."""
    os.environ.setdefault("FUSE_LIBRARY_NAME", "fuse3")  # not libfuse 2, which mfusepy would try first
    import mfusepy  # imported late: it loads libfuse3 at import and fails where it is missing

    class ThrottleFUSE(mfusepy.FUSE):
        def read(self, path, buf, size, offset, fip):
            return self.operations.read_into(fip.contents.fh, buf, size, offset)

        def write(self, path, buf, size, offset, fip):
            return self.operations.write_from(fip.contents.fh, buf, size, offset)

    return ThrottleFUSE
