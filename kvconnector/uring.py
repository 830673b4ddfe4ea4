"""O_DIRECT transfers of long-lived memory through io_uring with registered buffers: pages pinned once, not per I/O.

Why: an O_DIRECT preadv/pwritev pins every page of its buffer for the transfer (get_user_pages), and with 4 KiB pages
that pinning was a third of kvtier's CPU per stored GB. A registered buffer's pages are pinned once, when it is
registered. Measured on this project's 2-core VM (8 transfers of 32 MiB in flight, 4 KiB pages, O_DIRECT, ext4 on
virtio): pwritev from 8 threads 0.028-0.029 CPU-s/GB at 4.0 GB/s, io_uring WRITE_FIXED 0.005 at 5.2-5.5 GB/s;
preadv 0.040-0.043 at 2.5 GB/s, READ_FIXED 0.004 at 2.6 (benchmarks/README.md has the benchmarks that use it).

Only memory an owner offers is registered (`offer`): memory that lives as long as its owner says, on 4 KiB pages
(LMCache's CPU buffers, through the adapters). kvtier's own long-lived buffers are on huge pages, whose pinning costs
little per transfer, and go through preadv/pwritev. The registry keeps a reference to the owner object; an owner that
frees the memory itself (LMCache does, at shutdown) must withdraw it first (`withdraw`, `withdraw_tagged`), or the
kernel would go on using the old pages at addresses that now map others (a read that then fails its checksum is read
again without the ring: timed_io.read_entry; a write would store the old pages under the checksum of the new ones, an
entry the first read drops as corrupt, never serves). Offered memory is registered lazily, in pieces of up to 1 GiB (the
kernel's limit per registered buffer) as transfers touch them, within a budget of pinned bytes (`set_pin_budget`).
A transfer that touches no registered memory, or any transfer where the kernel refuses io_uring (seccomp profiles of
container runtimes do, as does `kernel.io_uring_disabled`), goes through preadv/pwritev as before: `transfer` returns
None and the caller does that.

One ring per process, shared by every thread: a thread fills its submission entries under a lock and submits them; a
completion thread waits in io_uring_enter and hands each result to its waiter. The ring is driven through its three
system calls with ctypes: the maintained Python binding (liburing on PyPI) takes only bytes and bytearray buffers, not
memory given by address such as LMCache's tensors. x86-64 only: the ring's memory ordering is kept by its total store
order (elsewhere kvtier uses preadv/pwritev).
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import errno
import logging
import mmap
import os
import platform
import struct
import threading
import time
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

_SYS_SETUP, _SYS_ENTER, _SYS_REGISTER = 425, 426, 427  # the same numbers on every architecture
_OP_READ_FIXED, _OP_WRITE_FIXED, _OP_READ, _OP_WRITE = 4, 5, 22, 23
_ENTER_GETEVENTS = 1
_REGISTER_BUFFERS2, _REGISTER_BUFFERS_UPDATE = 15, 16
_RSRC_REGISTER_SPARSE = 1
_OFF_SQES = 0x10000000
_MAP_POPULATE = 0x8000
_SQE = struct.Struct("<BBHiQQIIQHHiQQ")  # struct io_uring_sqe
_CQE = struct.Struct("<QiI")  # struct io_uring_cqe

RING_ENTRIES = 256
SLOTS = 1024  # registered buffers at most (the kernel allows 16384)
PIECE_BYTES = 1 << 30  # the kernel's limit for one registered buffer
DEFAULT_PIN_BUDGET = 16 << 30

_libc = ctypes.CDLL(None, use_errno=True)  # CDLL releases the GIL during the call
_libc.syscall.restype = ctypes.c_long


def _sys(*args) -> int:
    while True:
        r = _libc.syscall(*args)
        if r >= 0:
            return r
        err = ctypes.get_errno()
        if err != errno.EINTR:
            raise OSError(err, os.strerror(err))


class _Waiter:
    """The results of one batch, each set by the completion thread as it arrives (bytes moved, or -errno)."""

    __slots__ = ("cond", "last_ns", "results")

    def __init__(self, n: int) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.results: list[int | None] = [None] * n
        self.last_ns = 0  # when the latest result arrived (perf_counter_ns): the device time of a batch waited late

    def set(self, i: int, res: int) -> None:
        now = time.perf_counter_ns()
        with self.cond:
            self.results[i] = res
            self.last_ns = max(self.last_ns, now)
            self.cond.notify_all()

    def wait(self, i: int) -> int:
        with self.cond:
            while self.results[i] is None:
                self.cond.wait()
            return self.results[i]


class Ring:
    """One io_uring instance with a sparse table of SLOTS registered buffers and a completion thread."""

    def __init__(self, entries: int = RING_ENTRIES) -> None:
        params = ctypes.create_string_buffer(120)  # struct io_uring_params
        self.fd = _sys(_SYS_SETUP, entries, params)
        try:
            raw = params.raw
            self.sq_entries, self.cq_entries = struct.unpack_from("<2I", raw, 0)
            sq_head, sq_tail, sq_mask, _, _, _, sq_array = struct.unpack_from("<7I", raw, 40)
            cq_head, cq_tail, cq_mask, _, _, cqes = struct.unpack_from("<6I", raw, 80)
            size = max(sq_array + self.sq_entries * 4, cqes + self.cq_entries * _CQE.size)
            prot, flags = mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED | _MAP_POPULATE
            self._rings = mmap.mmap(self.fd, size, flags, prot, offset=0)  # SQ and CQ rings (IORING_FEAT_SINGLE_MMAP)
            self._sqes = mmap.mmap(self.fd, self.sq_entries * _SQE.size, flags, prot, offset=_OFF_SQES)
            self._u32 = memoryview(self._rings).cast("I")
            # The ring masks are values in the rings' memory at the offsets the kernel gave.
            self._sq = (sq_head // 4, sq_tail // 4, self._u32[sq_mask // 4], sq_array // 4)
            self._cq = (cq_head // 4, cq_tail // 4, self._u32[cq_mask // 4], cqes)
            # A sparse table: slots are filled by update as memory is registered.
            reg = struct.pack("<IIQQQ", SLOTS, _RSRC_REGISTER_SPARSE, 0, 0, 0)
            _sys(_SYS_REGISTER, self.fd, _REGISTER_BUFFERS2, ctypes.c_char_p(reg), len(reg))
        except BaseException:
            os.close(self.fd)
            raise
        self._lock = threading.Lock()  # submission side
        self._waiters: dict[int, tuple[_Waiter, int]] = {}
        self._next_id = 1
        self._unsubmitted = 0
        threading.Thread(target=self._complete, name="kvtier-uring", daemon=True).start()

    def set_slot(self, slot: int, addr: int, nbytes: int) -> None:
        """Register [addr, addr+nbytes) as buffer `slot` (pins its pages), or empty the slot with nbytes 0."""
        iov = (ctypes.c_uint64 * 2)(addr, nbytes)
        upd = struct.pack("<IIQQII", slot, 0, ctypes.addressof(iov), 0, 1, 0)  # struct io_uring_rsrc_update2
        _sys(_SYS_REGISTER, self.fd, _REGISTER_BUFFERS_UPDATE, ctypes.c_char_p(upd), len(upd))

    def submit(self, write: bool, fd: int, ops: list[tuple[int, int, int, int]]) -> _Waiter:
        """Submit (addr, nbytes, file offset, slot) transfers as one batch; the waiter has their results as they
        complete. Slot -1: memory not registered (a plain read or write, pinned for the transfer)."""
        waiter = _Waiter(len(ops))
        fixed, plain = (_OP_WRITE_FIXED, _OP_WRITE) if write else (_OP_READ_FIXED, _OP_READ)
        head_i, tail_i, mask, array_i = self._sq
        with self._lock:
            for i, (addr, nbytes, offset, slot) in enumerate(ops):
                tail = self._u32[tail_i]
                if (tail - self._u32[head_i]) & 0xFFFFFFFF >= self.sq_entries:
                    self._submit()  # the queue is full: hand what is there to the kernel first
                    tail = self._u32[tail_i]
                uid = self._next_id
                self._next_id += 1
                self._waiters[uid] = (waiter, i)
                idx = tail & mask
                op, slot = (fixed, slot) if slot >= 0 else (plain, 0)
                sqe = (op, 0, 0, fd, offset, addr, nbytes, 0, uid, slot, 0, 0, 0, 0)
                _SQE.pack_into(self._sqes, idx * _SQE.size, *sqe)
                self._u32[array_i + idx] = idx
                self._u32[tail_i] = (tail + 1) & 0xFFFFFFFF
                self._unsubmitted += 1
            self._submit()
        return waiter

    def _submit(self) -> None:
        while self._unsubmitted:
            self._unsubmitted -= _sys(_SYS_ENTER, self.fd, self._unsubmitted, 0, 0, None, 0)

    def _complete(self) -> None:
        while True:
            try:
                self._reap()
            except Exception:  # this thread must outlive any error: every waiter depends on it
                log.exception("kvtier: io_uring completion thread")

    def _reap(self) -> None:
        head_i, tail_i, mask, cqes = self._cq
        while True:
            try:
                _sys(_SYS_ENTER, self.fd, 0, 1, _ENTER_GETEVENTS, None, 0)
            except OSError as exc:  # EBUSY: completions the kernel holds back; they are reaped below
                if exc.errno != errno.EBUSY:
                    log.error("kvtier: io_uring completion wait failed: %s", exc)
            head, tail = self._u32[head_i], self._u32[tail_i]
            done: list[tuple[int, int]] = []
            while head != tail:
                uid, res, _ = _CQE.unpack_from(self._rings, cqes + (head & mask) * _CQE.size)
                done.append((uid, res))
                head = (head + 1) & 0xFFFFFFFF
            self._u32[head_i] = head
            for uid, res in done:
                with self._lock:
                    waiter, i = self._waiters.pop(uid, (None, 0))
                if waiter is None:  # cannot happen unless the ring is misread; a waiter left waiting would hang
                    log.error("kvtier: io_uring completion for an unknown request %d", uid)
                    continue
                waiter.set(i, res)


@dataclass
class _Region:
    """Offered memory: [base, base+nbytes), kept alive by `owner`; its 1 GiB pieces get slots as transfers use them."""

    base: int
    nbytes: int
    owner: object
    tag: object = None  # who offered it, to withdraw all of it at once (a closing backend)
    slots: dict[int, int] = field(default_factory=dict)  # piece index -> slot


class Registry:
    """Offered regions, their registered pieces, the pinned-bytes budget, and the ring (made on first need)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._regions: list[_Region] = []  # sorted by base
        self._bases: list[int] = []
        self._free_slots = list(range(SLOTS - 1, -1, -1))
        self.budget = DEFAULT_PIN_BUDGET if platform.machine() == "x86_64" else 0
        self.pinned = 0
        self._ring: Ring | None = None
        self._broken = False
        self.fixed_ops = 0  # transfers that went through the ring (counted for describe(), metrics and tests)

    def ring(self) -> Ring | None:
        if self._ring is None and not self._broken and self.budget:
            try:
                self._ring = Ring()
            except OSError as exc:
                self._broken = True
                log.info("kvtier: io_uring unavailable (%s): O_DIRECT transfers use preadv/pwritev", exc)
        return self._ring

    def offer(self, owner: object, base: int, nbytes: int, tag: object = None) -> None:
        if nbytes <= 0 or not self.budget:
            return
        with self._lock:
            i = bisect.bisect_right(self._bases, base)
            prev = self._regions[i - 1] if i else None
            if prev is not None and prev.base <= base and base + nbytes <= prev.base + prev.nbytes:
                return  # already offered (LMCache hands out views of one buffer)
            overlaps_next = i < len(self._bases) and self._bases[i] < base + nbytes
            if overlaps_next or (prev is not None and prev.base + prev.nbytes > base):
                return  # overlaps another region only in part: left to preadv/pwritev
            self._regions.insert(i, _Region(base, nbytes, owner, tag))
            self._bases.insert(i, base)

    def withdraw(self, base: int) -> None:
        """Forget the region that starts at `base` and unregister its pieces. Its owner must have no transfer in
        flight (the kernel keeps the pages until those end in any case)."""
        with self._lock:
            i = bisect.bisect_left(self._bases, base)
            if i < len(self._bases) and self._bases[i] == base:
                self._drop(i)

    def withdraw_tagged(self, tag: object) -> None:
        """Withdraw every region `tag` offered (a backend closing: the memory it was handed may be freed next)."""
        with self._lock:
            for i in range(len(self._regions) - 1, -1, -1):
                if self._regions[i].tag is tag:
                    self._drop(i)

    def withdraw_containing(self, addr: int) -> None:
        with self._lock:
            i = bisect.bisect_right(self._bases, addr) - 1
            if i >= 0 and addr < self._regions[i].base + self._regions[i].nbytes:
                self._drop(i)

    def covers(self, addr: int) -> bool:
        """Whether `addr` lies in a registered piece (a transfer there may have gone through the ring)."""
        with self._lock:
            i = bisect.bisect_right(self._bases, addr) - 1
            if i < 0 or addr >= self._regions[i].base + self._regions[i].nbytes:
                return False
            region = self._regions[i]
            return region.slots.get((addr - region.base) // PIECE_BYTES, -1) >= 0

    def _drop(self, i: int) -> None:
        region = self._regions.pop(i)
        del self._bases[i]
        for piece, slot in region.slots.items():
            if slot < 0:
                continue
            if self._ring is not None:
                self._ring.set_slot(slot, 0, 0)
            self._free_slots.append(slot)
            self.pinned -= _piece_len(region, piece)

    def slot_for(self, addr: int, nbytes: int) -> int | None:
        """The registered slot covering [addr, addr+nbytes), registering its piece if the budget allows (which faults
        in every page of the piece); None if the range is not offered memory, crosses a piece, or the budget or the
        slots are spent; -1 for a piece the kernel refused to register."""
        with self._lock:
            i = bisect.bisect_right(self._bases, addr) - 1
            if i < 0:
                return None
            region = self._regions[i]
            if addr + nbytes > region.base + region.nbytes:
                return None
            piece = (addr - region.base) // PIECE_BYTES
            if (addr + nbytes - 1 - region.base) // PIECE_BYTES != piece:
                return None
            slot = region.slots.get(piece)
            if slot is not None:
                return slot
            ring = self.ring()
            size = _piece_len(region, piece)
            if ring is None or not self._free_slots or self.pinned + size > self.budget:
                return None
            slot = self._free_slots.pop()
            try:
                ring.set_slot(slot, region.base + piece * PIECE_BYTES, size)
            except OSError as exc:  # RLIMIT_MEMLOCK without CAP_IPC_LOCK, mostly
                self._free_slots.append(slot)
                log.info("kvtier: cannot register %d bytes with io_uring (%s): preadv/pwritev for them", size, exc)
                region.slots[piece] = -1
                return None
            region.slots[piece] = slot
            self.pinned += size
            return slot

    def describe(self) -> dict:
        return {
            "available": self._ring is not None,
            "pin_budget_bytes": self.budget,
            "pinned_bytes": self.pinned,
            "fixed_transfers": self.fixed_ops,
        }


def _piece_len(region: _Region, piece: int) -> int:
    return min(PIECE_BYTES, region.nbytes - piece * PIECE_BYTES)


registry = Registry()


def _forget() -> None:
    # A forked child has no ring and none of the parent's registrations.
    global registry
    registry = Registry()


os.register_at_fork(after_in_child=_forget)


def address(view: memoryview) -> int:
    """Where the view's memory starts. ctypes takes 0.2 us for writable memory (numpy 1.2 us, once per transfer
    and per entry that added up: small entries are many)."""
    if not len(view):
        return 0
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(view))
    except (TypeError, ValueError):  # read-only memory (bytes): numpy, loaded by any caller with O_DIRECT buffers
        import numpy as np

        return np.frombuffer(view, dtype=np.uint8).ctypes.data


def offer_view(view: memoryview) -> None:
    """Offer the memory of a long-lived buffer (an mmap's memoryview): the view keeps it alive."""
    registry.offer(view, address(view), len(view))


def offer(owner: object, base: int, nbytes: int, tag: object = None) -> None:
    registry.offer(owner, base, nbytes, tag)


_local = threading.local()


@contextlib.contextmanager
def bypassed():
    """Transfers of this thread go through preadv/pwritev inside the block (a second look at a failed check)."""
    _local.off = True
    try:
        yield
    finally:
        _local.off = False


def withdraw_view(view: memoryview) -> None:
    registry.withdraw(address(view))


def set_pin_budget(nbytes: int) -> None:
    """How much memory kvtier may pin for io_uring in this process; 0 turns the ring off (preadv/pwritev only)."""
    registry.budget = nbytes if platform.machine() == "x86_64" else 0


class Batch:
    """Transfers submitted together; each view's result can be waited for on its own (a reader hashes the first
    pieces of an entry while the last ones are still on their way)."""

    def __init__(self, waiter: _Waiter, sizes: list[int]) -> None:
        self._waiter, self.sizes = waiter, sizes

    def result(self, i: int) -> int:
        """Bytes view i moved (fewer only at end of file), once it is done. Raises its OSError."""
        res = self._waiter.wait(i)
        if res < 0:
            raise OSError(-res, os.strerror(-res))
        return res

    def wait_all(self) -> list[int]:
        """Every raw result (-errno for a failure), once all are done: call it before the buffers or the file go."""
        return [self._waiter.wait(i) for i in range(len(self.sizes))]

    def done_ns(self) -> int:
        """When the last of the batch's results arrived (perf_counter_ns), after wait_all."""
        return self._waiter.last_ns

    def moved(self) -> int:
        """The bytes moved in order up to the first short transfer. Raises the OSError of a failed one."""
        moved = 0
        for nbytes, res in zip(self.sizes, self.wait_all()):
            if res < 0:
                raise OSError(-res, os.strerror(-res))
            moved += res
            if res < nbytes:  # a short transfer: the rest is the caller's (or end of file)
                break
        return moved


def start(write: bool, fd: int, iov: list[memoryview], offset: int) -> Batch | None:
    """Submit `iov` to or from `fd` at `offset` (view after view) through the ring if any view lies in registered
    memory (the others, a header page say, go in the same batch as plain reads or writes); None when the caller must
    use preadv/pwritev instead."""
    reg = registry
    if not reg._regions or not reg.budget or reg._broken or getattr(_local, "off", False):
        return None  # (nothing offered: kvtier's own buffers, most callers; no address or lock for them)
    ops = []
    pos = offset
    for v in iov:
        addr = address(v)
        slot = reg.slot_for(addr, len(v))
        ops.append((addr, len(v), pos, -1 if slot is None else slot))
        pos += len(v)
    ring = reg._ring
    if ring is None or all(op[3] < 0 for op in ops):
        return None
    reg.fixed_ops += 1
    return Batch(ring.submit(write, fd, ops), [len(v) for v in iov])


def transfer(write: bool, fd: int, iov: list[memoryview], offset: int) -> int | None:
    """`start`, then wait: the bytes moved (fewer only at end of file), or None when the caller must use
    preadv/pwritev. Raises the OSError of a failed transfer."""
    batch = start(write, fd, iov, offset)
    return None if batch is None else batch.moved()
