"""The Mooncake Store tier against a real Mooncake Store on 127.0.0.1: the wheel's mooncake_master and HTTP metadata
server, started by a session fixture and stopped at its end (the fault tests start their own, to kill it). The same
checks as the Redis tier's (round trip, miss, a damaged value refused, the waterfall from disk, a second instance
adopting what the first stored), then what a Mooncake master adds: killed (misses and refused stores, bounded),
restarted (the tier comes back), hung (each call ends, never hangs). A test starting a client takes 1-3 s: slow."""

from __future__ import annotations

import signal
import time

import pytest
from helpers import free_port, wait_for
from mooncake_server import MooncakeServer
from store_helpers import data
from tier_contract import contract_cases

from kvconnector.backend import KvtierBackend
from kvconnector.backend_config import BackendConfig
from kvconnector.entry_format import MAX_KEY_BYTES, PAGE, EntryHeader, pack_header
from kvconnector.errors import ConfigError, CorruptEntryError, EntryNotFound, InvalidArgumentError
from kvconnector.mooncake_tier import MooncakeTier
from kvconnector.shared_tier import SharedTier
from kvconnector.store import TieredStore

N = 20_000
MB = 1 << 20


@pytest.fixture(scope="session")
def mooncake(tmp_path_factory):
    srv = MooncakeServer(tmp_path_factory.mktemp("mooncake")).start()
    try:
        yield srv
    finally:
        srv.stop()


def tier(srv, namespace, cap=16 * MB, **kw) -> MooncakeTier:
    return MooncakeTier(srv.master_addr, srv.metadata_url, cap, namespace=namespace, **kw)


def cfg(srv, namespace, **kw) -> BackendConfig:
    base = {
        "disk_capacity_gb": 0,
        "mooncake_master": srv.master_addr,
        "mooncake_metadata_url": srv.metadata_url,
        "mooncake_namespace": namespace,
        "mooncake_capacity_gb": 0.016,
        "snapshot_path": "",
    }
    return BackendConfig(**{**base, **kw})


def entry(key: str, payload: bytes, header_key: str | None = None, nbytes: int | None = None) -> bytes:
    """A value as the tier writes it (header page, payload), with the header's key or length changed if asked."""
    import xxhash

    hdr = bytearray(PAGE)
    n = len(payload) if nbytes is None else nbytes
    pack_header(memoryview(hdr), EntryHeader(header_key or key, n, xxhash.xxh3_64_intdigest(payload), "uint8", ()))
    return bytes(hdr) + payload


# ---- what every tier does ----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_round_trip_miss_probe_and_hashed_names(mooncake):
    t = tier(mooncake, "t1")
    try:
        assert isinstance(t, SharedTier) and t.max_key_bytes == MAX_KEY_BYTES
        t.write("m/../x@1", [memoryview(data("a", N))], N, (2, 3), "bf16/1")
        out = memoryview(bytearray(N))
        timing = t.read("m/../x@1", N, out)
        assert bytes(out) == data("a", N) and timing.device_ns > 0 and timing.host_ns > 0 and timing.nbytes == N
        assert t.read("m/../x@1", N).nbytes == N  # no destination: through the scratch buffer, still checked
        assert t.probe("m/../x@1").shape == (2, 3)
        assert t.probe("never stored") is None
        with pytest.raises(EntryNotFound):
            t.read("other", N, out)
        mkey = t._mkey("m/../x@1")
        assert mkey.startswith("t1:") and "/" not in mkey and t._s.is_exist(mkey) == 1
        t.write("", [memoryview(b"")], 0)  # an empty key and an empty entry are values like any other
        assert t.read("", 0).nbytes == 0
        t.delete("m/../x@1")
        assert t._s.is_exist(mkey) == 0
        t.delete("m/../x@1")  # twice: nothing left to remove, nothing counted
        assert not t.fallbacks
    finally:
        t.close()


# A value under the entry's Mooncake key that is not the entry: Mooncake cannot change an object in place, so each is
# put with the raw client, as another writer (or a torn transfer) would leave it.
DAMAGED = {
    "payload-byte-flipped": lambda k, p: entry(k, p)[: PAGE + 5] + bytes([p[5] ^ 0xFF]) + entry(k, p)[PAGE + 6 :],
    "last-byte-flipped": lambda k, p: entry(k, p)[:-1] + bytes([p[-1] ^ 1]),
    "header-byte-flipped": lambda k, p: b"KVTX" + entry(k, p)[4:],
    "header-checksum-flipped": lambda k, p: entry(k, p)[:60] + bytes([entry(k, p)[60] ^ 1]) + entry(k, p)[61:],
    "truncated": lambda k, p: entry(k, p)[:-100],
    "one-byte-longer": lambda k, p: entry(k, p) + b"\0",
    "another-key": lambda k, p: entry(k, p, header_key=k + "x"),
    "header-says-shorter": lambda k, p: entry(k, p[:-1], nbytes=len(p)),
    "no-header": lambda k, p: p + bytes(PAGE),
    "header-only": lambda k, p: entry(k, p)[:PAGE],
}


@pytest.mark.slow
@pytest.mark.parametrize("how", list(DAMAGED))
def test_a_damaged_value_is_refused_never_served(mooncake, how):
    t = tier(mooncake, f"bad-{how}")
    try:
        key, payload = "k", data("b", N)
        t.write(key, [memoryview(payload)], N)
        t._s.remove(t._mkey(key), True)
        assert t._s.put(t._mkey(key), DAMAGED[how](key, payload)) == 0
        out = memoryview(bytearray(b"\xee" * N))
        with pytest.raises(CorruptEntryError):
            t.read(key, N, out)
        # Found by a lookup instead: not adopted; a value whose header is bad is removed (counted).
        hdr = t.probe(key)
        assert hdr is None or hdr.payload_nbytes != N or hdr.key != key or how.endswith("flipped")
    finally:
        t.close()


@pytest.mark.slow
def test_a_flipped_byte_is_dropped_by_the_store_and_counted(mooncake):
    b = KvtierBackend(cfg(mooncake, "flip"))
    try:
        assert b.put("k", [memoryview(data("c", N))])
        t = b.store.tiers[0]
        good = entry("k", data("c", N))
        t._s.remove(t._mkey("k"), True)
        t._s.put(t._mkey("k"), good[: PAGE + 100] + bytes([good[PAGE + 100] ^ 0x40]) + good[PAGE + 101 :])
        out = memoryview(bytearray(N))
        assert not b.get_into("k", out)
        assert b.store.stats[0].to_dict()["events"]["corrupt_dropped"] == 1
        assert b.store.contains("k") is None and t._s.is_exist(t._mkey("k")) == 0  # dropped, and removed
    finally:
        b.close()


@pytest.mark.slow
def test_keys_are_checked_against_the_header_limit(mooncake):
    s = TieredStore([tier(mooncake, "keys")])
    try:
        assert s.max_key_bytes == MAX_KEY_BYTES
        for bad in ("x" * (MAX_KEY_BYTES + 1), "é" * (MAX_KEY_BYTES // 2 + 1), "\ud800", b"bytes", 7):
            with pytest.raises(InvalidArgumentError):
                s.put(bad, [memoryview(b"1")])
        assert s.put("x" * MAX_KEY_BYTES, [memoryview(b"1")]).stored
    finally:
        s.close()


@pytest.mark.slow
def test_waterfall_disk_to_mooncake_and_a_second_instance_adopts(mooncake, tmp_path):
    c = cfg(mooncake, "t2", disk_dir=str(tmp_path / "d"), disk_capacity_gb=1e-4, mooncake_capacity_gb=1e-3)
    b = KvtierBackend(c)
    other = None
    try:
        for i in range(20):
            assert b.put(f"k{i}", [memoryview(data(f"k{i}", N))])
        assert {b.store.contains(f"k{i}") for i in range(20)} == {"disk", "mooncake"}
        out = memoryview(bytearray(N))
        assert b.get_into("k0", out) and bytes(out) == data("k0", N)  # k0 was demoted to Mooncake
        in_mc = {f"k{i}" for i in range(20) if b.store.contains(f"k{i}") == "mooncake"}
        # A second instance (its own disk, its own client) finds what the first put into the store, on lookup.
        other = KvtierBackend(c.model_copy(update={"disk_dir": str(tmp_path / "d2")}))
        for k in sorted(in_mc):
            assert other.lookup(k) and other.get_into(k, out) and bytes(out) == data(k, N)
        assert not other.lookup("k19") or "k19" in in_mc
        assert other.events_snapshot()["shared_adopted"] == len(in_mc) > 0
    finally:
        if other is not None:
            other.close()
        b.close()


@pytest.mark.slow
def test_capacity_is_kept_and_the_evicted_are_removed_from_the_store(mooncake):
    cap = 400_000
    s = TieredStore([tier(mooncake, "cap", cap=cap, segment_bytes=16 * MB)])
    t = s.tiers[0]
    try:
        for i in range(40):
            assert s.put(f"e{i}", [memoryview(data(f"e{i}", N))]).stored
            assert s.usage()[0]["used_bytes"] <= cap
        kept = set(s.keys_by_tier()["mooncake"])
        assert 0 < len(kept) < 40 and "e39" in kept
        assert all(t._s.is_exist(t._mkey(f"e{i}")) == (f"e{i}" in kept) for i in range(40))
        st = s.stats[0].to_dict()
        assert st["events"]["evictions"] == 40 - len(kept) or st["events"].get("deletes", 0) >= 0
        out = memoryview(bytearray(N))
        assert s.get("e39", out).hit and bytes(out) == data("e39", N)
    finally:
        s.close()


def test_config_keys_are_checked():
    ok = {"mooncake_master": "h:1", "mooncake_metadata_url": "http://h:2/metadata", "disk_capacity_gb": 0}
    assert BackendConfig(**ok).mooncake_master == "h:1"
    bad = [
        ({"mooncake_master": "h:1", "disk_capacity_gb": 0}, "go together"),
        ({"mooncake_metadata_url": "http://h:2/metadata", "disk_capacity_gb": 0}, "go together"),
        ({**ok, "mooncake_master": "h"}, "host:port"),
        ({**ok, "mooncake_master": "h:0"}, "host:port"),
        ({**ok, "mooncake_master": "h:65536"}, "host:port"),
        ({**ok, "mooncake_master": ":50051"}, "host:port"),
        ({**ok, "mooncake_master": "h:5x"}, "host:port"),
        ({**ok, "mooncake_metadata_url": "h:2/metadata"}, "http"),
        ({**ok, "mooncake_metadata_url": "P2PHANDSHAKE"}, "http"),
        ({**ok, "mooncake_capacity_gb": 0}, "mooncake_capacity_gb"),
        ({**ok, "mooncake_capacity_gb": True}, "mooncake_capacity_gb"),
        ({**ok, "mooncake_segment_gb": -1}, "mooncake_segment_gb"),
        ({**ok, "mooncake_timeout_s": 0}, "mooncake_timeout_s"),
        ({**ok, "mooncake_segment_gb": 0.01}, "mooncake_segment_gb"),  # under Mooncake's 16 MiB
        ({**ok, "mooncake_local_buffer_mb": 8}, "mooncake_local_buffer_mb"),
        ({**ok, "mooncake_namespace": ""}, "mooncake_namespace"),
        ({**ok, "mooncake_master": "h\0:1"}, "NUL"),
        ({**ok, "mooncake_bogus": 1}, "mooncake_bogus"),
    ]
    for params, what in bad:
        with pytest.raises(ConfigError, match=what):
            BackendConfig.from_params(params)
    for master in ("h", "h:x", "h:0"):
        with pytest.raises(ConfigError, match="host:port"):
            MooncakeTier(master, "http://h:2/metadata", MB)
    with pytest.raises(ConfigError, match="http"):
        MooncakeTier("h:1", "etcd://h:2", MB)
    with pytest.raises(ConfigError, match="capacity"):
        MooncakeTier("h:1", "http://h:2/metadata", float("nan"))
    with pytest.raises(ConfigError, match="16 MiB"):
        MooncakeTier("h:1", "http://h:2/metadata", MB, segment_bytes=8 * MB)


@pytest.mark.slow
def test_an_unreachable_master_is_a_config_error_within_seconds():
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match="Mooncake client did not start"):
        MooncakeTier(f"127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}/metadata", MB, timeout_s=1)
    assert time.monotonic() - t0 < 15


# ---- faults: a master of their own, killed, restarted, hung ------------------------------------------------------
@pytest.fixture
def own_mooncake(tmp_path):
    srv = MooncakeServer(tmp_path).start()
    try:
        yield srv
    finally:
        srv.stop()


# Mooncake's client, once it lost its master, spends about 4.5 s per call reconnecting (measured here; the timeouts
# kvtier sets do not shorten it): the bound a call waits, with some room for a loaded machine.
RECONNECT_S = 8.0


def timed(fn, *args):
    t0 = time.monotonic()
    r = fn(*args)
    return r, time.monotonic() - t0


@pytest.mark.serial
def test_master_killed_misses_fast_and_restarted_comes_back(own_mooncake):
    srv = own_mooncake
    b = KvtierBackend(cfg(srv, "fault", mooncake_timeout_s=2.0))
    try:
        for i in range(10):
            assert b.put(f"k{i}", [memoryview(data(f"k{i}", N))])
        out = memoryview(bytearray(N))
        srv.kill_master()
        loads = [timed(b.get_into, f"k{i}", out) for i in range(4)]
        stores = [timed(b.put, f"n{i}", [memoryview(data(f"n{i}", N))]) for i in range(2)]
        print(
            f"master killed: loads {[f'{r}/{s:.2f}s' for r, s in loads]}; stores {[f'{r}/{s:.2f}s' for r, s in stores]}"
        )
        assert not any(r for r, _ in loads) and not any(r for r, _ in stores)
        assert max(s for _, s in loads + stores) < RECONNECT_S  # refused, or the client's reconnect: not a hang
        ev = b.events_snapshot()
        assert ev["load_errors"] + ev.get("load_misses", 0) == 4 and ev["store_errors"] == 2
        assert b.store.tiers[0].fallbacks["read_errors"] >= 1 and b.store.tiers[0].fallbacks["write_errors"] == 2

        srv.start_master()
        # The client mounts its segment again by itself; the new master knows no object (its index was in memory).
        t0 = time.monotonic()
        wait_for(lambda: b.put("after", [memoryview(data("after", N))]), timeout_s=20, what="a store to work again")
        print(f"master restarted: stores work again after {time.monotonic() - t0:.2f} s")
        assert b.get_into("after", out) and bytes(out) == data("after", N)
        assert not b.get_into("k9", out)  # lost with the old master: a miss, never stale bytes
        for i in range(10):
            assert b.put(f"again{i}", [memoryview(data(f"again{i}", N))])
            assert b.get_into(f"again{i}", out) and bytes(out) == data(f"again{i}", N)
    finally:
        b.close()


@pytest.mark.serial
def test_a_hung_master_costs_each_call_at_most_the_timeout(own_mooncake):
    srv = own_mooncake
    t = tier(srv, "hung", timeout_s=1.0)
    try:
        t.write("k", [memoryview(data("k", N))], N)
        srv.kill_master(signal.SIGSTOP)
        try:
            out = memoryview(bytearray(N))
            for op in (lambda: t.read("k", N, out), lambda: t.write("w", [memoryview(data("w", N))], N)):
                t0 = time.monotonic()
                with pytest.raises(OSError):
                    op()
                print(f"hung master: the first calls failed after {time.monotonic() - t0:.2f} s")
            for op in (lambda: t.read("k", N, out), lambda: t.write("w2", [memoryview(data("w", N))], N)):
                t0 = time.monotonic()
                with pytest.raises(OSError):
                    op()
                took = time.monotonic() - t0
                print(f"hung master: a call failed after {took:.2f} s")
                assert took < 1.0 + RECONNECT_S
            assert t.probe("k") is None and t.fallbacks["probe_errors"] == 1
        finally:
            srv.kill_master(signal.SIGCONT)
    finally:
        t.close()


@pytest.mark.slow
@pytest.mark.parametrize("check", contract_cases())
def test_the_tier_contract(mooncake, check):
    """The contract every tier keeps (tests/kvconnector/tier_contract.py), the disk tier's among them."""

    def make(prefix: str, cap: int = 16 * MB) -> MooncakeTier:
        return tier(mooncake, f"contract-{prefix}", cap=cap, segment_bytes=max(16 * MB, 2 * cap))

    check(make)
