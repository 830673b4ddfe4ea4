"""What kvtier does when LMCache serves a request from its own memory (L1): answer from the index, nothing else.

LMCache 0.5.6 sends every prefetch to every L2 adapter, L1 hits included (PrefetchController._start_lookup_phase:
"we submit the full keys to L2 adapters"): it read-locks the L1 hits, calls submit_lookup_and_lock_task with all keys,
waits for the adapter's lookup event fd in its poll loop, takes the bitmap with query_lookup_and_lock_result, then
plans the load (_transition_to_load_phase -> _plan_load): the keys L1 holds are dropped from the L2 plan and handed
back with submit_unlock, and no load task is submitted. The tests drive the real adapter through that sequence while
kvtier's store and read pools are busy (stores with fdatasync queued ahead of the request, the situation
benchmarks/README.md's "TTFT of cached prompts" measured) and fail if the L1 hit did any tier I/O, submitted anything to
a pool or had to wait for one.
"""

import select
import threading

import pytest
from lmcache_helpers import make_adapter, mem_obj, okey, wait_store

from kvconnector.lmcache.l2_adapter import object_key_str


@pytest.fixture
def adapter(tmp_path):
    a = make_adapter(
        {"disk_dir": str(tmp_path / "disk"), "disk_capacity_gb": 1e-3, "io_mode": "direct", "io_workers": 2}
    )
    yield a
    a.close()


class Occupied:
    """Every worker of the backend's store and read pools blocked on an event (as by durable stores in flight), so
    anything submitted to them waits until release()."""

    def __init__(self, backend) -> None:
        self.gate = threading.Event()
        n = backend.cfg.io_workers
        started = threading.Semaphore(0)

        def block():
            started.release()
            self.gate.wait(30)

        self.futures = [p.submit(block) for p in (backend.pool, backend.read_pool) for _ in range(n)]
        for _ in self.futures:
            assert started.acquire(timeout=10), "a pool worker did not start"

    def release(self) -> None:
        self.gate.set()
        for f in self.futures:
            f.result(10)


def l1_hit(adapter, keys) -> list[int]:
    """LMCache's calls on an L1 hit, in its order, with its poll on the lookup event fd (timeout 0: the answer must be
    there when submit returns, since the workers that would compute it later are all busy)."""
    tid = adapter.submit_lookup_and_lock_task(keys, {})
    poller = select.poll()
    poller.register(adapter.get_lookup_and_lock_event_fd(), select.POLLIN)
    assert poller.poll(0), "the lookup was not answered when submit_lookup_and_lock_task returned"
    bitmap = adapter.query_lookup_and_lock_result(tid)
    assert bitmap is not None
    adapter.submit_unlock(keys)  # _plan_load: L1 serves every key, the L2 locks are returned, no load task
    return bitmap.get_indices_list()


def test_an_l1_hit_does_no_io_and_never_waits_for_a_pool(adapter):
    keys = [okey(i) for i in range(5)]
    res = wait_store(adapter, adapter.submit_store_task(keys, [mem_obj(seed=i) for i in range(5)]))
    assert res.is_successful()
    ops = []
    adapter.backend.store.op_listener = lambda *op: ops.append(op)
    before = [s.to_dict() for s in adapter.backend.store.stats]
    busy = Occupied(adapter.backend)
    try:
        assert l1_hit(adapter, keys + [okey(99)]) == [0, 1, 2, 3, 4]  # found (and locked until the unlock)
        assert l1_hit(adapter, keys) == [0, 1, 2, 3, 4]
    finally:
        busy.release()
    assert ops == []  # no tier read, write, demotion or eviction
    assert [s.to_dict() for s in adapter.backend.store.stats] == before
    # Every lock was handed back: no pin is left on any entry.
    assert not any(adapter.backend.store.unpin(object_key_str(k)) for k in keys)
    ev = adapter.backend.events_snapshot()
    assert ev["lookup_hits"] == 10 and ev["lookup_misses"] == 1
    assert "load_hits" not in ev and "load_misses" not in ev


def test_the_locks_taken_on_an_l1_hit_still_protect_a_load(adapter):
    # The same lookup answers an L2 hit: the pinned entry survives a flood of stores until it is unlocked and loaded.
    first = okey(0)
    wait_store(adapter, adapter.submit_store_task([first], [mem_obj(seed=0)]))
    tid = adapter.submit_lookup_and_lock_task([first], {})
    assert adapter.query_lookup_and_lock_result(tid).get_indices_list() == [0]
    flood = [okey(i) for i in range(1, 300)]
    wait_store(adapter, adapter.submit_store_task(flood, [mem_obj(seed=1) for _ in flood]))
    assert adapter.backend.store.contains(object_key_str(first)) is not None
    adapter.submit_unlock([first])
