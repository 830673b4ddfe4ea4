"""The contract every kvtier tier keeps, written once and run by each tier's own test module against its real backing
(the local disk, a shared directory, Redis, a Mooncake Store, an S3 bucket on Ceph), so a tier kind added later is
held to the same answers as the disk tier:

1. every size around the 4 KiB page round-trips, and the reported bytes are the entry's;
2. a missing key is EntryNotFound, and deleting one is no error;
3. a read of another length is refused (CorruptEntryError): no part of an entry is ever served as a whole one;
4. an overwrite serves the new entry, of the same length or another;
5. a delete makes a miss;
6. through a store: the capacity is kept and an evicted entry is gone from the backing, not just from the index;
7. atomic visibility: while one instance overwrites entries, a reader (another instance where the tier is shared,
   the same one where it is not) sees each as a miss or one whole version, never a mix or a part;
8. a shared tier's second instance finds (`probe`) what the first stored, with its length, shape and dtype.

`make(prefix, cap)` gives a fresh instance on the module's backing; two instances of one prefix see the same entries
where the tier is shared (a `probe` method says it is). Each check closes what it makes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from helpers import wait_for
from store_helpers import data

from kvconnector.entry_format import PAGE
from kvconnector.errors import CorruptEntryError, EntryNotFound
from kvconnector.store import TieredStore
from kvconnector.tiers import Tier

MB = 1 << 20
Make = Callable[..., Tier]


def _read(t: Tier, key: str, n: int) -> bytes:
    out = memoryview(bytearray(n))
    assert t.read(key, n, out).nbytes == n
    return bytes(out)


def round_trip_of_every_size(make: Make) -> None:
    t = make("sizes")
    try:
        sizes = [0, 1, PAGE - 1, PAGE, PAGE + 1, 3 * PAGE + 7, 300_001]
        for n in sizes:
            assert t.write(f"s{n}", [memoryview(data(f"s{n}", n))], n, (n,), "uint8").nbytes == n
        for n in sizes:
            assert _read(t, f"s{n}", n) == data(f"s{n}", n), (t.kind, n)
    finally:
        t.close()


def a_miss_is_entry_not_found(make: Make) -> None:
    t = make("miss")
    try:
        with pytest.raises(EntryNotFound):
            t.read("absent", 10, memoryview(bytearray(10)))
        t.delete("absent")
    finally:
        t.close()


def another_length_is_refused(make: Make) -> None:
    t = make("length")
    try:
        t.write("k", [memoryview(data("k", 5000))], 5000)
        for n in (4999, 5001, 1, PAGE):
            with pytest.raises(CorruptEntryError):
                t.read("k", n, memoryview(bytearray(n)))
        assert _read(t, "k", 5000) == data("k", 5000)
    finally:
        t.close()


def an_overwrite_serves_the_new_entry(make: Make) -> None:
    t = make("overwrite")
    try:
        t.write("k", [memoryview(data("v1", 9000))], 9000)
        t.write("k", [memoryview(data("v2", 9000))], 9000)
        assert _read(t, "k", 9000) == data("v2", 9000)
        t.write("k", [memoryview(data("v3", 100))], 100)
        assert _read(t, "k", 100) == data("v3", 100)
    finally:
        t.close()


def a_delete_makes_a_miss(make: Make) -> None:
    t = make("delete")
    try:
        t.write("k", [memoryview(data("k", 3000))], 3000)
        t.delete("k")
        with pytest.raises(EntryNotFound):
            t.read("k", 3000, memoryview(bytearray(3000)))
    finally:
        t.close()


def capacity_is_kept_and_the_evicted_are_gone(make: Make) -> None:
    n, cap = 20_000, 400_000
    s = TieredStore([make("capacity", cap)])
    t = s.tiers[0]
    try:
        for i in range(40):
            assert s.put(f"e{i}", [memoryview(data(f"e{i}", n))]).stored
            assert s.usage()[0]["used_bytes"] <= cap
        kept = set(s.keys_by_tier()[t.name])
        assert 0 < len(kept) < 40 and "e39" in kept
        for i in range(40):
            if f"e{i}" not in kept:  # asked of the backing itself: the tier holds no index of its own to consult
                with pytest.raises(EntryNotFound):
                    t.read(f"e{i}", n, memoryview(bytearray(n)))
        out = memoryview(bytearray(n))
        assert s.get("e39", out).hit and bytes(out) == data("e39", n)
    finally:
        s.close()


def readers_never_see_part_of_an_entry(make: Make) -> None:
    writer = make("atomic", 64 * MB)
    reader = make("atomic", 64 * MB) if hasattr(writer, "probe") else writer
    n, keys = 2 * MB, [f"big{i}" for i in range(6)]
    versions = {k: {data(k + v, n)[:64] for v in ("", "v2")} for k in keys}
    seen = {"hit": 0, "miss": 0, "corrupt": 0, "other": 0}
    done = threading.Event()

    def read_all() -> None:
        out = memoryview(bytearray(n))
        while not done.is_set():
            for k in keys:
                try:
                    reader.read(k, n, out)
                    seen["hit" if bytes(out[:64]) in versions[k] else "other"] += 1
                except EntryNotFound:
                    seen["miss"] += 1
                except CorruptEntryError:
                    seen["corrupt"] += 1

    th = threading.Thread(target=read_all)
    th.start()
    try:
        for v in ("", "v2"):
            for k in keys:
                writer.write(k, [memoryview(data(k + v, n))], n)
        wait_for(lambda: seen["hit"] >= 2 * len(keys), timeout_s=60, what="the reader to see every entry")
    finally:
        done.set()
        th.join(60)
        writer.close()
        if reader is not writer:
            reader.close()
    print(f"{writer.kind}: reads while writing: {seen}")
    assert seen["corrupt"] == 0 and seen["other"] == 0 and seen["hit"] >= 2 * len(keys), seen


def a_second_instance_finds_what_the_first_stored(make: Make) -> None:
    a = make("adopt")
    if not hasattr(a, "probe"):
        a.close()
        pytest.skip(f"{a.kind}: not a shared tier")
    b = make("adopt")
    try:
        a.write("k", [memoryview(data("k", 7000))], 7000, (7, 1000), "float16")
        hdr = b.probe("k")
        assert hdr is not None
        assert (hdr.key, hdr.payload_nbytes, hdr.shape, hdr.dtype) == ("k", 7000, (7, 1000), "float16")
        assert _read(b, "k", 7000) == data("k", 7000)
        assert b.probe("absent") is None
    finally:
        a.close()
        b.close()


CONTRACT = [
    round_trip_of_every_size,
    a_miss_is_entry_not_found,
    another_length_is_refused,
    an_overwrite_serves_the_new_entry,
    a_delete_makes_a_miss,
    capacity_is_kept_and_the_evicted_are_gone,
    readers_never_see_part_of_an_entry,
    a_second_instance_finds_what_the_first_stored,
]


def contract_cases(marks=()) -> list:
    """The checks as pytest params (named after their functions), for `@pytest.mark.parametrize("check", ...)`."""
    return [pytest.param(c, id=c.__name__, marks=marks) for c in CONTRACT]
