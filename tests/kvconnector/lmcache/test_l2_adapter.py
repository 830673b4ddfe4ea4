"""The MP-mode L2 adapter, built by LMCache's own plugin factory, on real LMCache memory objects and real files.

`make test` runs this file on both supported LMCache releases (0.5.6 in .venv, 0.5.7rc2 in .venv-lmcache057); the
tests of what 0.5.7 added (memory tags) skip on 0.5.6 with the reason.
"""

import importlib.metadata
import inspect
import json
import os
import select
import threading

import pytest
import torch
from lmcache.v1.distributed.internal_api import L2AdapterListener
from lmcache.v1.distributed.l2_adapters import create_l2_adapter
from lmcache_helpers import NBYTES, make_adapter, mem_obj, okey, wait_result, wait_store

from kvconnector.lmcache._common import KvtierRefusedToRun
from kvconnector.lmcache.l2_adapter import KvtierL2Adapter, object_key_str

LMCACHE = importlib.metadata.version("lmcache")
try:
    from lmcache.v1.distributed.api import MemoryResidency, MemorySegment, MemoryTags
except ImportError:  # lmcache 0.5.6
    MemoryTags = None
needs_memory_tags = pytest.mark.skipif(MemoryTags is None, reason=f"lmcache {LMCACHE} has no memory tags (0.5.7 on)")


@pytest.fixture
def adapter(tmp_path):
    a = make_adapter({"disk_dir": str(tmp_path / "disk"), "disk_capacity_gb": 1e-3, "io_mode": "direct"})
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
    a = make_adapter({"disk_dir": str(tmp_path / "d"), "disk_capacity_gb": 1e-3, "io_workers": 3})
    try:
        new = [t.name for t in set(threading.enumerate()) - before]
        assert sum(n.startswith("kvtier-io") for n in new) == 3 and sum(n.startswith("kvtier-read") for n in new) == 3
        assert "pool_start_incomplete" not in a.backend.events_snapshot()
    finally:
        a.close()


def test_event_fds_are_distinct(adapter):
    fds = {adapter.get_store_event_fd(), adapter.get_lookup_and_lock_event_fd(), adapter.get_load_event_fd()}
    assert len(fds) == 3


def test_each_operation_signals_its_own_event_fd_only(adapter):
    # LMCache's controllers poll the three fds and route by fd (base.py: "MUST return a distinct file descriptor").
    s, lk, ld = adapter.get_store_event_fd(), adapter.get_lookup_and_lock_event_fd(), adapter.get_load_event_fd()
    store(adapter, [okey(1)], [mem_obj(seed=1)])
    assert select.select([s, lk, ld], [], [], 5)[0] == [s]
    assert lookup(adapter, [okey(1)]) == [0]
    assert select.select([lk, ld], [], [], 5)[0] == [lk]
    assert load(adapter, [okey(1)])[0] == [0]
    assert select.select([ld], [], [], 5)[0] == [ld]


def test_the_class_is_concrete_and_built_from_its_config_class(tmp_path):
    # LMCache 0.5.7 added an abstract method (get_memory_tags): a class missing one cannot be instantiated at all.
    assert not inspect.isabstract(KvtierL2Adapter)
    a = make_adapter({"disk_dir": str(tmp_path / "d"), "disk_capacity_gb": 1e-3})
    try:
        # The factory found KvtierL2AdapterConfig by name and validated adapter_params with it (a typo fails there,
        # test_broken_config_fails_loudly); the adapter took what it validated.
        assert a.backend.cfg.disk_capacity_gb == 1e-3
    finally:
        a.close()
    # Keywords a later LMCache may pass are accepted.
    b = KvtierL2Adapter({"disk_dir": str(tmp_path / "e"), "disk_capacity_gb": 1e-3}, l1_memory_desc=None, extra=1)
    b.close()


@needs_memory_tags
@pytest.mark.parametrize(
    "tiers, residency",
    [
        ({"disk_dir": "disk"}, "LOCAL"),
        ({"shared_dir": "shared"}, "REMOTE"),
        ({"disk_dir": "disk", "shared_dir": "shared"}, "REMOTE"),  # a hit may come from the shared directory
    ],
)
def test_memory_tags_say_where_the_bytes_live(tmp_path, tiers, residency):
    params = {k: str(tmp_path / v) for k, v in tiers.items()}
    a = make_adapter({**params, "disk_capacity_gb": 1e-3, "shared_capacity_gb": 1e-3})
    try:
        assert a.get_memory_tags() == MemoryTags(MemorySegment.STORAGE, MemoryResidency[residency])
    finally:
        a.close()


@needs_memory_tags
def test_memory_tags_agree_with_lmcaches_own_fs_adapter(tmp_path):
    # LMCache's fs adapter: STORAGE, LOCAL; REMOTE when its "shared" flag says the directory is shared.
    from lmcache.v1.distributed.l2_adapters.fs_l2_adapter import FSL2AdapterConfig

    def fs_tags(shared: bool):
        cfg = FSL2AdapterConfig.from_dict({"type": "fs", "base_path": str(tmp_path / f"fs{shared}")})
        cfg.shared = shared
        fs = create_l2_adapter(cfg)
        try:
            return fs.get_memory_tags()
        finally:
            fs.close()

    local = make_adapter({"disk_dir": str(tmp_path / "d"), "disk_capacity_gb": 1e-3})
    shared = make_adapter({"shared_dir": str(tmp_path / "s"), "shared_capacity_gb": 1e-3})
    try:
        assert local.get_memory_tags() == fs_tags(False) != shared.get_memory_tags() == fs_tags(True)
    finally:
        local.close()
        shared.close()


def test_a_shared_flag_that_contradicts_the_tiers_is_counted(tmp_path):
    a = make_adapter({"shared_dir": str(tmp_path / "s"), "shared_capacity_gb": 1e-3})
    try:
        a.set_backend_identity("plugin", shared=True)
        assert "shared_flag_mismatch" not in a.backend.events_snapshot()
        a.set_backend_identity("plugin", shared=False)
        assert a.backend.events_snapshot()["shared_flag_mismatch"] == 1
    finally:
        a.close()


class Recorder(L2AdapterListener):
    """Records what the adapter tells LMCache's listeners (the L2 eviction controller is one)."""

    def __init__(self):
        self.accessed = []

    def on_l2_keys_stored(self, keys, sizes=None):
        pass

    def on_l2_keys_accessed(self, keys):
        self.accessed.extend(keys)

    def on_l2_keys_deleted(self, keys, sizes=None):
        pass


def test_touch_keeps_an_entry_through_an_eviction_it_would_otherwise_lose(adapter):
    # 1 MB at 0.9: room for 109 entries of 8 KiB. Two old entries, 100 newer ones, then 20 more force about a dozen
    # evictions, oldest first. Only the touched one of the two old entries survives; no byte was read to touch it.
    touched, untouched = okey(0), okey(1)
    store(adapter, [touched, untouched], [mem_obj(seed=0), mem_obj(seed=1)])
    store(adapter, [okey(i) for i in range(2, 102)], [mem_obj(seed=2) for _ in range(100)])
    seen = Recorder()
    adapter.register_listener(seen)
    reads = adapter.backend.store.stats[0].read.ops
    adapter.submit_touch([touched, okey(999)])  # a key kvtier does not hold is ignored
    assert seen.accessed == [touched]
    store(adapter, [okey(i) for i in range(102, 122)], [mem_obj(seed=3) for _ in range(20)])
    held = adapter.backend.store.contains
    assert held(object_key_str(touched)) and not held(object_key_str(untouched))
    assert not held(object_key_str(okey(2)))  # the eviction did happen past the touched key
    assert adapter.backend.store.stats[0].read.ops == reads


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
    a = make_adapter({"disk_dir": str(tmp_path / "d"), "disk_capacity_gb": 2e-4, "io_workers": 8})  # 200 KB
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
    a = make_adapter(params)
    store(a, [okey(1), okey(2)], [mem_obj(seed=1), mem_obj(seed=2)])
    a.close()
    snap = json.loads((tmp_path / "d" / "kvtier-stats.json").read_text())
    assert snap["backend_events"]["store_ok"] == 2
    b = make_adapter(params)
    try:
        hit, out = load(b, [okey(1), okey(2)])
        assert hit == [0, 1] and torch.equal(out[1].raw_data, mem_obj(seed=2).raw_data)
        assert b.backend.rescan_reports[0]["adopted"] == 2
    finally:
        b.close()


def test_two_instances_share_one_directory(tmp_path):
    shared = str(tmp_path / "shared")
    a = make_adapter({"shared_dir": shared, "shared_capacity_gb": 1e-3})
    b = make_adapter({"shared_dir": shared, "shared_capacity_gb": 1e-3})
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
            make_adapter(params)
    assert any(needle in r.getMessage() and r.levelname == "ERROR" for r in caplog.records)


def test_store_and_prefetch_controllers_at_once(tmp_path):
    # LMCache calls an adapter from two threads (base.py: the store controller and the prefetch controller). Here one
    # thread stores batches while the other looks up, loads, touches and unlocks what was stored before: every task
    # completes once, with its own id, and every load is byte-exact.
    a = make_adapter({"disk_dir": str(tmp_path / "d"), "disk_capacity_gb": 1e-2, "io_workers": 4})
    ids: list[int] = []
    errors: list[str] = []
    stored = threading.Semaphore(0)

    def store_controller():
        for b in range(20):
            tid = a.submit_store_task([okey(10 * b + i) for i in range(10)], [mem_obj(seed=b) for _ in range(10)])
            ids.append(tid)
            wait_store(a, tid)
            stored.release()

    def prefetch_controller():
        for b in range(20):
            stored.acquire()
            keys = [okey(10 * b + i) for i in range(10)]
            tid = a.submit_lookup_and_lock_task(keys, {})
            ids.append(tid)
            if wait_result(a.query_lookup_and_lock_result, tid).get_indices_list() != list(range(10)):
                errors.append(f"lookup {b}")
            objs = [mem_obj() for _ in keys]
            tid = a.submit_load_task(keys, objs)
            ids.append(tid)
            if wait_result(a.query_load_result, tid).get_indices_list() != list(range(10)):
                errors.append(f"load {b}")
            if not all(torch.equal(o.raw_data, mem_obj(seed=b).raw_data) for o in objs):
                errors.append(f"bytes {b}")
            a.submit_touch(keys)
            a.submit_unlock(keys)

    try:
        threads = [threading.Thread(target=store_controller), threading.Thread(target=prefetch_controller)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads)
        assert errors == [] and len(ids) == 60 and len(set(ids)) == 60
        assert (
            a.pop_completed_store_tasks() == {} and a.query_load_result(ids[-1]) is None
        )  # each result handed out once
    finally:
        a.close()
