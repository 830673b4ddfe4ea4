"""The store's API contract (kvconnector/store.py's docstring, errors.py): a key some tier cannot hold is refused at
the store's door with InvalidArgumentError and never poisons an eviction of other keys; a move that fails restores
the accounting and leaves no temp file; every argument mistake has its documented class; a closed store refuses
everything. Real tiers, real files (both I/O modes, O_DIRECT where the filesystem takes it)."""

from __future__ import annotations

import math
import os
import shutil
import threading
from collections.abc import Sequence

import numpy as np
import pytest
from store_helpers import data, put, read

from kvconnector.entry_format import MAX_KEY_BYTES, PAGE, TEMP_NAME
from kvconnector.errors import ConfigError, InvalidArgumentError, StoreClosedError
from kvconnector.persistence import rescan_dir
from kvconnector.redis_tier import RedisTier
from kvconnector.store import TieredStore
from kvconnector.tiers import CPUTier, DiskTier, GPUTier
from kvconnector.timed_io import IOMode, probe_direct

KB = 1024


@pytest.fixture(params=[IOMode.BUFFERED, IOMode.DIRECT], ids=lambda m: m.name)
def io_mode(request, tmp_path):
    if request.param is IOMode.DIRECT and not probe_direct(str(tmp_path)):
        pytest.skip(f"the filesystem of {tmp_path} refuses O_DIRECT; pytest --basetemp=<dir on ext4/xfs> runs these")
    return request.param


def make_store(tmp_path, io_mode=IOMode.BUFFERED, cpu=40 * KB, disk=100 * KB, **kw):
    tiers = [CPUTier(cpu)] if cpu else []
    tiers.append(DiskTier(str(tmp_path / "disk"), disk, io_mode))
    return TieredStore(tiers, **kw)


def temp_files(directory) -> list[str]:
    return [n for n in os.listdir(directory) if TEMP_NAME.fullmatch(n) or ".tmp" in n]


def consistent(s: TieredStore) -> None:
    """The store's count of each tier is the sum of its entries' sizes, and the disk holds one file per entry."""
    for u in s.usage():
        keys = s.keys_by_tier()[u["tier"]]
        assert u["used_bytes"] == sum(s.entry_info(k)[0] for k in keys), u
        assert u["entries"] == len(keys)
    disk = s.tiers[-1]
    assert not temp_files(disk.directory)
    files = [n for n in os.listdir(disk.directory) if n.endswith(".kv")]
    assert len(files) == s.usage()[-1]["entries"]


# ---- keys ------------------------------------------------------------------------------------------------------------
REFUSED_KEYS = [
    pytest.param("x" * 4000, id="4000-ascii"),  # the example: over 3,984 bytes
    pytest.param("x" * (MAX_KEY_BYTES + 1), id="limit+1-ascii"),
    pytest.param("é" * (MAX_KEY_BYTES // 2 + 1), id="limit+2-bytes-2-byte-chars"),  # short in characters, long in bytes
    pytest.param("€" * (MAX_KEY_BYTES // 3) + "a", id="limit+1-bytes-3-byte-chars"),
    pytest.param("a\udc80", id="lone-low-surrogate"),  # the example
    pytest.param("\ud800", id="lone-high-surrogate-alone"),
    pytest.param("k\ud83d", id="half-a-pair"),
    pytest.param(b"key", id="bytes"),
    pytest.param(1, id="int"),
    pytest.param(None, id="None"),
    pytest.param(("k",), id="tuple"),
]

ACCEPTED_KEYS = [
    "",
    ".",
    "..",
    "../../etc/passwd",
    "a/b",
    "a\\b",
    "a\nb",
    "a\0b",
    "\0",
    " ",
    "x" * MAX_KEY_BYTES,  # exactly the limit
    "€" * (MAX_KEY_BYTES // 3),  # exactly the limit in 3-byte characters
    "model@1@0@abc@bf16",
    "😀" * 10,  # a proper surrogate pair in UTF-16 terms: fine in UTF-8
]


@pytest.mark.parametrize("key", REFUSED_KEYS)
def test_a_key_the_disk_tier_cannot_hold_is_refused_at_every_entry_point(tmp_path, key):
    s = make_store(tmp_path)
    calls = {
        "put": lambda: s.put(key, [memoryview(bytes(16 * KB))]),
        "get": lambda: s.get(key),
        "contains": lambda: s.contains(key),
        "entry_info": lambda: s.entry_info(key),
        "pin": lambda: s.pin(key),
        "unpin": lambda: s.unpin(key),
        "delete": lambda: s.delete(key),
        "touch": lambda: s.touch(["fine", key]),
        "adopt": lambda: s.adopt(1, key, 16 * KB),
    }
    for name, call in calls.items():
        with pytest.raises(InvalidArgumentError) as info:
            call()
        assert "\n" not in str(info.value) and len(str(info.value)) < 200, name
        assert isinstance(info.value, ValueError)  # callers that catch ValueError keep working
    assert len(s) == 0 and all(u["used_bytes"] == 0 for u in s.usage())
    s.close()
    assert os.listdir(tmp_path / "disk") == [".kvtier-tier"]


@pytest.mark.parametrize("bad", ["x" * 4000, "a\udc80"])
def test_a_refused_key_never_poisons_the_eviction_of_other_keys(tmp_path, bad):
    """The issue's case: a key only the disk tier cannot hold used to enter the CPU tier, and the put that later
    pushed it down raised, leaked its 16 KiB of CPU accounting and left a .kv.tmp behind for good."""
    s = make_store(tmp_path)
    with pytest.raises(InvalidArgumentError):
        s.put(bad, [memoryview(bytes(16 * KB))])
    for i in range(12):  # 16 KiB entries: the CPU tier (32 KiB target) pushes most of them down
        assert put(s, f"k{i}", 16 * KB).stored
    assert s.stats[0].events["demotions_out"] >= 4 and not s.stats[0].events["move_failed"]
    consistent(s)
    for k in s.keys_by_tier()["disk"] + s.keys_by_tier()["cpu"]:
        res, got = read(s, k, 16 * KB)
        assert res.hit and got == data(k, 16 * KB)
    s.close()
    assert not temp_files(tmp_path / "disk")


def test_keys_the_tiers_can_hold_go_down_the_waterfall_and_survive_a_restart(tmp_path, io_mode):
    s = make_store(tmp_path, io_mode, cpu=20 * KB, disk=400 * KB)
    n = 4 * KB
    for k in ACCEPTED_KEYS:
        assert s.put(k, [memoryview(data(k, n))]).stored, repr(k)
    # The CPU tier holds 4 of them at most: the rest were pushed down to the disk, whose header holds the key.
    assert len(s.keys_by_tier()["disk"]) >= len(ACCEPTED_KEYS) - 4
    consistent(s)
    for k in ACCEPTED_KEYS:
        res, got = read(s, k, n)
        assert res.hit and got == data(k, n), repr(k)
    disk_keys = set(s.keys_by_tier()["disk"])
    s.close()
    # A restart: the rescan reads every key back from its file's header.
    s2 = TieredStore([DiskTier(str(tmp_path / "disk"), 400 * KB, io_mode)])
    rescan_dir(s2, 0)
    assert set(s2.keys_by_tier()["disk"]) == disk_keys
    for k in disk_keys:
        res, got = read(s2, k, n)
        assert res.hit and got == data(k, n), repr(k)
    s2.close()


def test_a_memory_only_store_holds_any_str_key(tmp_path):
    """The limit is the strictest tier's: with no tier writing a header, long and surrogate keys are fine."""
    s = TieredStore([CPUTier(64 * KB)])
    assert s.max_key_bytes is None
    for k in ("x" * 10_000, "a\udc80", ""):
        assert s.put(k, [memoryview(b"v" * 10)]).stored
        assert read(s, k, 10)[1] == b"v" * 10
    with pytest.raises(InvalidArgumentError):
        s.put(b"bytes", [memoryview(b"v")])  # still a str
    assert make_store(tmp_path).max_key_bytes == MAX_KEY_BYTES


def test_the_disk_tier_itself_refuses_such_a_key_without_a_temp_file_or_losing_a_spare(tmp_path, io_mode):
    """The tier's own API (benchmarks use it directly): the refusal leaves no temp file and costs no spare."""
    tier = DiskTier(str(tmp_path / "disk"), 1 << 20, io_mode, spare_ratio=1.0)
    tier.write("a", [memoryview(bytes(8 * KB))], 8 * KB)
    tier.delete("a")  # kept as a spare
    assert tier.describe()["spare_bytes"] > 0
    with pytest.raises(InvalidArgumentError):
        tier.write("a\udc80", [memoryview(bytes(8 * KB))], 8 * KB)  # no file name: the spare is not touched
    assert tier.describe()["spare_bytes"] > 0 and tier._spares
    with pytest.raises(InvalidArgumentError):
        tier.write("x" * 4000, [memoryview(bytes(8 * KB))], 8 * KB)  # the header refuses it: the spare is used up
    assert not temp_files(tier.directory) and tier.describe()["spare_bytes"] == 0
    tier.close()
    assert os.listdir(tier.directory) == [".kvtier-tier"]


# ---- a move that fails ----------------------------------------------------------------------------------------------
def test_a_demotion_that_fails_restores_the_accounting(tmp_path):
    """The disk tier's directory vanishes behind the store's back: pushing an entry down fails for real (ENOENT).
    The put that caused it reports the failure; the victim is dropped, no byte of either tier is left counted."""
    s = make_store(tmp_path)
    for i in range(2):
        assert put(s, f"k{i}", 16 * KB).tier == "cpu"
    shutil.rmtree(tmp_path / "disk")
    with pytest.raises(OSError):
        put(s, "k2", 16 * KB)  # must push k0 down
    assert s.stats[0].events["move_failed"] == 1
    assert s.contains("k0") is None and s.contains("k2") is None
    u = {x["tier"]: x for x in s.usage()}
    assert u["cpu"]["used_bytes"] == 16 * KB and u["cpu"]["entries"] == 1  # k1 only
    assert u["disk"]["used_bytes"] == 0
    # The CPU tier's memory is the count: its pool holds k1's bytes, not k0's too.
    assert s.tiers[0].pool.in_use_bytes == 16 * KB
    # The store still works in the tier that does.
    assert put(s, "k3", 8 * KB).tier == "cpu" and read(s, "k1", 16 * KB)[1] == data("k1", 16 * KB)
    s.close()


# ---- empty entries --------------------------------------------------------------------------------------------------
def test_an_empty_entry_is_a_value_in_every_tier(tmp_path, io_mode):
    s = make_store(tmp_path, io_mode, cpu=20 * KB)
    assert s.put("empty-cpu", [memoryview(b"")]).tier == "cpu"
    assert s.put("empty-chunks", [memoryview(b""), memoryview(bytearray())]).tier == "cpu"
    assert s.put("empty-lone", b"").tier == "cpu"
    for i in range(6):  # push the empty ones down to the disk tier
        put(s, f"f{i}", 8 * KB)
    for k in ("empty-cpu", "empty-chunks", "empty-lone"):
        res = s.get(k, memoryview(bytearray()))
        assert res.hit and s.entry_info(k)[0] == 0
        assert s.get(k).hit
    assert "disk" in {s.contains(k) for k in ("empty-cpu", "empty-chunks", "empty-lone")}
    consistent(s)
    s.close()
    disk_only = TieredStore([DiskTier(str(tmp_path / "d2"), 100 * KB, io_mode)])
    assert disk_only.put("e", [memoryview(b"")]).tier == "disk"
    sentinel = bytearray(b"\xaa" * 8)
    assert disk_only.get("e", sentinel).hit and sentinel == b"\xaa" * 8  # nothing written past 0 bytes
    disk_only.close()


# ---- buffers -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tier", ["cpu", "disk"])
def test_a_destination_too_small_is_refused_naming_sizes_and_the_entry_stays(tmp_path, io_mode, tier):
    s = make_store(tmp_path, io_mode, cpu=40 * KB if tier == "cpu" else 0)
    put(s, "k", 10 * KB + 5)
    assert s.contains("k") == tier
    for size in (0, 1, 10 * KB + 4):
        with pytest.raises(InvalidArgumentError, match=f"dest holds {size} bytes.* has {10 * KB + 5}"):
            s.get("k", bytearray(size))
    assert s.events["hits"] == 0 and s.events["misses"] == 0
    # A larger one takes the entry in its first bytes and keeps the rest as it was.
    big = bytearray(b"\xee" * (12 * KB))
    assert s.get("k", big).hit
    assert bytes(big[: 10 * KB + 5]) == data("k", 10 * KB + 5) and big[10 * KB + 5 :] == b"\xee" * (2 * KB - 5)
    s.close()


def test_destinations_of_every_buffer_kind(tmp_path, io_mode):
    s = make_store(tmp_path, io_mode, cpu=0)
    n = 8 * KB
    put(s, "k", n)
    want = data("k", n)
    ok = {
        "bytearray": bytearray(n),
        "memoryview": memoryview(bytearray(n)),
        "numpy-uint8": np.zeros(n, np.uint8),
        "numpy-float32": np.zeros(n // 4, np.float32),  # the same bytes as floats
        "numpy-2d": np.zeros((2, n // 2), np.uint8),
    }
    for name, dest in ok.items():
        assert s.get("k", dest).hit, name
        assert memoryview(dest).cast("B").tobytes() == want, name
    refused = {
        "bytes (read-only)": bytes(n),
        "read-only numpy": np.frombuffer(bytes(n), np.uint8),
        "strided numpy": np.zeros(2 * n, np.uint8)[::2],
        "str": "x" * n,
        "int": n,
        "list": [0] * n,
    }
    for dest in refused.values():
        with pytest.raises(InvalidArgumentError):
            s.get("k", dest)
    assert s.get("k").hit  # the entry is intact
    s.close()


class Pieces(Sequence):
    """A sequence that makes its views when asked (as the benchmark's payload does): no list, no buffer itself."""

    def __init__(self, data: bytes, size: int) -> None:
        self.view, self.size = memoryview(data), size

    def __len__(self) -> int:
        return -(-len(self.view) // self.size)

    def __getitem__(self, i):
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self.view[i * self.size : (i + 1) * self.size]


def test_chunks_of_every_buffer_kind_are_stored_as_their_bytes(tmp_path, io_mode):
    s = make_store(tmp_path, io_mode, cpu=0)
    floats = np.arange(1024, dtype=np.float32)  # 4 KiB as 1024 elements: len() of its memoryview is 1024
    cases = {
        "bytes": [b"a" * 100],
        "bytearray": [bytearray(b"b" * 100)],
        "memoryview-of-floats": [memoryview(floats)],
        "numpy-float32": [floats],
        "numpy-2d": [np.ones((4, 8), np.uint16)],
        "mixed": [b"x", bytearray(b"yy"), memoryview(b"zzz"), np.array([1, 2], np.uint8)],
        "tuple": (b"t" * 10, b"u" * 10),
        "lazy-sequence": Pieces(b"abcdefgh", 3),
        "lone-bytes": b"lone",
        "page-and-small-pieces": [bytes(PAGE + 10), b"ab", b"c"],  # the tail page spans three chunks
        "small-pieces-only": [b"a", b"b", b"c"],
        "page-multiple-then-empty": [bytes(PAGE), b""],
    }
    for name, chunks in cases.items():
        items = [chunks] if isinstance(chunks, bytes) else list(chunks)
        expect = b"".join(memoryview(c).cast("B").tobytes() for c in items)
        r = s.put(name, chunks)
        assert r.stored and s.entry_info(name)[0] == len(expect), name
        assert read(s, name, len(expect))[1] == expect, name
    for name, chunks in {
        "int": [5],
        "str": ["abc"],
        "a str alone": "abc",
        "a float": 1.5,
        "None": None,
        "strided": [np.zeros(64, np.uint8)[::2]],
    }.items():
        with pytest.raises(InvalidArgumentError):
            s.put(f"bad-{name}", chunks)
        assert s.contains(f"bad-{name}") is None
    consistent(s)
    s.close()


@pytest.mark.slow  # importing torch takes seconds
def test_torch_cpu_tensors_are_refused_and_their_numpy_views_taken(tmp_path):
    torch = pytest.importorskip("torch")
    s = make_store(tmp_path, cpu=0)
    t = torch.arange(1024, dtype=torch.int32)
    with pytest.raises(InvalidArgumentError, match="not Tensor"):
        s.put("t", [t])
    assert s.put("t", [t.numpy()]).stored
    with pytest.raises(InvalidArgumentError, match="not Tensor"):
        s.get("t", torch.zeros(1024, dtype=torch.int32))
    out = torch.zeros(1024, dtype=torch.int32)
    assert s.get("t", out.numpy()).hit and torch.equal(out, t)
    s.close()


@pytest.mark.parametrize(
    "shape, dtype",
    [((1,) * 9, "uint8"), ((-1,), "uint8"), ((1.5,), "uint8"), ((True,), "uint8"), ((2**64,), "uint8"),
     ((), "bfloat16x"), ((), ""), ((), 5), ((), "é"), ("12", "uint8")],
)  # fmt: skip
def test_a_shape_or_dtype_the_header_cannot_hold_is_refused_before_anything_is_written(tmp_path, shape, dtype):
    s = make_store(tmp_path)
    with pytest.raises(InvalidArgumentError):
        s.put("k", [memoryview(bytes(100))], shape, dtype)
    assert len(s) == 0 and s.usage()[0]["used_bytes"] == 0
    assert s.put("k", [memoryview(bytes(100))], (2, 50), "bf16/1").stored  # 8 characters: fits
    s.close()


def test_a_value_larger_than_every_tier_is_not_stored_and_leaves_nothing(tmp_path, io_mode):
    s = make_store(tmp_path, io_mode)
    put(s, "small", KB)
    for n in (100 * KB, 96 * KB, 10 << 20):  # the disk tier's whole capacity, just over its 0.95, far over
        r = s.put(f"big{n}", [memoryview(bytes(n))])
        assert not r.stored and r.reason == "no tier has room"
    assert s.contains("small") == "cpu"
    consistent(s)
    s.close()


# ---- capacities and the store's settings ------------------------------------------------------------------------
BAD_CAPACITIES = [math.nan, math.inf, -math.inf, -1, -1.5, 0.5, True, False, "100", None, b"1", [1], 1e400]


@pytest.mark.parametrize("cap", BAD_CAPACITIES, ids=repr)
def test_a_capacity_that_is_not_a_finite_positive_number_is_a_config_error(tmp_path, cap):
    makers = {
        "cpu": lambda: CPUTier(cap),
        "gpu": lambda: GPUTier(cap),  # refused before it looks for a GPU
        "redis": lambda: RedisTier("redis://127.0.0.1:1", cap),  # refused before it connects
    }
    if cap is not False:  # 0 is the disk tier's "all the free space", False is refused as a bool below
        makers["disk"] = lambda: DiskTier(str(tmp_path / "disk"), cap)
    for make in makers.values():
        with pytest.raises(ConfigError, match="capacity"):
            make()
    assert not (tmp_path / "disk").exists() or os.listdir(tmp_path / "disk") == []


def test_disk_capacity_zero_means_the_free_space_and_nothing_below_it_does(tmp_path):
    for zero in (0, 0.0, -0.0):
        t = DiskTier(str(tmp_path / f"d{zero!r}"), zero)
        assert t.capacity_bytes == shutil.disk_usage(tmp_path).free or t.capacity_bytes > 1 << 20
        t.close()
    with pytest.raises(ConfigError):
        DiskTier(str(tmp_path / "neg"), -4096)  # once "auto" as well
    with pytest.raises(ConfigError):
        DiskTier(str(tmp_path / "f"), False)
    big = CPUTier(10**30)  # huge is only a limit: accepted
    assert big.capacity_bytes == 10**30
    assert CPUTier(4096.9).capacity_bytes == 4096  # whole bytes
    assert CPUTier(np.int64(8192)).capacity_bytes == 8192


@pytest.mark.parametrize(
    "kw",
    [{"io_mode": "bogus"}, {"io_mode": None}, {"spare_ratio": math.nan}, {"spare_ratio": -0.1}, {"spare_ratio": 2}],
)
def test_disk_tier_settings_are_config_errors(tmp_path, kw):
    with pytest.raises(ConfigError):
        DiskTier(str(tmp_path / "disk"), 1 << 20, **kw)


@pytest.mark.parametrize("directory", ["", "a\0b"])
def test_a_disk_directory_that_cannot_be_a_path_is_a_config_error(tmp_path, directory, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError):
        DiskTier(directory, 1 << 20)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("ratio", [math.nan, math.inf, 0, -0.0, 1.5, True, "0.8", None])
def test_store_ratios_are_config_errors(ratio):
    for kw in ({"target_usage_ratio": ratio}, {"large_entry_limit_ratio": ratio}):
        with pytest.raises(ConfigError):
            TieredStore([CPUTier(KB)], **kw)


def test_a_tier_serves_one_store_once(tmp_path):
    cpu, cpu2 = CPUTier(KB), CPUTier(KB)
    with pytest.raises(ConfigError, match="given twice"):
        TieredStore([cpu, cpu])
    disk = DiskTier(str(tmp_path / "disk"), 100 * KB)
    with pytest.raises(ConfigError, match="given twice"):
        TieredStore([cpu, disk, cpu])
    with pytest.raises(ConfigError, match="named 'cpu'"):
        TieredStore([cpu, cpu2])
    with pytest.raises(ConfigError):
        TieredStore([cpu, "disk"])
    with pytest.raises(ConfigError):
        TieredStore([])
    s = TieredStore([cpu, disk])
    with pytest.raises(ConfigError, match="another store"):
        TieredStore([disk])
    s.close()


# ---- after close -----------------------------------------------------------------------------------------------------
def test_every_operation_after_close_is_refused_and_nothing_is_written(tmp_path, io_mode):
    s = make_store(tmp_path, io_mode)
    put(s, "k", KB)
    s.close()
    s.close()  # a second close does nothing
    calls = {
        "put": lambda: s.put("new", [memoryview(bytes(KB))]),
        "put-existing": lambda: s.put("k", [memoryview(bytes(KB))]),
        "get": lambda: s.get("k"),
        "get-into": lambda: s.get("k", bytearray(KB)),
        "contains": lambda: s.contains("k"),
        "entry_info": lambda: s.entry_info("k"),
        "delete": lambda: s.delete("k"),
        "pin": lambda: s.pin("k"),
        "unpin": lambda: s.unpin("k"),
        "touch": lambda: s.touch(["k"]),
        "adopt": lambda: s.adopt(1, "other", KB),
    }
    for call in calls.values():
        with pytest.raises(StoreClosedError):
            call()
    assert s.closed and s.usage()[0]["entries"] == 1  # the figures as they were at close
    assert os.listdir(tmp_path / "disk") == [".kvtier-tier"]


def test_close_during_puts_waits_for_them_and_leaves_no_temp_file(tmp_path, io_mode):
    s = make_store(tmp_path, io_mode, cpu=16 * KB, disk=400 * KB)
    outcomes: list[str] = []
    started = threading.Barrier(5)

    def writer(w: int) -> None:
        started.wait()
        for i in range(10_000):
            try:
                r = put(s, f"w{w}-{i}", 4 * KB)
            except StoreClosedError:
                outcomes.append("closed")
                return
            outcomes.append("stored" if r.stored else r.reason)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    started.wait()
    while len(outcomes) < 20:  # some puts (and demotions to disk) done, more in flight
        threading.Event().wait(0.001)
    s.close()
    assert s._active == 0  # close returned only once no operation was running
    for t in threads:
        t.join(10)
    assert outcomes.count("closed") == 4 and set(outcomes) <= {"stored", "closed", "no tier has room"}
    names = os.listdir(tmp_path / "disk")
    assert not temp_files(tmp_path / "disk"), names


# ---- the backend's configuration ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "extra, key",
    [
        ({"disk_dir": "/tmp/a\0b"}, "disk_dir"),
        ({"shared_dir": "/tmp/s\0"}, "shared_dir"),
        ({"disk_dir": "/tmp/a", "snapshot_path": "/tmp/s\0.json"}, "snapshot_path"),
        ({"redis_url": "redis://h\0st:6379"}, "redis_url"),
        ({"disk_dir": "/tmp/a", "metrics_host": "127.0.0.1\0"}, "metrics_host"),
        ({"disk_dir": "/tmp/a", "disk_capacity_gb": True}, "disk_capacity_gb"),
        ({"disk_dir": "/tmp/a", "disk_capacity_gb": False}, "disk_capacity_gb"),
        ({"shared_dir": "/tmp/s", "shared_capacity_gb": True}, "shared_capacity_gb"),
        ({"redis_url": "redis://h:1", "redis_capacity_gb": True}, "redis_capacity_gb"),
        ({"disk_dir": "/tmp/a", "disk_capacity_gb": "4"}, "disk_capacity_gb"),
        ({"disk_dir": "/tmp/a", "disk_capacity_gb": math.nan}, "disk_capacity_gb"),
        ({"disk_dir": "/tmp/a", "disk_capacity_gb": math.inf}, "disk_capacity_gb"),
        ({"disk_dir": "/tmp/a", "disk_capacity_gb": -0.5}, "disk_capacity_gb"),
        ({"disk_dir": "/tmp/a", "io_uring_pin_gb": True}, "io_uring_pin_gb"),
        ({"disk_dir": "/tmp/a", "io_workers": True}, "io_workers"),
        ({"disk_dir": "/tmp/a", "metrics_port": True}, "metrics_port"),
        ({"disk_dir": "/tmp/a", "target_usage_ratio": True}, "target_usage_ratio"),
        ({"disk_dir": "/tmp/a", "promote_on_hit": "yes"}, "promote_on_hit"),
        ({"disk_dir": "/tmp/a", "promote_on_hit": 1}, "promote_on_hit"),
    ],
)
def test_backend_config_refuses_nul_bytes_and_values_of_the_wrong_type_naming_the_key(extra, key):
    from kvconnector.backend_config import BackendConfig

    with pytest.raises(ConfigError) as info:
        BackendConfig.from_params(extra)
    line = str(info.value)
    assert line.startswith(f"kvtier: invalid configuration: kvtier.{key}: ") and "\n" not in line


def test_backend_config_takes_numbers_as_numbers():
    from kvconnector.backend_config import BackendConfig

    cfg = BackendConfig.from_params({"disk_dir": "/tmp/a", "disk_capacity_gb": 4, "shared_dir": "/tmp/s"})
    assert cfg.disk_capacity_gb == 4.0 and isinstance(cfg.disk_capacity_gb, float)
    assert BackendConfig.from_params({"disk_dir": "/tmp/a", "disk_capacity_gb": 0.5}).disk_capacity_gb == 0.5
