"""The directory tiers' durability policy (`sync`): `entry` makes each write durable before it returns (fdatasync of
the file, fsync of its directory), `none` leaves that to the kernel's writeback. Both keep every other guarantee:
verified reads, atomic visibility, restart recovery. The system calls are observed with strace on a real process."""

import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
from store_helpers import data, put, read

from kvconnector.backend import KvtierBackend
from kvconnector.backend_config import BackendConfig
from kvconnector.entry_format import PAGE, file_name_for
from kvconnector.errors import ConfigError
from kvconnector.persistence import rescan_dir
from kvconnector.shared_tier import SharedDirTier
from kvconnector.store import TieredStore
from kvconnector.tiers import DiskTier
from kvconnector.timed_io import Sync, probe_direct

needs_strace = pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")

# Puts entries of every write path (sub-page, page-aligned, unaligned, 1 MiB and more: the checksum beside the write,
# in registered memory through io_uring too), overwrites a spare, and removes one, into a tier of the given kind, I/O
# mode and sync policy. The tier's directory is claimed beforehand by the parent, so the marker's own fsync (written
# once, when a directory becomes a tier) is not in the trace.
SCRIPT = textwrap.dedent(
    """
    import sys
    from kvconnector import uring
    from kvconnector.shared_tier import SharedDirTier
    from kvconnector.tiers import DiskTier
    from kvconnector.timed_io import aligned_buffer

    kind, directory, io_mode, sync = sys.argv[1:5]
    if kind == "disk":
        tier = DiskTier(directory, 1 << 30, io_mode, spare_ratio=0.5, sync=sync)
    else:
        tier = SharedDirTier(directory, 1 << 30, io_mode, sync=sync)
    plain = aligned_buffer(3 << 20)
    registered = aligned_buffer(3 << 20)
    uring.offer_view(registered)
    sizes = [1000, 4096, 65_537, 1 << 20, (2 << 20) + 5]
    n = 0
    for buf in (plain, registered):
        for size in sizes:
            tier.write(f"k{n}", [buf[:size]], size)
            n += 1
    tier.delete("k0")  # a spare in the disk tier
    tier.write("again", [plain[:1000]], 1000)
    print(n + 1)
    """
)


def traced_syncs(tmp_path, kind: str, io_mode: str, sync: str) -> tuple[int, list[str]]:
    """(writes done, every fsync/fdatasync/sync_file_range/syncfs/sync line the script's process made)."""
    directory = tmp_path / kind
    claim = DiskTier(str(directory)) if kind == "disk" else SharedDirTier(str(directory), 1 << 30)
    claim.close()
    out = tmp_path / "strace.txt"
    done = subprocess.run(
        ["strace", "-f", "-qq", "-y", "-o", str(out), "-e", "trace=fsync,fdatasync,sync_file_range,syncfs,sync"]
        + [sys.executable, "-c", SCRIPT, kind, str(directory), io_mode, sync],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    calls = [line for line in out.read_text().splitlines() if re.search(r"\b(f(data)?sync|sync\w*)\(", line)]
    return int(done.stdout), calls


def io_modes(tmp_path) -> list[str]:
    return ["buffered", "direct"] if probe_direct(str(tmp_path)) else ["buffered"]


@needs_strace
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["disk", "shared"])
def test_sync_none_makes_no_sync_call_and_entry_syncs_every_write(tmp_path, kind):
    for io_mode in io_modes(tmp_path):
        writes, calls = traced_syncs(tmp_path / f"none-{io_mode}", kind, io_mode, "none")
        assert writes == 11 and calls == [], f"{io_mode}: sync none made sync calls: {calls}"
        writes, calls = traced_syncs(tmp_path / f"entry-{io_mode}", kind, io_mode, "entry")
        directory = str(tmp_path / f"entry-{io_mode}" / kind)
        files = [c for c in calls if re.search(r"fdatasync\(\d+<" + re.escape(directory) + r"/", c)]
        dirs = [c for c in calls if re.search(r"fsync\(\d+<" + re.escape(directory) + r">", c)]
        assert len(files) == writes == 11, (io_mode, calls)  # one fdatasync per written entry file
        assert len(dirs) == writes, (io_mode, calls)  # one writer at a time: each its own directory fsync


@pytest.mark.parametrize("sync", ["entry", "none"])
def test_each_policy_serves_what_was_put_and_a_restart_finds_it(tmp_path, sync):
    sizes = {"tiny": 1, "sub-page": 1000, "page": PAGE, "odd": 65_537, "beside": (1 << 20) + 3}
    for io_mode in io_modes(tmp_path):
        d = str(tmp_path / io_mode)
        store = TieredStore([DiskTier(d, 16 << 20, io_mode, spare_ratio=0.5, sync=sync)])
        assert store.tiers[0].describe()["sync"] == sync
        for key, n in sizes.items():
            assert put(store, key, n).stored
        store.delete("odd")  # kept as a spare, then overwritten in place
        assert put(store, "odd2", 65_537).stored
        for key, n in {**sizes, "odd2": 65_537}.items():
            if key != "odd":
                res, got = read(store, key, n)
                assert res.hit and got == data(key, n), (io_mode, key)
        store.close()
        again = TieredStore([DiskTier(d, 16 << 20, io_mode, sync=sync)])
        report = rescan_dir(again, 0)
        assert report.adopted == len(sizes) and report.corrupt_removed == 0 and report.stale_tmp_removed == 0
        # Torn or stale bytes under an entry's name, as a power cut may leave them with `none`: never served.
        with open(os.path.join(d, file_name_for("beside")), "r+b") as fh:
            fh.seek(PAGE + 12345)
            fh.write(b"\0" * 4096)  # a payload block that never reached the device
        res, _ = read(again, "beside", (1 << 20) + 3)
        assert not res.hit
        res, got = read(again, "page", PAGE)
        assert res.hit and got == data("page", PAGE)
        again.close()


@pytest.mark.parametrize("kind", [DiskTier, SharedDirTier])
@pytest.mark.parametrize("bad", ["bogus", "", "ENTRY ", None, 1, True, "batch"])
def test_a_tier_refuses_an_unknown_policy_naming_it(tmp_path, kind, bad):
    with pytest.raises(ConfigError, match=r"sync must be one of entry, none, not "):
        kind(str(tmp_path / "t"), 1 << 20, "buffered", sync=bad)
    # Refused before the directory is claimed: nothing was made.
    assert not os.path.exists(tmp_path / "t") or not os.listdir(tmp_path / "t")


def test_policies_by_name_and_by_enum_are_the_same(tmp_path):
    assert DiskTier(str(tmp_path / "a"), 1 << 20, sync=Sync.NONE).sync is Sync.NONE
    assert DiskTier(str(tmp_path / "b"), 1 << 20, sync="none").sync is Sync.NONE
    assert DiskTier(str(tmp_path / "c"), 1 << 20).sync is Sync.ENTRY  # the default: durable per entry


@pytest.mark.parametrize("key", ["sync", "shared_sync", "kvtier.sync", "kvtier.shared_sync"])
@pytest.mark.parametrize("bad", ["batch", "None", "", 0, False, ["none"]])
def test_the_backend_config_refuses_other_values_in_one_line(key, bad):
    with pytest.raises(ConfigError) as e:
        BackendConfig.from_params({"disk_dir": "/x", "shared_dir": "/y", key: bad})
    msg = str(e.value)
    name = "kvtier.shared_sync" if "shared" in key else "kvtier.sync"
    assert "\n" not in msg and name in msg, msg


def test_the_backend_gives_each_directory_tier_its_policy(tmp_path):
    cfg = BackendConfig.from_params(
        {
            "disk_dir": str(tmp_path / "d"),
            "disk_capacity_gb": 0.01,
            "io_mode": "buffered",
            "shared_dir": str(tmp_path / "s"),
            "sync": "none",
            "snapshot_path": "",
            "io_workers": 1,
        }
    )
    assert (cfg.sync, cfg.shared_sync) == ("none", "entry")  # shared_sync keeps its default
    b = KvtierBackend(cfg)
    try:
        assert [t.sync.value for t in b.store.tiers] == ["none", "entry"]
    finally:
        b.close()
