"""Spare files: a deleted entry's file is overwritten in place by the next entry of its size."""

import os

import pytest
from store_helpers import data, put, read

from kvconnector.entry_format import MARKER_NAME, file_nbytes
from kvconnector.persistence import rescan_dir
from kvconnector.store import TieredStore
from kvconnector.tiers import DiskTier
from kvconnector.timed_io import IOMode

KB = 1024


def entry_files(d):
    return sorted(n for n in os.listdir(d) if n.endswith(".kv"))


def tier_files(d):
    """Everything in the tier directory but its marker."""
    return sorted(n for n in os.listdir(d) if n != MARKER_NAME)


def disk_bytes(d):
    return sum(os.stat(os.path.join(d, n)).st_size for n in tier_files(d))


@pytest.mark.parametrize("mode", [IOMode.DIRECT, IOMode.BUFFERED])
def test_evicted_file_is_reused_in_place_and_disk_stays_within_capacity(tmp_path, mode):
    d = tmp_path / "disk"
    tier = DiskTier(str(d), 1024 * KB, mode, spare_ratio=0.2)
    s = TieredStore([tier])
    for i in range(12):
        assert put(s, f"k{i}", 64 * KB).stored
    old_inode = os.stat(tier.path_for("k0")).st_ino
    assert tier.counters["spare_writes"] == 0
    # 13 x 64 KB > 0.8 x 1 MB: k0 is evicted to make room, and its file takes the new entry.
    assert put(s, "new", 64 * KB).stored
    assert s.contains("k0") is None
    assert tier.counters["spare_writes"] == 1
    assert os.stat(tier.path_for("new")).st_ino == old_inode  # overwritten in place, not a new file
    res, got = read(s, "new", 64 * KB)
    assert res.hit and got == data("new", 64 * KB)  # nothing of the old entry shows through
    for i in range(12, 40):
        put(s, f"k{i}", 64 * KB)
        assert disk_bytes(d) <= tier.capacity_bytes
    for k in s.keys_by_tier()["disk"]:
        res, got = read(s, k, 64 * KB)
        assert res.hit and got == data(k, 64 * KB)
    assert len(entry_files(d)) == len(s) and tier.counters["spare_writes"] > 20
    s.delete(s.keys_by_tier()["disk"][0])  # a spare with nobody to take it
    assert tier.describe()["spare_bytes"] == file_nbytes(64 * KB)
    s.close()
    assert tier_files(d) == entry_files(d)  # close removes the spares


def test_spare_of_another_size_is_not_used_and_restart_removes_spares(tmp_path):
    d = tmp_path / "disk"
    tier = DiskTier(str(d), 1024 * KB, IOMode.BUFFERED, spare_ratio=0.2)
    s = TieredStore([tier])
    put(s, "a", 64 * KB)
    assert s.delete("a")
    assert tier.describe()["spare_bytes"] == file_nbytes(64 * KB)
    put(s, "b", 32 * KB)
    assert tier.counters["spare_writes"] == 0 and tier.describe()["spare_bytes"] == file_nbytes(64 * KB)
    # A crash leaves spares behind (no close): the next start's rescan removes them and keeps the entries. The
    # kernel drops a dead process's lock on the directory; here the first tier lives on, so it lets go by hand.
    tier._release_dir()
    s2 = TieredStore([DiskTier(str(d), 1024 * KB, IOMode.BUFFERED)])
    report = rescan_dir(s2, 0)
    assert report.adopted == 1 and report.stale_tmp_removed == 1
    assert entry_files(d) == tier_files(d)
    res, got = read(s2, "b", 32 * KB)
    assert res.hit and got == data("b", 32 * KB)


def test_no_spares_when_ratio_is_zero(tmp_path):
    d = tmp_path / "disk"
    tier = DiskTier(str(d), 1024 * KB, IOMode.BUFFERED, spare_ratio=0.0)
    s = TieredStore([tier])
    put(s, "a", 64 * KB)
    s.delete("a")
    assert tier_files(d) == []
