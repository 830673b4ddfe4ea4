"""The MP-mode L2 adapter, built by LMCache's own plugin factory, on real LMCache memory objects and real files."""

import json
import os
import threading

import pytest
import torch
from kvtier_lmcache_helpers import NBYTES, mem_obj, okey, wait_result, wait_store
from lmcache.v1.distributed.l2_adapters import create_l2_adapter
from lmcache.v1.distributed.l2_adapters.plugin_l2_adapter import PluginL2AdapterConfig

from kvconnector.lmcache._common import KvtierRefusedToRun
from kvconnector.lmcache.l2_adapter import object_key_str


def make(params):
    cfg = PluginL2AdapterConfig.from_dict(
        {
            "type": "plugin",
            "module_path": "kvconnector.lmcache.l2_adapter",
            "class_name": "KvtierL2Adapter",
            "adapter_params": params,
        }
    )
    return create_l2_adapter(cfg)


@pytest.fixture
def adapter(tmp_path):
    a = make({"disk_dir": str(tmp_path / "disk"), "disk_capacity_gb": 1e-3, "io_mode": "direct"})
    yield a
    a.close()


def store(a, keys, objs):
    res = wait_store(a, a.submit_store_task(keys, objs))
    assert res.is_successful()
    return res


def lookup(a, keys):
    return wait_result(a.query_lookup_and_lock_result, a.submit_lookup_and_lock_task(keys, {})).get_indices_list()


def load(a, keys):
    objs = [mem_obj() for _ in keys]
    bm = wait_result(a.query_load_result, a.submit_load_task(keys, objs))
    return bm.get_indices_list(), objs


def test_report_status_is_unhealthy_once_the_backend_is_closed(adapter):
    assert adapter.report_status()["is_healthy"]
    adapter.backend.close()
    assert not adapter.report_status()["is_healthy"]


def test_io_workers_run_before_the_first_request(tmp_path):
    # The first cold L2 hit of a fresh stack must not start threads (ThreadPoolExecutor starts them lazily).
    before = set(threading.enumerate())
    a = make({"disk_dir": str(tmp_path / "d"), "disk_capacity_gb": 1e-3, "io_workers": 3})
    try:
        new = [t.name for t in set(threading.enumerate()) - before]
        assert sum(n.startswith("kvtier-io") for n in new) == 3 and sum(n.startswith("kvtier-read") for n in new) == 3
        assert "pool_start_incomplete" not in a.backend.events_snapshot()
    finally:
        a.close()


def test_event_fds_are_distinct(adapter):
    fds = {adapter.get_store_event_fd(), adapter.get_lookup_and_lock_event_fd(), adapter.get_load_event_fd()}
    assert len(fds) == 3


def test_round_trip_is_byte_exact_and_misses_are_misses(adapter):
    keys, objs = [okey(i) for i in range(4)], [mem_obj(seed=i) for i in range(4)]
    assert store(adapter, keys, objs).bytes_transferred() == 4 * NBYTES
    assert lookup(adapter, keys + [okey(99)]) == [0, 1, 2, 3]
    hit, out = load(adapter, [okey(2), okey(99), okey(0)])
    assert hit == [0, 2]
    assert torch.equal(out[0].raw_data, objs[2].raw_data) and torch.equal(out[2].raw_data, objs[0].raw_data)
    assert not torch.equal(out[0].raw_data, out[2].raw_data)
    adapter.submit_unlock(keys)


def test_keys_never_become_paths(adapter, tmp_path):
    # LMCache keys hold '/' and the model name may hold '..': the files stay in the tier's directory, 0600 in a 0700
    # dir.
    key = okey(7, model="../../../../tmp/evil/..")
    store(adapter, [key], [mem_obj(seed=7)])
    disk = tmp_path / "disk"
    files = [p for p in disk.iterdir() if p.suffix == ".kv"]
    assert len(files) == 1 and "/" not in files[0].name and ".." not in files[0].name
    assert not (tmp_path / "evil").exists()
    assert os.stat(disk).st_mode & 0o777 == 0o700 and os.stat(files[0]).st_mode & 0o777 == 0o600
    assert load(adapter, [key])[0] == [0]


def test_lock_pins_against_eviction_and_unlock_releases(adapter):
    # capacity 1 MB at 0.9: about 109 entries of 8 KiB. A locked key survives a flood; once unlocked it is evicted.
    first = okey(0)
    store(adapter, [first], [mem_obj(seed=0)])
    assert lookup(adapter, [first]) == [0]
    flood = [okey(i) for i in range(1, 300)]
    store(adapter, flood, [mem_obj(seed=1) for _ in flood])
    assert lookup(adapter, [first]) == [0]  # still there (and locked twice now)
    adapter.submit_unlock([first, first])
    store(adapter, [okey(i) for i in range(300, 600)], [mem_obj(seed=2) for _ in range(300)])
    assert lookup(adapter, [first]) == []
    u = adapter.backend.store.usage()[0]
    assert u["used_bytes"] <= 0.9 * u["capacity_bytes"]
    assert adapter.backend.store.stats[0].events["evictions"] > 0


def test_delete_removes_and_capacity_never_exceeded_under_concurrent_stores(tmp_path):
    a = make({"disk_dir": str(tmp_path / "d"), "disk_capacity_gb": 2e-4, "io_workers": 8})  # 200 KB
    try:
        seen = []
        stop = threading.Event()

        def watch():  # samples every 0.5 ms; a busy loop would take the GIL from the workers it watches
            while not stop.wait(0.0005):
                seen.append(a.backend.store.usage()[0]["used_bytes"])

        w = threading.Thread(target=watch)
        w.start()
        tids = [
            a.submit_store_task([okey(100 * t + i) for i in range(20)], [mem_obj(seed=t) for _ in range(20)])
            for t in range(6)
        ]
        for tid in tids:
            wait_store(a, tid)
        stop.set()
        w.join()
        cap = a.backend.store.tiers[0].capacity_bytes
        on_disk = sum(p.stat().st_size - 4096 for p in (tmp_path / "d").glob("*.kv"))
        assert len(seen) > 1 and max(seen) > 0  # it watched while the stores ran
        assert max(seen) <= cap and on_disk <= cap
        present = [k for k in (okey(i) for i in range(600)) if a.backend.store.contains(object_key_str(k))]
        assert present
        a.delete(present[:3])
        assert lookup(a, present[:3]) == []
    finally:
        a.close()


def test_restart_serves_what_was_on_disk(tmp_path):
    params = {"disk_dir": str(tmp_path / "d"), "disk_capacity_gb": 1e-3}
    a = make(params)
    store(a, [okey(1), okey(2)], [mem_obj(seed=1), mem_obj(seed=2)])
    a.close()
    snap = json.loads((tmp_path / "d" / "kvtier-stats.json").read_text())
    assert snap["backend_events"]["store_ok"] == 2
    b = make(params)
    try:
        hit, out = load(b, [okey(1), okey(2)])
        assert hit == [0, 1] and torch.equal(out[1].raw_data, mem_obj(seed=2).raw_data)
        assert b.backend.rescan_reports[0]["adopted"] == 2
    finally:
        b.close()


def test_two_instances_share_one_directory(tmp_path):
    shared = str(tmp_path / "shared")
    a = make({"shared_dir": shared, "shared_capacity_gb": 1e-3})
    b = make({"shared_dir": shared, "shared_capacity_gb": 1e-3})
    try:
        store(a, [okey(5)], [mem_obj(seed=5)])
        assert lookup(b, [okey(5), okey(6)]) == [0]  # B finds what A computed
        hit, out = load(b, [okey(5)])
        assert hit == [0] and torch.equal(out[0].raw_data, mem_obj(seed=5).raw_data)
        b.submit_unlock([okey(5)])
        a.delete([okey(5)])  # A evicts it: B's next load is a miss, never an error
        assert load(b, [okey(5)])[0] == []
        assert b.backend.store.stats[0].events["vanished"] == 1
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize(
    "params, needle",
    [
        ({"disk_dir": "/tmp/x", "disk_capacity_gb": -1}, "kvtier.disk_capacity_gb"),
        ({"disk_dir": "/tmp/x", "no_such_key": 1}, "kvtier.no_such_key: unknown key"),
        ({}, "no tier configured"),
        ({"disk_dir": "/proc/kvtier-cannot"}, "cannot create cache dir"),
    ],
)
def test_broken_config_fails_loudly(params, needle, caplog):
    with caplog.at_level("ERROR", logger="kvconnector.lmcache"):
        with pytest.raises(KvtierRefusedToRun, match="refuses to run"):
            make(params)
    assert any(needle in r.getMessage() and r.levelname == "ERROR" for r in caplog.records)
