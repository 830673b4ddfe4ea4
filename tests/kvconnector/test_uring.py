"""io_uring with registered buffers (kvconnector/uring.py) on real files with O_DIRECT: the ring moves the bytes, the
registry registers only offered memory within its budget, a buffer whose memory was freed and mapped again is caught
(never served, never dropped as corrupt), and where the kernel refuses the ring everything goes through preadv/pwritev.
"""

import ctypes
import mmap
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from kvconnector import uring
from kvconnector.entry_format import PAGE, file_name_for
from kvconnector.timed_io import IOMode, aligned_buffer, probe_direct, read_entry, write_entry

pytestmark = pytest.mark.skipif(
    uring.registry.budget == 0, reason="io_uring is used on x86-64 only (its ring ordering relies on it)"
)


@pytest.fixture
def direct_dir(tmp_path):
    if not probe_direct(str(tmp_path)):
        pytest.skip(f"the filesystem of {tmp_path} refuses O_DIRECT")
    if uring.registry.ring() is None:
        pytest.skip("the kernel refuses io_uring here (seccomp or kernel.io_uring_disabled)")
    return tmp_path


@pytest.fixture
def fresh_registry(monkeypatch):
    """A registry of this test's own (its ring too), so counts and budgets start from zero."""
    reg = uring.Registry()
    monkeypatch.setattr(uring, "registry", reg)
    return reg


def _random(n, seed):
    buf = aligned_buffer(n)
    buf[:n] = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()
    return buf


def test_offered_memory_goes_through_the_ring_and_back(direct_dir, fresh_registry):
    src, dst = _random(8 << 20, 1), aligned_buffer(8 << 20)
    uring.offer_view(src)
    uring.offer_view(dst)
    fd = os.open(direct_dir / "f", os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
    try:
        # Three views at three file offsets in one batch, as a header, a body and a tail are written.
        views = [src[:PAGE], src[PAGE : 5 << 20], src[5 << 20 :]]
        assert uring.transfer(True, fd, views, 0) == 8 << 20
        assert uring.transfer(False, fd, [dst], 0) == 8 << 20
    finally:
        os.close(fd)
    assert bytes(dst) == bytes(src)
    assert fresh_registry.fixed_ops == 2
    assert fresh_registry.pinned == 16 << 20
    # What the ring wrote is on the file, as a plain read sees it.
    assert (direct_dir / "f").read_bytes() == bytes(src)


def test_an_entry_written_from_offered_memory_is_hashed_on_the_writers_thread(direct_dir, fresh_registry, monkeypatch):
    """A put of registered memory: the payload goes through the ring and the writer's own thread hashes it meanwhile
    (no hash thread); the entry reads back verified, and the device time lies within the write's span."""
    from kvconnector import timed_io

    n = 32 << 20
    src, dst = _random(n, 11), aligned_buffer(n)
    uring.offer_view(src)
    hashed_on = []
    real = timed_io._hash_and_write_header

    def spy(*a):
        hashed_on.append(threading.get_ident())
        return real(*a)

    monkeypatch.setattr(timed_io, "_hash_and_write_header", spy)
    t = write_entry(str(direct_dir / file_name_for("k")), "k", [src[:n]], IOMode.DIRECT)
    assert hashed_on == [threading.get_ident()] and fresh_registry.fixed_ops == 1
    assert t.device_ns > 0 and t.host_ns >= 0 and t.nbytes == n  # host = the span - device: device never exceeds it
    read_entry(str(direct_dir / file_name_for("k")), "k", n, IOMode.DIRECT, dst[:n])
    assert bytes(dst[:n]) == bytes(src[:n])


def test_memory_not_offered_or_over_budget_is_left_to_preadv(direct_dir, fresh_registry):
    buf = _random(4 << 20, 2)
    fd = os.open(direct_dir / "f", os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
    try:
        assert uring.transfer(True, fd, [buf], 0) is None  # never offered
        fresh_registry.budget = 1 << 20
        uring.offer_view(buf)
        assert uring.transfer(True, fd, [buf], 0) is None  # more than the budget may pin
        fresh_registry.budget = 8 << 20
        assert uring.transfer(True, fd, [buf], 0) == 4 << 20
        uring.withdraw_view(buf)
        assert fresh_registry.pinned == 0
        assert uring.transfer(True, fd, [buf], 0) is None  # withdrawn: no longer the ring's
    finally:
        os.close(fd)


def test_a_failed_transfer_raises_its_errno(direct_dir, fresh_registry):
    buf = _random(PAGE, 3)
    uring.offer_view(buf)
    (direct_dir / "f").write_bytes(bytes(PAGE))
    fd = os.open(direct_dir / "f", os.O_RDONLY | os.O_DIRECT)
    try:
        with pytest.raises(OSError) as exc:
            uring.transfer(True, fd, [buf], 0)  # writing to a read-only descriptor
        assert exc.value.errno == 9  # EBADF, from the completion's result
        # Reading past the end moves nothing: a short transfer, the caller's to finish or refuse.
        assert uring.transfer(False, fd, [buf], 4 * PAGE) == 0
    finally:
        os.close(fd)


@pytest.mark.slow
def test_entries_written_and_read_by_many_threads_through_the_ring(direct_dir, fresh_registry):
    """8 threads at once, entries of several sizes (one page to 40 MiB + a partial page: the hash-beside-write path
    and the pipelined reads), every completion handed to its own waiter: every byte comes back."""
    sizes = [1, PAGE, 3 * PAGE + 17, (1 << 20) + 5, 16 << 20, (40 << 20) + 123, (70 << 20) + 9]
    src = _random(72 << 20, 4)
    uring.offer_view(src)
    errors = []

    def worker(t):
        try:
            dst = aligned_buffer(72 << 20)
            uring.offer_view(dst)
            for i, n in enumerate(sizes):
                start = ((t * 7 + i) % 8) * PAGE
                path = str(direct_dir / file_name_for(f"k{t}-{i}"))
                write_entry(path, f"k{t}-{i}", [src[start : start + n]], IOMode.DIRECT)
                read_entry(path, f"k{t}-{i}", n, IOMode.DIRECT, dst[:n])
                assert bytes(dst[:n]) == bytes(src[start : start + n]), (t, n)
        except Exception as exc:  # handed to the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors, errors
    # Each entry once written and once read through the ring, but the 1-byte one (a header and a tail page: kvtier's).
    assert fresh_registry.fixed_ops >= 8 * (len(sizes) - 1) * 2


def test_a_header_page_not_registered_goes_in_the_same_batch(direct_dir, fresh_registry):
    """An entry read into registered memory: the header page and the tail page are kvtier's own (not registered), the
    body is the caller's; all three go through the ring in one batch, and nothing at all for memory not offered."""
    n = (3 << 20) + 17
    src, dst = _random(n, 5), aligned_buffer(n)
    path = str(direct_dir / file_name_for("k"))
    write_entry(path, "k", [src[:n]], IOMode.DIRECT)
    assert fresh_registry.fixed_ops == 0  # src was not offered: preadv/pwritev
    uring.offer_view(dst)
    read_entry(path, "k", n, IOMode.DIRECT, dst[:n])
    assert bytes(dst[:n]) == bytes(src[:n])
    assert fresh_registry.fixed_ops == 1


def test_memory_freed_and_mapped_again_at_the_same_address_is_read_again_without_the_ring(direct_dir, fresh_registry):
    """LMCache frees its CPU buffer itself (munmap), and another buffer may then be mapped at the same address while a
    registration still holds the old pages: the kernel would read into those. The checksum fails on the caller's
    memory; kvtier reads once more without the ring, serves the entry and withdraws the stale registration."""
    n = 4 << 20
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    prot, flags = mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    addr = libc.mmap(None, n, prot, flags, -1, 0)
    first = memoryview((ctypes.c_char * n).from_address(addr)).cast("B")
    uring.offer(None, addr, n, tag="owner")
    path = str(direct_dir / file_name_for("k"))
    src = _random(n, 6)
    write_entry(path, "k", [src], IOMode.DIRECT)
    read_entry(path, "k", n, IOMode.DIRECT, first)  # registers the old pages
    assert bytes(first[:64]) == bytes(src[:64])
    assert fresh_registry.fixed_ops == 1 and fresh_registry.covers(addr)
    del first
    assert libc.munmap(addr, n) == 0
    again = libc.mmap(ctypes.c_void_p(addr), n, prot, flags | 0x10, -1, 0)  # MAP_FIXED: the same address
    assert again == addr
    second = memoryview((ctypes.c_char * n).from_address(addr)).cast("B")
    try:
        read_entry(path, "k", n, IOMode.DIRECT, second)
        assert bytes(second) == bytes(src)
        assert fresh_registry.fixed_ops == 2  # the first try went through the ring (into the old pages)
        assert not fresh_registry.covers(addr)  # withdrawn
    finally:
        del second
        libc.munmap(addr, n)


def test_a_closing_backend_withdraws_what_its_adapter_offered(tmp_path, fresh_registry):
    from kvconnector.backend import KvtierBackend
    from kvconnector.backend_config import BackendConfig

    one = KvtierBackend(BackendConfig(disk_dir=str(tmp_path / "a"), disk_capacity_gb=0.01, snapshot_path=""))
    two = KvtierBackend(BackendConfig(disk_dir=str(tmp_path / "b"), disk_capacity_gb=0.01, snapshot_path=""))
    a, b = aligned_buffer(1 << 20), aligned_buffer(1 << 20)
    uring.offer(a, uring.address(a), len(a), tag=one)  # as byte_view does for LMCache's buffers
    uring.offer(b, uring.address(b), len(b), tag=two)
    one.close()
    left = [r.tag for r in fresh_registry._regions if r.tag is not None]
    two.close()
    assert left == [two]
    assert not [r for r in fresh_registry._regions if r.tag is not None]


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="drops CAP_IPC_LOCK with setpriv (root)")
def test_without_the_right_to_pin_everything_goes_through_preadv(tmp_path):
    """A process that may pin nothing (RLIMIT_MEMLOCK 0, no CAP_IPC_LOCK): registration fails, entries are still
    written and read back exactly, and nothing went through the ring."""
    if not probe_direct(str(tmp_path)):
        pytest.skip("no O_DIRECT here")
    code = f"""
import numpy as np
from kvconnector import uring
from kvconnector.timed_io import IOMode, aligned_buffer, read_entry, write_entry
src, dst = aligned_buffer(4 << 20), aligned_buffer(4 << 20)
src[:] = np.random.default_rng(0).integers(0, 256, 4 << 20, dtype=np.uint8).tobytes()
uring.offer_view(src); uring.offer_view(dst)
write_entry({str(tmp_path / "e")!r}, "k", [src], IOMode.DIRECT)
read_entry({str(tmp_path / "e")!r}, "k", 4 << 20, IOMode.DIRECT, dst)
assert bytes(dst) == bytes(src)
print("fixed", uring.registry.fixed_ops, "pinned", uring.registry.pinned)
"""
    cmd = ["prlimit", "--memlock=0", "setpriv", "--inh-caps=-ipc_lock", "--bounding-set=-ipc_lock", sys.executable]
    out = subprocess.run([*cmd, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "fixed 0 pinned 0" in out.stdout


def test_a_damaged_or_short_entry_read_in_pieces_through_the_ring_is_refused(direct_dir, fresh_registry):
    """Two and a half pieces + 5 bytes read into registered memory: submitted whole, each piece hashed as it lands. A
    flipped byte in the last piece and a file cut short are both refused, never served."""
    from kvconnector import timed_io
    from kvconnector.errors import CorruptEntryError

    piece = timed_io.RING_PIECE_BYTES
    n = 2 * piece + piece // 2 + 5
    src, dst = _random(n, 7), aligned_buffer(n)
    uring.offer_view(dst)
    path = direct_dir / file_name_for("k")
    write_entry(str(path), "k", [src[:n]], IOMode.DIRECT)
    read_entry(str(path), "k", n, IOMode.DIRECT, dst[:n])
    assert bytes(dst[:n]) == bytes(src[:n]) and fresh_registry.fixed_ops == 1  # the read, one batch
    with open(path, "r+b") as fh:
        fh.seek(PAGE + 2 * piece + 7)
        b = fh.read(1)
        fh.seek(PAGE + 2 * piece + 7)
        fh.write(bytes([b[0] ^ 1]))
    with pytest.raises(CorruptEntryError, match="checksum"):
        read_entry(str(path), "k", n, IOMode.DIRECT, dst[:n])
    os.truncate(path, PAGE + piece + piece // 2)
    with pytest.raises(CorruptEntryError, match="shorter"):
        read_entry(str(path), "k", n, IOMode.DIRECT, dst[:n])


def test_the_address_of_writable_read_only_sliced_and_empty_views():
    """uring.address takes ctypes' quick way for writable memory and numpy's for read-only: both give where the
    view's bytes are (an offset view included), which the ring hands to the kernel."""
    m = mmap.mmap(-1, 2 * PAGE)
    ro = bytes(range(256)) * 64
    for view in (memoryview(m), memoryview(m)[PAGE + 3 :], memoryview(ro), memoryview(ro)[17:]):
        assert uring.address(view) == np.frombuffer(view, dtype=np.uint8).ctypes.data
    assert ctypes.string_at(uring.address(memoryview(ro)[17:]), 4) == ro[17:21]
    assert uring.address(memoryview(m)[:0]) == 0
    m.close()  # no export of the mmap's buffer outlives the call
