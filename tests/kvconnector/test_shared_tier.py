"""A shared directory used by several backends at once (as several LMCache instances would)."""

import threading

import numpy as np
import pytest

from kvconnector.backend import KvtierBackend
from kvconnector.backend_config import BackendConfig
from kvconnector.entry_format import file_name_for
from kvconnector.errors import EntryNotFound
from kvconnector.shared_tier import SharedDirTier
from kvconnector.timed_io import aligned_buffer

N = 64 * 1024


def payload(seed, n=N):
    buf = aligned_buffer(n)[:n]
    buf[:] = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()
    return buf


def backend(shared, **kw):
    return KvtierBackend(
        BackendConfig(shared_dir=str(shared), shared_capacity_gb=kw.pop("cap", 0.01), snapshot_path="", **kw)
    )


@pytest.mark.slow
def test_reader_never_sees_a_partial_file_while_another_instance_rewrites_and_evicts(tmp_path):
    a, b = backend(tmp_path / "s"), backend(tmp_path / "s")
    try:
        data = {i: bytes(payload(i)) for i in range(4)}
        errors, reads = [], [0]
        stop = threading.Event()

        def writer():
            i = 0
            while not stop.is_set():
                k = f"k{i % 4}"
                a.remove(k)  # A evicts ...
                a.put(k, [memoryview(data[i % 4])])  # ... and writes it again, while B reads
                i += 1

        def reader():
            dest = memoryview(bytearray(N))
            while not stop.is_set():
                for j in range(4):
                    if b.get_into(f"k{j}", dest):
                        reads[0] += 1
                        if bytes(dest) != data[j]:
                            errors.append(j)

        ts = [threading.Thread(target=writer), threading.Thread(target=reader)]
        for t in ts:
            t.start()
        threading.Event().wait(1.5)
        stop.set()
        for t in ts:
            t.join()
        assert not errors and reads[0] > 10
        ev = b.store.stats[0].events
        assert b.events_snapshot()["shared_adopted"] > 0  # B found A's entries without being told
        assert ev["corrupt_dropped"] == 0  # a torn file would show here: rename makes it impossible
    finally:
        a.close()
        b.close()


def test_open_reader_survives_unlink(tmp_path):
    t = SharedDirTier(str(tmp_path / "s"), 10 << 20)
    t.write("k", [payload(1)], N)
    # Another instance unlinks the file between our open and our read: POSIX keeps the open file readable.
    import os

    path = t.path_for("k")
    fd = os.open(path, os.O_RDONLY)
    os.unlink(path)
    try:
        with open(f"/proc/self/fd/{fd}", "rb") as fh:
            assert len(fh.read()) == 4096 + N
    finally:
        os.close(fd)
    with pytest.raises(EntryNotFound):
        t.read("k", N, memoryview(bytearray(N)))
    assert t.probe("k") is None


def test_probe_ignores_and_removes_corrupt_files_and_stale_tmp_only(tmp_path):
    s = tmp_path / "s"
    a = backend(s)
    a.put("good", [payload(2)])
    a.close()
    t = SharedDirTier(str(s), 10 << 20)
    (s / t.path_for("bad").split("/")[-1]).write_bytes(b"KVTR" + bytes(5000))
    young = s / (file_name_for("in-flight") + ".tmp999-1")  # another instance's write in flight
    young.write_bytes(b"in flight")
    b = backend(s)
    try:
        assert b.lookup("good") and not b.lookup("bad")
        rep = b.rescan_reports[0]
        assert rep["corrupt_removed"] == 1 and rep["stale_tmp_removed"] == 0 and young.exists()
    finally:
        b.close()


def test_only_tiers_other_instances_write_are_shared_tiers():
    from kvconnector.redis_tier import RedisTier
    from kvconnector.shared_tier import SharedTier
    from kvconnector.tiers import CPUTier, DiskTier

    assert issubclass(SharedDirTier, SharedTier) and issubclass(RedisTier, SharedTier)
    assert not issubclass(DiskTier, SharedTier) and not issubclass(CPUTier, SharedTier)


def test_a_failed_unlink_on_a_network_file_system_does_not_fail_the_removal(tmp_path, monkeypatch):
    import errno
    import os

    b = backend(tmp_path / "s")
    try:
        assert b.put("k", [payload(3)])
        path = b.store.tiers[0].path_for("k")

        def unreachable(p, *a, **kw):
            raise OSError(errno.ENOTCONN, "Transport endpoint is not connected", p)

        monkeypatch.setattr(os, "unlink", unreachable)  # a brick down, the link cut
        assert b.remove("k")  # forgotten here; the file is left for a later rescan
        monkeypatch.undo()
        assert b.store.tiers[0].fallbacks["delete_errors"] == 1 and os.path.exists(path)
        assert b.put("k", [payload(3)])  # the key can be stored again
    finally:
        b.close()


def test_a_stale_file_handle_is_a_miss_like_a_vanished_file(tmp_path, monkeypatch):
    import errno

    from kvconnector import shared_tier, tiers

    a, b = backend(tmp_path / "s"), backend(tmp_path / "s")
    try:
        assert a.put("k", [payload(4)]) and b.lookup("k")

        def stale(path, *a, **kw):  # what a GlusterFS client answers for a name it cached, removed by another client
            raise OSError(errno.ESTALE, "Stale file handle", path)

        monkeypatch.setattr(tiers, "read_entry", stale)
        monkeypatch.setattr(shared_tier, "read_header", stale)
        assert not b.get_into("k", memoryview(bytearray(N)))
        assert b.store.stats[0].events["vanished"] == 1 and "load_errors" not in b.events_snapshot()
        assert not b.lookup("k") and "probe_errors" not in b.store.tiers[0].fallbacks
    finally:
        a.close()
        b.close()


def test_a_rescan_with_less_room_than_the_directory_holds_deletes_nothing_and_keeps_the_newest(tmp_path):
    import os

    shared = tmp_path / "shared"
    a = backend(shared)
    keys = [f"k{i}" for i in range(10)]
    for i, k in enumerate(keys):
        assert a.put(k, [payload(i)])
        os.utime(shared / file_name_for(k), ns=(i * 10**9, i * 10**9))  # k9 the newest
    a.close()
    # b's shared tier keeps about 3 entries of N bytes (the store fills its tiers to 0.9 of their capacity)
    b = backend(shared, cap=3.5 * N / 0.9 / 2**30)
    try:
        held = b.store.contains  # the index only (a lookup would also probe the directory)
        kept = [k for k in keys if held(k)]
        assert kept == keys[-len(kept) :] and 0 < len(kept) < len(keys)  # the newest that fit
        assert sorted(p.name for p in shared.iterdir() if p.name.endswith(".kv")) == sorted(map(file_name_for, keys))
        # its LRU follows the files' age: a new entry evicts the oldest adopted one first
        assert b.put("new", [payload(99)])
        assert not held(kept[0]) and all(held(k) for k in kept[1:])
    finally:
        b.close()
