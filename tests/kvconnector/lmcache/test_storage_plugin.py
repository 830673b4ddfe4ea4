"""The in-process storage plugin, loaded by LMCache's real StorageManager (CPU, no vLLM)."""

import os
import subprocess
import sys

import pytest
import torch
from helpers import wait_for
from lmcache.utils import CacheEngineKey
from lmcache.v1.memory_management import MemoryFormat
from lmcache_helpers import storage_manager

from kvconnector.lmcache.storage_plugin import EXIT_CONFIG

SHAPE = torch.Size([2, 2, 16, 64])


def key(i):
    return CacheEngineKey("org/../model", 1, 0, i, torch.bfloat16)


def put(sm, i):
    obj = sm.allocate(SHAPE, torch.bfloat16, MemoryFormat.KV_2LTD)
    obj.tensor.copy_(expected(i))
    sm.batched_put([key(i)], [obj])


def expected(i):
    return torch.randn(SHAPE, generator=torch.Generator().manual_seed(i)).to(torch.bfloat16)


def settle(plugin, timeout_s=10.0):
    wait_for(lambda: not plugin._putting, timeout_s, 0.005, what="the plugin's background puts to finish")


def get(sm, i):
    return sm.get(key(i), location="kvtier")


@pytest.fixture
def sm(tmp_path):
    m = storage_manager(disk_dir=str(tmp_path / "disk"), disk_capacity_gb=1e-3)
    yield m
    m.close()


def test_round_trip_contains_pin_unpin_remove(sm):
    plugin = sm.storage_backends["kvtier"]
    for i in range(3):
        put(sm, i)
    settle(plugin)
    assert all(plugin.contains(key(i)) for i in range(3)) and not plugin.contains(key(9))
    obj = get(sm, 1)
    assert obj.meta.fmt is MemoryFormat.KV_2LTD and obj.meta.shape == SHAPE and obj.meta.dtype == torch.bfloat16
    assert torch.equal(obj.tensor, expected(1))
    obj.ref_count_down()
    assert plugin.contains(key(2), pin=True) and plugin.unpin(key(2)) and not plugin.unpin(key(2))
    assert plugin.pin(key(0)) and plugin.unpin(key(0))
    assert plugin.remove(key(0)) and not plugin.contains(key(0)) and get(sm, 0) is None
    assert plugin.backend.events_snapshot()["store_ok"] == 3


@pytest.mark.slow
def test_eviction_demotes_to_the_shared_tier_then_deletes(tmp_path):
    # disk holds ~12 entries (100 KB at 0.9), the shared dir ~24 more, then the bottom deletes.
    m = storage_manager(
        disk_dir=str(tmp_path / "disk"),
        disk_capacity_gb=1e-4,
        shared_dir=str(tmp_path / "shared"),
        shared_capacity_gb=2e-4,
    )
    try:
        plugin = m.storage_backends["kvtier"]
        for i in range(60):
            put(m, i)
            settle(plugin)
        st = plugin.backend.store
        assert st.contains(key(0).to_string()) is None  # fell off the bottom
        assert st.contains(key(59).to_string()) == "disk"
        in_shared = [i for i in range(60) if st.contains(key(i).to_string()) == "shared"]
        assert in_shared and min(in_shared) > 0
        assert st.stats[0].events["demotions_out"] > 0 and st.stats[1].events["evictions"] > 0
        for u in st.usage():
            assert u["used_bytes"] <= 0.9 * u["capacity_bytes"]
        obj = get(m, in_shared[0])  # a hit from the lower tier is byte exact
        assert torch.equal(obj.tensor, expected(in_shared[0]))
        obj.ref_count_down()
    finally:
        m.close()


def test_restart_persistence_and_corrupt_files(tmp_path):
    d = tmp_path / "disk"
    m = storage_manager(disk_dir=str(d), disk_capacity_gb=1e-3)
    for i in range(4):
        put(m, i)
    settle(m.storage_backends["kvtier"])
    m.close()
    files = sorted(d.glob("*.kv"))
    assert len(files) == 4
    # Corrupt one payload byte, truncate another file, leave a crashed write's temp file behind.
    by_key = {}
    from kvconnector.timed_io import read_header

    for f in files:
        by_key[read_header(str(f)).key] = f
    with open(by_key[key(1).to_string()], "r+b") as fh:
        fh.seek(4096 + 100)
        b = fh.read(1)
        fh.seek(4096 + 100)
        fh.write(bytes([b[0] ^ 0xFF]))
    with open(by_key[key(2).to_string()], "r+b") as fh:
        fh.truncate(4096 + 10)
    (d / (files[0].name + ".tmp123-456")).write_bytes(b"partial")
    m2 = storage_manager(disk_dir=str(d), disk_capacity_gb=1e-3)
    try:
        plugin = m2.storage_backends["kvtier"]
        rep = plugin.backend.rescan_reports[0]
        assert rep["adopted"] == 3 and rep["corrupt_removed"] == 1 and rep["stale_tmp_removed"] == 1
        obj = get(m2, 0)
        assert torch.equal(obj.tensor, expected(0))  # served after the restart, byte exact
        obj.ref_count_down()
        assert get(m2, 1) is None  # the flipped byte is caught by the checksum: never served
        assert plugin.backend.store.stats[0].events["corrupt_dropped"] == 1
        assert get(m2, 2) is None and get(m2, 3) is not None
    finally:
        m2.close()


@pytest.mark.slow
def test_broken_config_refuses_to_run_through_lmcache(tmp_path):
    # LMCache's plugin loader swallows constructor exceptions; a broken kvtier config must stop the process instead
    # (in a child process here, since that is what it does), with the cause at error level.
    script = (
        "import lmcache_helpers as h\n"  # python -c imports from its working directory: this folder
        f"h.storage_manager(disk_dir={str(tmp_path / 'd')!r}, io_mode='sideways')\n"
        "print('STILL RUNNING')\n"
    )
    here = os.path.dirname(os.path.abspath(__file__))
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=here)
    assert p.returncode == EXIT_CONFIG, p.stderr[-2000:]
    assert "STILL RUNNING" not in p.stdout
    err = [line for line in p.stderr.splitlines() if "refuses to run" in line]
    assert err and "kvtier.io_mode" in err[0]
