"""The CPU tier's buffer pool: bytes come back exact, buffers are reused instead of mapped anew, evicted entries give
their buffers back, and the pages the pool holds (read from the kernel's page table, /proc/self/pagemap) never
exceed the tier's capacity, with many threads at once."""

import struct
import threading
import time

import numpy as np
import pytest
from helpers import wait_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvconnector.cpu_pool import BufferPool, size_class
from kvconnector.errors import StorageFullError
from kvconnector.store import TieredStore
from kvconnector.tiers import CPUTier, DiskTier
from kvconnector.timed_io import PAGE, IOMode

KB = 1024


def data(key: str, n: int) -> bytes:
    seed = int.from_bytes(key.encode()[-8:].rjust(8, b"\0"), "little")
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def chunks_of(b: bytes, parts: int) -> list[memoryview]:
    step = -(-len(b) // parts)
    return [memoryview(b)[i : i + step] for i in range(0, len(b), step)]


def present_bytes(buf) -> int:
    """Bytes of the buffer's mapping that the kernel has backed with memory now (pagemap bit 63: page present)."""
    addr = buf.arr.ctypes.data
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(addr // PAGE * 8)
        raw = f.read(buf.size // PAGE * 8)
    return sum(1 for (v,) in struct.iter_unpack("<Q", raw) if v >> 63) * PAGE


def pool_present_bytes(pool: BufferPool) -> int:
    return sum(present_bytes(b) for b in pool.buffers())


def test_size_classes_are_page_exact_to_64k_then_eight_per_doubling():
    assert [size_class(n * PAGE) for n in (1, 2, 16)] == [PAGE, 2 * PAGE, 16 * PAGE]
    assert size_class(17 * PAGE) == 18 * PAGE  # 68 KiB -> 72 KiB: steps of 8 KiB between 64 and 128 KiB
    for n in range(17 * PAGE, 64 * 1024 * KB, 37 * PAGE):
        c = size_class(n)
        assert n <= c <= n * 1.125 and c % PAGE == 0
    assert len({size_class(n) for n in range(256 * KB + PAGE, 512 * KB + PAGE, PAGE)}) == 8


@pytest.mark.parametrize("nbytes", [1, PAGE - 1, PAGE, 3 * PAGE + 17, 100 * KB, 256 * KB, 5 * 1024 * KB + 1])
@pytest.mark.parametrize("parts", [1, 3])
def test_bytes_read_back_exact(nbytes, parts):
    tier = CPUTier(16 * 1024 * KB)
    b = data(f"k{nbytes}", nbytes)
    tier.write("k", chunks_of(b, parts), nbytes)
    out = memoryview(bytearray(nbytes))
    tier.read("k", nbytes, out)
    assert bytes(out) == b
    tier.read("k", nbytes)  # through scratch: no error, no destination
    view = tier.view("k")
    if nbytes % PAGE:
        assert view is None  # the tail lives beside the pooled body: a demotion reads it out
    else:
        assert bytes(view) == b
    # what the entry holds is exactly its length: the page-rounded body in the pool, the tail charged beside it
    assert tier.pool.in_use_bytes == nbytes


def test_steady_state_puts_reuse_buffers_and_map_nothing_new():
    n = 256 * KB
    tier = CPUTier(40 * n)
    for i in range(8):
        tier.write(f"k{i}", [memoryview(data(f"k{i}", n))], n)
    maps = tier.counters["pool_maps"]
    assert maps == 8
    present = pool_present_bytes(tier.pool)
    for i in range(8, 200):  # evict the oldest, store a new one: what a full tier does forever
        tier.delete(f"k{i - 8}")
        tier.write(f"k{i}", [memoryview(data(f"k{i}", n))], n)
    assert tier.counters["pool_maps"] == maps
    assert tier.counters["pool_reuses"] == 192
    assert pool_present_bytes(tier.pool) == present == 8 * n  # no page more than before, none lost
    for i in range(192, 200):
        out = memoryview(bytearray(n))
        tier.read(f"k{i}", n, out)
        assert bytes(out) == data(f"k{i}", n)


@pytest.mark.slow
def test_entries_of_varying_size_reuse_each_others_buffers():
    """Whole-request entries differ in length from one to the next (tokens x bytes per token): a delete's buffer
    serves the next entry even when its size class differs, so mappings stop once the tier has warmed up."""
    rng = np.random.default_rng(7)
    tier = CPUTier(40 * 1024 * KB)
    live = []
    for i in range(300):
        if len(live) == 6:
            tier.delete(live.pop(0))
        n = int(rng.integers(64, 129)) * 24 * KB  # 1.5-3 MiB, tiny-1b's 24 KiB per token
        tier.write(f"k{i}", [memoryview(data(f"k{i}", n))], n)
        live.append(f"k{i}")
    assert tier.counters["pool_maps"] <= 12 and tier.counters["pool_reuses"] >= 288
    assert tier.pool.peak_resident_bytes <= tier.capacity_bytes
    out = memoryview(bytearray(tier.pool.in_use_bytes))
    for key in live:
        n = len(tier.view(key))
        tier.read(key, n, out[:n])
        assert bytes(out[:n]) == data(key, n)


def test_store_evictions_return_buffers_to_the_pool(tmp_path):
    n = 64 * KB
    cpu = CPUTier(10 * n)
    s = TieredStore([cpu, DiskTier(str(tmp_path / "disk"), 40 * n, IOMode.BUFFERED)])
    for i in range(30):
        assert s.put(f"k{i}", [memoryview(data(f"k{i}", n))]).tier == "cpu"
    used = s.usage()[0]["used_bytes"]
    # the entries the store demoted gave their buffers back: in use is exactly what the store counts in the tier
    assert cpu.pool.in_use_bytes == used == 8 * n
    assert cpu.counters["pool_maps"] == 8 and cpu.counters["pool_reuses"] == 22
    for i in range(30):  # demoted ones came out of pooled buffers (view) into files, exact
        out = memoryview(bytearray(n))
        assert s.get(f"k{i}", out).hit and bytes(out) == data(f"k{i}", n)
    for i in range(30):
        s.delete(f"k{i}")
    assert cpu.pool.in_use_bytes == 0
    assert cpu.pool.describe()["pool_free_buffers"] == cpu.counters["pool_maps"] - cpu.counters["pool_released"]


def test_entries_with_a_tail_demote_exact(tmp_path):
    n = 10 * PAGE + 123
    s = TieredStore([CPUTier(4 * n), DiskTier(str(tmp_path / "disk"), 40 * n, IOMode.BUFFERED)])
    for i in range(8):
        s.put(f"k{i}", [memoryview(data(f"k{i}", n))])
    assert s.usage()[1]["entries"] >= 4  # demoted through the read path (no view of an entry with a tail)
    for i in range(8):
        out = memoryview(bytearray(n))
        assert s.get(f"k{i}", out).hit and bytes(out) == data(f"k{i}", n)


def test_free_buffers_and_slack_are_released_to_stay_within_capacity():
    """A shorter entry in a reused buffer leaves the longer one's pages resident (slack); a put that needs the room
    gets it from free buffers first, then from slack, and the kernel's page table agrees with the count."""
    cap = 1024 * KB
    tier = CPUTier(cap)

    def put(key, n):
        tier.write(key, [memoryview(data(key, n))], n)

    put("a", 600 * KB)
    tier.delete("a")
    put("b", 700 * KB)  # too long for a's buffer; 600 + 700 > 1024, so the free buffer gives up its last 276 KiB
    assert tier.counters["pool_trims"] == 1 and tier.counters["pool_released"] == 0
    assert pool_present_bytes(tier.pool) == tier.pool.resident_bytes == 1024 * KB
    tier.delete("b")
    put("d", 660 * KB)  # reuses b's buffer: 40 KiB of slack stay resident past d's bytes
    assert tier.counters["pool_reuses"] == 1 and tier.counters["pool_maps"] == 2
    assert pool_present_bytes(tier.pool) == tier.pool.resident_bytes == 1024 * KB
    # 340 KiB reuses a's buffer (324 KiB still faulted in): the 16 KiB it lacks come from d's slack, d untouched
    put("e", 340 * KB)
    assert tier.counters["pool_trims"] == 2 and tier.counters["pool_reuses"] == 2 and tier.counters["pool_maps"] == 2
    assert pool_present_bytes(tier.pool) == tier.pool.resident_bytes == 1000 * KB <= cap
    out = memoryview(bytearray(660 * KB))
    tier.read("d", 660 * KB, out)
    assert bytes(out) == data("d", 660 * KB)


@pytest.mark.parametrize("tail", [1, PAGE - 1])
def test_a_shorter_entry_with_a_tail_takes_its_room_from_the_buffer_it_reuses(tail):
    """The only free buffer is the one reused and holds more pages than the new entry's body; the entry's tail (counted
    apart) fits only once those extra pages go. They are given back at once: no wait (the pool's 30 s were once spent
    here, at the end of every RAG run with a small CPU tier), no StorageFullError, and the page table agrees."""
    tier = CPUTier(200 * PAGE)
    tier.pool.wait_s = 0.01
    n = 200 * PAGE
    tier.write("a", [memoryview(data("a", n))], n)
    tier.delete("a")
    m = 190 * PAGE + tail  # body 190 pages in a's buffer (200 faulted in), a tail of `tail` bytes besides
    tier.write("b", [memoryview(data("b", m))], m)
    assert tier.counters["pool_waits"] == 0 and tier.counters["pool_reuses"] == 1
    assert pool_present_bytes(tier.pool) + tail == tier.pool.resident_bytes <= 200 * PAGE
    out = memoryview(bytearray(m))
    tier.read("b", m, out)
    assert bytes(out) == data("b", m)


def test_a_put_ahead_of_the_delete_that_makes_its_room_waits_for_it():
    pool = BufferPool(8 * PAGE)
    held = pool.acquire(6 * PAGE)
    got = []
    t = threading.Thread(target=lambda: got.append(pool.acquire(4 * PAGE)))
    t.start()
    wait_for(lambda: pool.counters["pool_waits"], timeout_s=30, interval_s=0.001, what="the second acquire to wait")
    assert not got and pool.resident_bytes == 6 * PAGE
    pool.release(held)
    t.join(timeout=30)
    assert not t.is_alive(), "the waiting acquire did not return once the room was released"
    assert got[0].length == 4 * PAGE and pool.resident_bytes <= 8 * PAGE


def test_a_put_that_cannot_fit_fails_instead_of_exceeding_capacity():
    pool = BufferPool(8 * PAGE, wait_s=0.01)
    pool.acquire(6 * PAGE)
    with pytest.raises(StorageFullError):
        pool.acquire(4 * PAGE)
    assert pool.resident_bytes == 6 * PAGE


def test_a_read_in_progress_keeps_its_buffer_until_it_ends(monkeypatch):
    n = 4 * 1024 * KB
    tier = CPUTier(3 * n)
    tier.write("k", [memoryview(data("k", n))], n)
    in_copy, deleted = threading.Event(), threading.Event()
    copyto = np.copyto

    def copy_that_pauses_in_the_reader(dst, src):  # holds the read in the middle of its copy
        if threading.current_thread().name == "reader":
            in_copy.set()
            deleted.wait(10)
        copyto(dst, src)

    monkeypatch.setattr(np, "copyto", copy_that_pauses_in_the_reader)
    out = memoryview(bytearray(n))
    t = threading.Thread(target=tier.read, args=("k", n, out), name="reader")
    t.start()
    in_copy.wait(10)
    tier.delete("k")
    assert tier.pool.in_use_bytes == n  # deleted, but being read: not back in the pool
    tier.write("other", [memoryview(data("o", n))], n)  # gets a buffer of its own, not the one being read
    assert tier.counters["pool_reuses"] == 0
    deleted.set()
    t.join()
    assert bytes(out) == data("k", n)
    assert tier.pool.in_use_bytes == n  # the reader gave it back when it was done


sizes = st.sampled_from([PAGE, 3 * PAGE + 5, 17 * PAGE, 20 * PAGE, 33 * PAGE - 1, 40 * PAGE])
ops = st.lists(st.tuples(st.sampled_from(["put", "put", "get", "delete"]), st.integers(0, 11), sizes), max_size=40)


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(per_thread=st.lists(ops, min_size=2, max_size=6))
def test_capacity_holds_in_real_memory_under_many_threads(tmp_path, per_thread):
    """Threads put, get and delete entries of several size classes (some with tails) through a store whose CPU
    tier is small: the pool's count never passes the capacity, the kernel's page table matches the count, every
    read is exact, and what is in use is what the store counts."""
    cap = 200 * PAGE
    cpu = CPUTier(cap)
    s = TieredStore([cpu, DiskTier(str(tmp_path / f"d{time.monotonic_ns()}"), 4000 * PAGE, IOMode.BUFFERED)])
    errors = []

    def worker(seq):
        try:
            for op, k, n in seq:
                key = f"key{k}-{n}"
                if op == "put":
                    s.put(key, [memoryview(data(key, n))])
                elif op == "get":
                    out = memoryview(bytearray(n))
                    if s.get(key, out).hit and bytes(out) != data(key, n):
                        errors.append(f"wrong bytes for {key}")
                else:
                    s.delete(key)
        except Exception as exc:  # pragma: no cover - surfaced below
            errors.append(repr(exc))

    threads = [threading.Thread(target=worker, args=(seq,)) for seq in per_thread]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert cpu.pool.peak_resident_bytes <= cap
    tails = sum(int(k.rsplit("-", 1)[1]) % PAGE for k in s.keys_by_tier()["cpu"])
    assert pool_present_bytes(cpu.pool) + tails == cpu.pool.resident_bytes <= cap
    assert cpu.pool.in_use_bytes == s.usage()[0]["used_bytes"]
    s.close()
