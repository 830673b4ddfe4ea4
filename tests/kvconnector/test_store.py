import itertools
import os
import shutil
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from store_helpers import data, put, read

from kvconnector.errors import StorageFullError
from kvconnector.store import TieredStore
from kvconnector.tiers import CPUTier, DiskTier
from kvconnector.timed_io import IOMode

KB = 1024


def make_store(tmp_path, cpu=40 * KB, disk=100 * KB, **kw):
    tiers = []
    if cpu:
        tiers.append(CPUTier(cpu))
    if disk:
        tiers.append(DiskTier(str(tmp_path / "disk"), disk, IOMode.BUFFERED))
    return TieredStore(tiers, **kw)


def test_waterfall_demotes_lru_to_the_next_tier_then_deletes(tmp_path):
    s = make_store(tmp_path)  # cpu holds up to 32K (0.8), disk 80K
    for i in range(3):
        assert put(s, f"k{i}", 10 * KB).tier == "cpu"
    # k0 is LRU; reading it makes k1 the LRU entry, so the next put must demote k1, not k0.
    assert read(s, "k0", 10 * KB)[0].tier == "cpu"
    assert put(s, "k3", 10 * KB).tier == "cpu"
    assert s.contains("k1") == "disk"
    assert s.contains("k0") == "cpu"
    for i in range(4, 14):
        put(s, f"k{i}", 10 * KB)
    usage = {u["tier"]: u for u in s.usage()}
    assert usage["cpu"]["used_bytes"] <= 32 * KB and usage["disk"]["used_bytes"] <= 80 * KB
    assert s.contains("k1") is None  # fell off the bottom
    assert s.stats[1].events["evictions"] >= 1 and s.stats[0].events["demotions_out"] >= 1
    # demoted bytes are intact and demotion I/O is in the disk tier's write stats
    res, got = read(s, "k13", 10 * KB)
    assert res.hit and got == data("k13", 10 * KB)
    assert s.stats[1].write.ops == s.stats[0].events["demotions_out"]
    assert len(os.listdir(tmp_path / "disk")) - 1 == usage["disk"]["entries"]  # entries and the tier marker


def test_large_entries_skip_a_tier_and_empty_tier_takes_one(tmp_path):
    s = make_store(tmp_path)
    assert put(s, "big", 39 * KB).tier == "disk"  # > 0.95 x 40K
    assert put(s, "fits-empty", 36 * KB).tier == "cpu"  # > target 32K, but the tier is empty
    assert put(s, "small", 1 * KB).tier == "cpu"  # demotes fits-empty
    assert s.contains("fits-empty") == "disk"
    assert s.put("huge", [memoryview(bytes(200 * KB))]).stored is False
    assert s.events["put_rejected"] == 1


def test_hits_misses_and_existing_keys(tmp_path):
    s = make_store(tmp_path)
    put(s, "a", 100)
    assert put(s, "a", 100).reason == "exists"
    assert read(s, "a", 100)[0].hit
    assert not s.get("nope").hit
    assert s.events["hits"] == 1 and s.events["misses"] == 1


def test_promote_on_hit_moves_entry_back_to_top(tmp_path):
    s = make_store(tmp_path, promote_on_hit=True)
    for i in range(5):
        put(s, f"k{i}", 10 * KB)
    assert s.contains("k0") == "disk"
    res, got = read(s, "k0", 10 * KB)
    assert res.tier == "disk" and got == data("k0", 10 * KB)
    assert s.contains("k0") == "cpu" and s.stats[0].events["promotions_in"] == 1
    # sink reads promote too
    victim = next(k for k in ("k1", "k2", "k3", "k4") if s.contains(k) == "disk")
    assert s.get(victim).hit and s.contains(victim) == "cpu"
    assert read(s, victim, 10 * KB)[1] == data(victim, 10 * KB)


def test_no_promotion_by_default(tmp_path):
    s = make_store(tmp_path)
    for i in range(5):
        put(s, f"k{i}", 10 * KB)
    read(s, "k0", 10 * KB)
    assert s.contains("k0") == "disk"


def test_corrupt_disk_entry_is_a_miss_and_dropped(tmp_path):
    s = make_store(tmp_path, cpu=0)
    put(s, "a", 8 * KB)
    path = s.tiers[0].path_for("a")
    with open(path, "r+b") as f:
        f.seek(4096 + 10)
        f.write(b"\xff\xfe")
    assert not s.get("a").hit
    assert s.contains("a") is None and not os.path.exists(path)
    assert s.stats[0].events["corrupt_dropped"] == 1


def test_file_removed_behind_the_stores_back_is_a_miss_and_forgotten(tmp_path):
    s = make_store(tmp_path, cpu=0)
    put(s, "a", 8 * KB)
    os.unlink(s.tiers[0].path_for("a"))
    assert not s.get("a").hit
    assert s.contains("a") is None and s.stats[0].events["vanished"] == 1


def test_put_of_a_key_whose_eviction_is_still_deleting_cannot_lose_its_file(tmp_path):
    """The evicting thread forgets the victim, then removes its file outside the lock. A put of the same key in that
    window must not write a file the eviction then removes (the index would claim an entry that is gone)."""
    deleting, release = threading.Event(), threading.Event()

    class SlowDelete(DiskTier):
        def delete(self, key):
            if key == "victim":
                deleting.set()
                release.wait(5)
            super().delete(key)

    s = TieredStore([SlowDelete(str(tmp_path / "disk"), 40 * KB, IOMode.BUFFERED, spare_ratio=0.0)])
    put(s, "victim", 20 * KB)
    evictor = threading.Thread(target=put, args=(s, "newcomer", 20 * KB))  # 40 KB > 0.8 x 40 KB: evicts
    evictor.start()
    assert deleting.wait(5)
    again = put(s, "victim", 20 * KB)  # while the victim's old file is being removed
    release.set()
    evictor.join(5)
    assert not again.stored and s.contains("victim") is None
    assert put(s, "victim", 20 * KB).stored  # once the removal is done, the key can come back
    res, got = read(s, "victim", 20 * KB)
    assert res.hit and got == data("victim", 20 * KB)


def test_pinned_entries_are_not_evicted(tmp_path):
    s = make_store(tmp_path, disk=0)
    put(s, "p", 10 * KB)
    s.pin("p")
    for i in range(6):
        put(s, f"k{i}", 10 * KB)
    assert s.contains("p") == "cpu"
    s.unpin("p")
    put(s, "z", 10 * KB)
    put(s, "z2", 10 * KB)
    put(s, "z3", 10 * KB)
    assert s.contains("p") is None


def test_enospc_is_raised_cleaned_up_and_counted(tmp_path, monkeypatch):
    s = make_store(tmp_path, cpu=0)
    import kvconnector.tiers as tiers_mod

    def full(*a, **k):
        raise StorageFullError(28, "no space")

    monkeypatch.setattr(tiers_mod, "write_entry", full)
    with pytest.raises(StorageFullError):
        put(s, "a", 100)
    assert s.usage()[0]["used_bytes"] == 0 and s.contains("a") is None
    assert s.stats[0].events["enospc"] == 1


_counter = itertools.count()


@pytest.fixture
def shm_tmp(tmp_path):
    # Real files on tmpfs: the invariants are about the store, so skip the disk's fdatasync cost.
    base = "/dev/shm" if os.path.isdir("/dev/shm") else str(tmp_path)
    d = tempfile.mkdtemp(dir=base, prefix="kvtier-test-")
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


ops = st.lists(
    st.tuples(st.sampled_from(["put", "get", "delete"]), st.integers(0, 15), st.integers(1, 12)),
    min_size=5,
    max_size=60,
)


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(per_thread=st.lists(ops, min_size=2, max_size=6), promote=st.booleans())
def test_invariants_under_concurrency(shm_tmp, per_thread, promote):
    """Many threads put/get/delete at once: no tier exceeds capacity, each entry is in exactly one tier, and every
    successful read returns the bytes that were written for that key."""
    d = shm_tmp / f"s{next(_counter)}"
    s = TieredStore(
        [
            CPUTier(24 * KB),
            CPUTier(30 * KB, name="cpu2"),
            DiskTier(str(d / "disk"), 60 * KB, IOMode.BUFFERED, spare_ratio=0.5),
        ],
        promote_on_hit=promote,
    )
    errors = []
    peak = [0, 0, 0]

    def worker(seq):
        try:
            for op, k, kb in seq:
                key = f"key{k}-{kb}"
                n = kb * KB
                if op == "put":
                    s.put(key, [memoryview(data(key, n))])
                elif op == "get":
                    out = memoryview(bytearray(n))
                    if s.get(key, out).hit and bytes(out) != data(key, n):
                        errors.append(f"wrong bytes for {key}")
                else:
                    s.delete(key)
                for i, u in enumerate(s.usage()):
                    peak[i] = max(peak[i], u["used_bytes"])
        except Exception as exc:  # pragma: no cover - surfaced below
            errors.append(repr(exc))

    threads = [threading.Thread(target=worker, args=(seq,)) for seq in per_thread]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i, tier in enumerate(s.tiers):
        assert peak[i] <= tier.capacity_bytes
    by_tier = s.keys_by_tier()
    all_keys = [k for keys in by_tier.values() for k in keys]
    assert len(all_keys) == len(set(all_keys)) == len(s)
    for u in s.usage():
        assert u["used_bytes"] == sum(int(k.rsplit("-", 1)[1]) * KB for k in by_tier[u["tier"]])
    s.promote_on_hit = False  # the checks below must not move entries
    on_disk = sorted(n for n in os.listdir(d / "disk") if n.endswith(".kv"))  # not spares, not the marker
    assert on_disk == sorted(s.tiers[2].path_for(k).rsplit("/", 1)[1] for k in by_tier["disk"])
    for k in all_keys:
        n = int(k.rsplit("-", 1)[1]) * KB
        out = memoryview(bytearray(n))
        assert s.get(k, out).hit and bytes(out) == data(k, n)


def test_the_key_listener_sees_every_key_enter_and_leave_the_index_once(tmp_path):
    """What a KV event publisher builds on (the vLLM tier's BlockStored / BlockRemoved): a key is announced when it
    enters the store and when it leaves it (evicted from the bottom tier, dropped as corrupt, deleted), never for a
    move between tiers; `watch_keys` hands over what is held already, so nothing is missed or told twice."""
    s = make_store(tmp_path)  # cpu keeps 32K, disk 80K: 10K entries, 3 in cpu, 8 in disk
    put(s, "before", 10 * KB)
    seen = []
    assert s.watch_keys(lambda k, present: seen.append((k, present))) == ["before"]
    for i in range(14):
        put(s, f"k{i}", 10 * KB)
    assert put(s, "k13", 10 * KB).reason == "exists"  # no second announcement
    entered = [k for k, p in seen if p]
    left = [k for k, p in seen if not p]
    assert entered == [f"k{i}" for i in range(14)]
    held = {k for k in ["before", *entered] if s.contains(k)}
    assert len(held) == 11 and set(left) == {"before", *entered} - held  # the rest fell off the bottom tier, once each
    assert len(left) == len(set(left)) == 4
    # A corrupt entry dropped on read, a delete, a missing key: one departure each, none for nothing.
    on_disk = next(k for k in sorted(held) if s.contains(k) == "disk")
    with open(s.tiers[1].path_for(on_disk), "r+b") as f:
        f.seek(4096 + 10)
        f.write(b"\xff\xfe")
    assert not s.get(on_disk).hit and seen[-1] == (on_disk, False)
    cpu_key = next(k for k in sorted(held) if s.contains(k) == "cpu")
    assert s.delete(cpu_key) and seen[-1] == (cpu_key, False)
    n = len(seen)
    assert not s.delete(cpu_key) and not s.get(on_disk).hit and len(seen) == n
    # A failing listener is counted in the store's events, never the caller's error.
    s.key_listener = lambda k, p: 1 / 0
    assert put(s, "after", 10 * KB).stored and s.events["key_listener_errors"] == 1
