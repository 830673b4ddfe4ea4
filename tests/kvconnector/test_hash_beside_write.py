"""Large entries are checksummed on a hash thread while their payload is written; the header (with the checksum) is
written by that thread. These tests check that the file is the same as ever, that the write still fails cleanly, and
that the hash really leaves the writer's thread (where it cost a quarter of a 16 MiB write's time)."""

import errno
import os
import resource
import threading

import numpy as np
import pytest

import kvconnector.timed_io as tio
from kvconnector.entry_format import PAGE, checksum, file_nbytes, spare_name
from kvconnector.errors import CorruptEntryError
from kvconnector.timed_io import IOMode, aligned_buffer, probe_direct, read_entry, read_header, write_entry

BIG = 2 * tio.OVERLAP_MIN_BYTES + 17  # a partial last page: the tail goes through the scratch page


@pytest.fixture(params=[IOMode.BUFFERED, IOMode.DIRECT], ids=lambda m: m.name)
def mode(request, tmp_path):
    if request.param is IOMode.DIRECT and not probe_direct(str(tmp_path)):
        pytest.skip(f"the filesystem of {tmp_path} refuses O_DIRECT")
    return request.param


@pytest.fixture
def hash_threads(monkeypatch):
    """The threads the checksum of each write ran on (the real checksum, recorded)."""
    seen = []

    def recording(chunks):
        seen.append(threading.get_ident())
        return checksum(chunks)

    monkeypatch.setattr(tio, "checksum", recording)
    return seen


def _payload(n, seed):
    buf = aligned_buffer(n)
    buf[:n] = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()
    return buf[:n]


def _fds():
    return len(os.listdir("/proc/self/fd"))


def test_large_entry_hashed_on_another_thread_small_one_inline(tmp_path, mode, hash_threads):
    big, small = _payload(BIG, 1), _payload(64 << 10, 2)
    # Several chunks, one misaligned: in direct mode the payload is copied into scratch, the hash reads the chunks.
    odd = memoryview(bytearray(b"y" * 5001))[1:]
    chunks = [big[: 1 << 20], odd, big[1 << 20 :]]
    nbytes = sum(len(c) for c in chunks)
    path = str(tmp_path / "big.kv")
    w = write_entry(path, "big", chunks, mode, shape=(nbytes,))
    assert hash_threads and hash_threads[-1] != threading.get_ident()
    assert w.nbytes == nbytes and w.device_ns > 0 and w.host_ns >= 0
    hdr = read_header(path)
    assert (hdr.key, hdr.payload_nbytes, hdr.shape, hdr.checksum) == ("big", nbytes, (nbytes,), checksum(chunks))
    assert os.path.getsize(path) == file_nbytes(nbytes)
    dest = aligned_buffer(nbytes)[:nbytes]
    read_entry(path, "big", nbytes, mode, dest=dest)
    assert bytes(dest) == b"".join(bytes(c) for c in chunks)

    write_entry(str(tmp_path / "small.kv"), "small", [small], mode)
    assert hash_threads[-1] == threading.get_ident()
    read_entry(str(tmp_path / "small.kv"), "small", len(small), mode)
    assert sorted(os.listdir(tmp_path)) == ["big.kv", "small.kv"]


def test_spare_overwritten_by_a_large_entry_shows_nothing_of_the_old_one(tmp_path, mode):
    old, new = _payload(BIG, 3), _payload(BIG, 4)
    spare = str(tmp_path / spare_name(0))
    write_entry(spare, "old", [old], mode)
    path = str(tmp_path / "new.kv")
    write_entry(path, "new", [new], mode, spare=spare)
    assert os.listdir(tmp_path) == ["new.kv"]
    assert read_header(path).key == "new"
    dest = aligned_buffer(BIG)[:BIG]
    read_entry(path, "new", BIG, mode, dest=dest)
    assert bytes(dest) == bytes(new)
    with pytest.raises(CorruptEntryError):
        read_entry(path, "old", BIG, mode)


def test_failed_hash_fails_the_write_and_leaves_no_file(tmp_path, mode, monkeypatch):
    def failing(chunks):
        raise OSError(errno.EIO, "injected: the hash thread failed")

    monkeypatch.setattr(tio, "checksum", failing)
    fds = _fds()
    with pytest.raises(OSError, match="injected"):
        write_entry(str(tmp_path / "e.kv"), "e", [_payload(BIG, 5)], mode)
    assert os.listdir(tmp_path) == [] and _fds() == fds


def test_failed_payload_write_waits_for_the_header_and_leaves_no_file(tmp_path, mode):
    """A real short write: the process's file-size limit stops the payload halfway (EFBIG), while the header write
    at offset 0 succeeds. The write fails as a whole, its spare is removed, and no descriptor is left open."""
    spare = str(tmp_path / spare_name(0))
    write_entry(spare, "old", [_payload(BIG, 6)], mode)  # a spare: no fallocate, so the payload write is what fails
    fds = _fds()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (tio.OVERLAP_MIN_BYTES, hard))  # Python ignores SIGXFSZ
    try:
        with pytest.raises(OSError) as err:
            write_entry(str(tmp_path / "new.kv"), "new", [_payload(BIG, 7)], mode, spare=spare)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert err.value.errno == errno.EFBIG
    assert os.listdir(tmp_path) == [] and _fds() == fds


@pytest.mark.slow
def test_host_time_excludes_a_hash_hidden_under_the_write(tmp_path, monkeypatch):
    """With the hash made slow (a real hash plus a sleep standing for a slow CPU) and the payload write slower still
    (a sleep inside the timed system call), the hash ends inside the write: it is not host time. Run serially the
    same write counts the whole hash as host time: what this test tells apart. The sleeps are long enough (200 ms
    hash, 600 ms write) that the other host work of a write may take 150 ms on a loaded machine without blurring it."""
    from time import sleep

    def slow_hash(chunks):
        sleep(0.2)
        return checksum(chunks)

    real_pwritev = os.pwritev

    def slow_pwritev(fd, iov, offset):
        if offset >= PAGE:  # the payload, not the header page
            sleep(0.6)
        return real_pwritev(fd, iov, offset)

    monkeypatch.setattr(tio, "checksum", slow_hash)
    monkeypatch.setattr(tio.os, "pwritev", slow_pwritev)
    path = str(tmp_path / "e.kv")
    beside = write_entry(path, "e", [_payload(BIG, 8)], IOMode.BUFFERED)
    monkeypatch.setattr(tio, "OVERLAP_MIN_BYTES", 1 << 62)
    serial = write_entry(path, "e", [_payload(BIG, 8)], IOMode.BUFFERED)
    assert serial.host_ns >= 200_000_000, serial  # the sleep in the hash, on the writer's thread
    assert beside.host_ns < 150_000_000, beside  # hidden under the 600 ms payload write
