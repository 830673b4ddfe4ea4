import os
from pathlib import Path

import numpy as np
import pytest

from kvconnector.entry_format import PAGE, file_name_for, file_nbytes
from kvconnector.errors import CorruptEntryError
from kvconnector.timed_io import (
    PIPELINE_MIN_BYTES,
    READ_PIECE_BYTES,
    IOMode,
    aligned_buffer,
    probe_direct,
    read_entry,
    read_header,
    write_entry,
)


@pytest.fixture(params=[IOMode.BUFFERED, IOMode.DIRECT], ids=lambda m: m.name)
def mode(request, tmp_path):
    if request.param is IOMode.DIRECT and not probe_direct(str(tmp_path)):
        pytest.skip(f"the filesystem of {tmp_path} refuses O_DIRECT; pytest --basetemp=<dir on ext4/xfs> runs these")
    return request.param


def _payload(n, seed=0):
    buf = aligned_buffer(n)
    buf[:n] = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()
    return buf[:n]


@pytest.mark.parametrize("n", [1, PAGE - 1, PAGE, 3 * PAGE + 17, 1 << 20])
def test_round_trip_is_byte_exact_into_dest_and_sink(tmp_path, mode, n):
    src = _payload(n, seed=n)
    path = str(tmp_path / file_name_for("k"))
    w = write_entry(path, "k", [src], mode, shape=(n,), dtype="uint8")
    assert w.nbytes == n and w.device_ns > 0 and w.host_ns > 0
    assert os.path.getsize(path) == file_nbytes(n)
    dest = aligned_buffer(n)[:n]
    r = read_entry(path, "k", n, mode, dest=dest)
    assert bytes(dest) == bytes(src) and r.nbytes == n and r.device_ns > 0
    # misaligned destination: still exact (copied through scratch)
    odd = memoryview(bytearray(n + 1))[1:]
    read_entry(path, "k", n, mode, dest=odd)
    assert bytes(odd) == bytes(src)
    read_entry(path, "k", n, mode)  # sink read verifies the checksum
    hdr = read_header(path)
    assert (hdr.key, hdr.payload_nbytes, hdr.shape) == ("k", n, (n,))


def test_multi_chunk_payload_and_unaligned_chunks(tmp_path, mode):
    a, b = _payload(2 * PAGE, 1), _payload(5000, 2)
    odd = memoryview(bytearray(b"x" * 100))[3:]
    path = str(tmp_path / "e.kv")
    write_entry(path, "k", [a, odd, b], mode)
    dest = aligned_buffer(len(a) + len(odd) + len(b))[: len(a) + len(odd) + len(b)]
    read_entry(path, "k", len(dest), mode, dest=dest)
    assert bytes(dest) == bytes(a) + bytes(odd) + bytes(b)


def test_corruption_is_detected_never_served(tmp_path, mode):
    src = _payload(3 * PAGE)
    path = str(tmp_path / "e.kv")
    write_entry(path, "k", [src], mode)
    with pytest.raises(CorruptEntryError, match="expected"):
        read_entry(path, "other", len(src), mode)
    with open(path, "r+b") as f:  # flip one payload byte
        f.seek(PAGE + 100)
        byte = f.read(1)
        f.seek(PAGE + 100)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(CorruptEntryError, match="checksum"):
        read_entry(path, "k", len(src), mode)
    os.truncate(path, PAGE + PAGE)
    with pytest.raises(CorruptEntryError):
        read_entry(path, "k", len(src), mode)
    with pytest.raises(CorruptEntryError, match="truncated"):
        read_header(path)
    with open(path, "r+b") as f:
        f.write(b"JUNK")
    with pytest.raises(CorruptEntryError, match="magic"):
        read_header(path)


def test_no_temp_files_left_and_file_names_never_hold_the_key(tmp_path):
    key = "../../etc/passwd@1@0@abc@bf16"
    name = file_name_for(key)
    assert "/" not in name and ".." not in name and len(name) == 35
    write_entry(str(tmp_path / name), key, [_payload(100)], IOMode.BUFFERED)
    assert os.listdir(tmp_path) == [name]
    assert oct(os.stat(tmp_path / name).st_mode & 0o777) == "0o600"


@pytest.mark.parametrize(
    "n", [PIPELINE_MIN_BYTES, PIPELINE_MIN_BYTES + 2 * READ_PIECE_BYTES + 17, PIPELINE_MIN_BYTES + PAGE]
)
@pytest.mark.slow
def test_large_entries_read_in_pieces_are_byte_exact_everywhere(tmp_path, mode, n):
    # Read in pieces, each hashed while the next is read: into an aligned destination, a misaligned one, and no
    # destination (two scratch buffers in turn), with and without a partial last page.
    src = _payload(n, seed=n)
    path = str(tmp_path / "big.kv")
    write_entry(path, "k", [src], mode)
    dest = aligned_buffer(n)[:n]
    read_entry(path, "k", n, mode, dest=dest)
    assert bytes(dest) == bytes(src)
    odd = memoryview(bytearray(n + 1))[1:]
    read_entry(path, "k", n, mode, dest=odd)
    assert bytes(odd) == bytes(src)
    read_entry(path, "k", n, mode)


@pytest.mark.parametrize("where", ["first piece", "middle piece", "last page"])
def test_large_entries_corrupt_anywhere_are_refused(tmp_path, mode, where):
    n = PIPELINE_MIN_BYTES + 17
    src = _payload(n)
    path = str(tmp_path / "big.kv")
    write_entry(path, "k", [src], mode)
    at = PAGE + {"first piece": 5, "middle piece": READ_PIECE_BYTES + 3, "last page": n - 1}[where]
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 1]))
    for dest in (aligned_buffer(n)[:n], memoryview(bytearray(n + 1))[1:], None):
        with pytest.raises(CorruptEntryError, match="checksum"):
            read_entry(path, "k", n, mode, dest=dest)
    with pytest.raises(CorruptEntryError, match="expected"):
        read_entry(path, "other", n, mode)
    os.truncate(path, PAGE + 2 * READ_PIECE_BYTES)  # ends between pieces
    with pytest.raises(CorruptEntryError, match="shorter"):
        read_entry(path, "k", n, mode)


def _anon_huge_kb(view: memoryview) -> int:
    """AnonHugePages of the mapping that holds `view`, from /proc/self/smaps."""
    start = np.frombuffer(view, dtype=np.uint8).ctypes.data
    inside = False
    with open("/proc/self/smaps") as smaps:
        lines = smaps.readlines()
    for line in lines:
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= start < hi
        elif inside and head == "AnonHugePages:":
            return int(line.split()[1])
    return 0


THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


@pytest.mark.skipif(not THP.exists() or "[never]" in THP.read_text(), reason="transparent huge pages disabled")
def test_long_lived_buffers_are_on_huge_pages_and_others_are_not():
    """O_DIRECT pins every page of a transfer: the buffers that carry them for a long time (a thread's scratch, the
    benchmark's payload) ask for 2 MiB pages, so 512x fewer are pinned; short-lived ones keep 4 KiB pages."""
    huge, small = aligned_buffer(16 << 20, huge=True), aligned_buffer(16 << 20)
    assert _anon_huge_kb(huge) >= 8 << 10  # at least half of it, whatever the kernel could not compact
    assert _anon_huge_kb(small) == 0
    assert bytes(huge[:PAGE]) == bytes(PAGE)  # zero-filled like any anonymous memory


def test_a_threads_scratch_grows_in_few_steps_and_holds_the_read_pieces():
    """Every new scratch buffer is zeroed by the kernel (on this VM first-touched huge pages cost up to 2.4 CPU-s per
    GiB), so a thread meeting ever larger entries grows its buffer at least twofold, and the two buffers a pipelined
    read alternates between are the halves of that one buffer, disjoint."""
    from kvconnector.timed_io import Scratch

    sc = Scratch()
    made = []
    for n in (17 << 20, 20 << 20, 25 << 20, 30 << 20, 34 << 20):
        buf = sc.data_buffer(n)
        assert len(buf) == n
        if not made or made[-1] is not sc.data:
            made.append(sc.data)
    assert len(made) == 2 and len(made[1]) >= 34 << 20  # 17 MiB, then 34: not one buffer per size
    a, b = sc.piece_buffer(0, PAGE + READ_PIECE_BYTES), sc.piece_buffer(1, READ_PIECE_BYTES)
    a[:] = b"\x01" * len(a)
    b[:] = b"\x02" * len(b)
    assert set(bytes(a)) == {1} and set(bytes(b)) == {2}
    base = np.frombuffer(sc.data, dtype=np.uint8).ctypes.data
    for view in (a, b):
        addr = np.frombuffer(view, dtype=np.uint8).ctypes.data
        assert base <= addr and addr + len(view) <= base + len(sc.data)
