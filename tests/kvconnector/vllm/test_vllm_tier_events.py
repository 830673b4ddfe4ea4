"""kvtier's tier publishes KV events as vLLM's own fs and object tiers do (`enable_kv_events`), through vLLM's classes.

The events go the way vLLM sends them: the tier's `take_events` -> the real `TieringOffloadingManager.take_events` ->
the connector's own `OffloadingEventsTracker` (BlockStored / BlockRemoved, vllm/distributed/kv_events.py) -> vLLM's
`ZmqEventPublisher`, bound to 127.0.0.1, -> a real ZMQ SUB socket, as a router (llm-d, Dynamo) subscribes. What is
checked against the real files: every key kvtier stored is announced once, every key it evicted or dropped is removed
once, with medium STORAGE, ownership `kvtier` and vLLM's block hash of the key. Runs on the installed vLLM; on vLLM's
newest release through test_vllm_newest.py.
"""

import dataclasses
import os
import time

import numpy as np
import pytest

pytest.importorskip("vllm.v1.kv_offload.tiering.spec", reason="vLLM with tiered offloading is not installed")

import msgspec
import zmq
from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVEventBatch, ZmqEventPublisher
from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash
from vllm.v1.kv_offload.base import Medium, OffloadingEvent, get_offload_block_hash

from kvconnector.entry_format import ENTRY_NAME
from kvconnector.errors import ConfigError
from kvconnector.vllm.driver import ManagerDriver, chunk_key, kvtier_tier_config
from kvconnector.vllm.tier import EVENT_OWNERSHIP, KvtierMetrics

pytestmark = pytest.mark.slow  # importing vLLM alone takes seconds (conftest.py)

CHUNK = 64 * 1024
PRIMARY = 16 * CHUNK
LABEL = ("1:KvtierTier",)


def payloads(n: int, seed: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [rng.bytes(CHUNK) for _ in range(n)]


def entry_files(d) -> list[str]:
    return sorted(p for p in os.listdir(d) if ENTRY_NAME.fullmatch(p))


def driver(tmp_path, *, kv_events=True, name="kv", **params) -> ManagerDriver:
    params.setdefault("disk_capacity_gb", 0.01)
    params.setdefault("enable_kv_events", True)
    tier = kvtier_tier_config(disk_dir=str(tmp_path / name), **params)
    return ManagerDriver([tier], CHUNK, PRIMARY, kv_events=kv_events)


def ours(events) -> list:
    """kvtier's events among the manager's (the CPU primary tier publishes its own: medium CPU, no ownership)."""
    return [e for e in events if e.ownership == EVENT_OWNERSHIP]


def hashes(keys) -> list:
    """The block hashes vLLM publishes for offload keys (bytes, or ints with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES)."""
    return [maybe_convert_block_hash(get_offload_block_hash(k)) for k in keys]


def store_in_steps(d, keys, data, n: int) -> None:
    """Store n chunks a request: the keys of one store are written in parallel, and a tier too small for all of them
    at once refuses some (nothing is evicted for a write still in flight), so evictions need several requests."""
    for i in range(0, len(keys), n):
        d.store(keys[i : i + n], data[i : i + n])


def held(tier, keys) -> list:
    return [k for k in keys if tier.backend.store.contains(tier.key_of(k))]


def test_stores_and_evictions_become_block_stored_and_block_removed(tmp_path):
    cap_chunks = 10
    keys, data = [chunk_key(i, b"ev") for i in range(30)], payloads(30, seed=1)
    with driver(tmp_path, disk_capacity_gb=cap_chunks * CHUNK / 1e9) as d:
        (tier,) = d.tiers
        raw = []
        for i in range(0, 30, 5):
            d.store(keys[i : i + 5], data[i : i + 5])
            raw += d.take_events()
        mine = ours(raw)
        assert mine and all(e.medium is Medium.STORAGE and e.removal_expected for e in mine)
        stored = [k for e in mine if not e.removed for k in e.keys]
        removed = [k for e in mine if e.removed for k in e.keys]
        # Each key stored once; what was evicted removed once, and exactly what kvtier no longer holds.
        assert sorted(stored) == sorted(keys)
        kept = held(tier, keys)
        assert len(kept) == len(entry_files(tmp_path / "kv")) == 9
        assert sorted(removed) == sorted(set(keys) - set(kept)) and len(removed) == 21
        # A key is removed only after it was stored.
        order = [(e.removed, k) for e in mine for k in e.keys]
        assert all(order.index((False, k)) < order.index((True, k)) for k in removed)
        assert d.take_events() == []  # drained
        if "req_context" in {f.name for f in dataclasses.fields(OffloadingEvent)}:  # vLLM 0.34: the storing request
            assert all(e.req_context.req_id.startswith("req-") for e in mine if not e.removed)

    # Through the connector's tracker, as published: a placeholder payload per chunk (no request data in this
    # driver), vLLM's block hash of the key, medium STORAGE, ownership kvtier.
    keys2, data2 = [chunk_key(i, b"ev2") for i in range(12)], payloads(12, seed=2)
    with driver(tmp_path, name="kv2", disk_capacity_gb=4 * CHUNK / 1e9) as d:
        store_in_steps(d, keys2, data2, 2)
        published = d.kv_cache_events()
        st = [e for e in published if isinstance(e, BlockStored) and e.ownership == EVENT_OWNERSHIP]
        rm = [e for e in published if isinstance(e, BlockRemoved) and e.ownership == EVENT_OWNERSHIP]
        assert all(e.medium == "STORAGE" and e.group_idx == 0 for e in st + rm)
        assert sorted(h for e in st for h in e.block_hashes) == sorted(hashes(keys2))
        gone = set(keys2) - set(held(d.tiers[0], keys2))
        assert len(gone) >= 8 and sorted(h for e in rm for h in e.block_hashes) == sorted(hashes(gone))


def test_a_corrupt_entry_is_removed_and_a_restart_announces_what_it_found(tmp_path):
    keys, data = [chunk_key(i, b"rs") for i in range(6)], payloads(6, seed=3)
    with driver(tmp_path) as d:
        d.store(keys, data)
        assert sorted(k for e in ours(d.take_events()) for k in e.keys) == sorted(keys)
    victim = tmp_path / "kv" / entry_files(tmp_path / "kv")[0]
    raw = bytearray(victim.read_bytes())
    raw[-100] ^= 0xFF
    victim.write_bytes(raw)
    with driver(tmp_path) as d:  # a new engine over the same directory: the rescan's entries are announced
        first = ours(d.take_events())
        assert [e.removed for e in first] == [False] and sorted(first[0].keys) == sorted(keys)
        d.load(keys)  # the flipped entry fails its checksum on the way up and is dropped
        later = ours(d.take_events())
        removed = [k for e in later if e.removed for k in e.keys]
        assert len(removed) == 1 and not victim.exists()
        assert held(d.tiers[0], keys) == [k for k in keys if k not in removed]
        assert not [e for e in later if not e.removed]  # a promotion stores nothing in kvtier


def test_no_events_unless_asked_for_and_a_bad_value_is_one_line(tmp_path, caplog):
    keys, data = [chunk_key(i, b"off") for i in range(3)], payloads(3, seed=4)
    with driver(tmp_path, name="a", enable_kv_events=False) as d:  # vLLM publishes, the tier was not asked
        d.store(keys, data)
        ev = d.take_events()
        assert ev and not ours(ev)  # the CPU tier's own events only
    with caplog.at_level("WARNING"), driver(tmp_path, name="b", kv_events=False) as d:  # asked, but vLLM publishes none
        d.store(keys, data)
        assert not ours(d.take_events())
        assert not d.tiers[0]._changes  # nothing kept for a consumer that never comes
    assert "KV cache events are disabled globally" in caplog.text
    for bad in ("yes", 1, None):
        with pytest.raises(ConfigError, match=r"^kvtier: invalid configuration: enable_kv_events: must be true or"):
            driver(tmp_path, name="c", enable_kv_events=bad)


def test_the_usage_gauge_per_tier_reaches_vllms_stats(tmp_path):
    keys, data = [chunk_key(i, b"g") for i in range(5)], payloads(5, seed=5)
    with driver(tmp_path, disk_capacity_gb=0.001) as d:
        d.store(keys, data)
        s = d.stats()["data"]
        used = s[KvtierMetrics.USED_BYTES][(*LABEL, "disk")]
        cap = s[KvtierMetrics.CAPACITY_BYTES][(*LABEL, "disk")]
        assert cap == 1_000_000 and used >= 5 * CHUNK
        assert s[KvtierMetrics.USAGE_PERC][(*LABEL, "disk")] == pytest.approx(used / cap)


def test_kvtiers_events_go_through_vllms_zmq_publisher_to_a_subscriber(tmp_path):
    """vLLM's `ZmqEventPublisher` in this process, connecting to a SUB socket bound on 127.0.0.1 (as a router binds
    and vLLM connects, `endpoint: tcp://host:port`); what arrives is decoded as vLLM's `KVEventBatch`."""
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    port = sub.bind_to_random_port("tcp://127.0.0.1")
    pub = ZmqEventPublisher(data_parallel_rank=0, endpoint=f"tcp://127.0.0.1:{port}")
    decode = msgspec.msgpack.Decoder(KVEventBatch)
    try:
        # A PUB drops what it sends before the connection is up: send empty batches until one arrives; after it
        # everything arrives, in order.
        deadline = time.monotonic() + 20
        while not sub.poll(50):
            assert time.monotonic() < deadline, "the publisher never reached the subscriber"
            pub.publish(KVEventBatch(ts=time.time(), events=[]))
        while sub.poll(200):
            sub.recv_multipart()
        keys, data = [chunk_key(i, b"zmq") for i in range(8)], payloads(8, seed=6)
        with driver(tmp_path, disk_capacity_gb=4 * CHUNK / 1e9) as d:
            store_in_steps(d, keys, data, 2)
            pub.publish(KVEventBatch(ts=time.time(), events=d.kv_cache_events()))
            gone = set(keys) - set(held(d.tiers[0], keys))
        assert sub.poll(10_000)
        _topic, seq, payload = sub.recv_multipart()
        batch = decode.decode(payload)
        st = [e for e in batch.events if isinstance(e, BlockStored) and e.ownership == EVENT_OWNERSHIP]
        rm = [e for e in batch.events if isinstance(e, BlockRemoved) and e.ownership == EVENT_OWNERSHIP]
        assert int.from_bytes(seq, "big") > 0 and batch.data_parallel_rank == 0
        assert sorted(h for e in st for h in e.block_hashes) == sorted(hashes(keys))
        assert gone and sorted(h for e in rm for h in e.block_hashes) == sorted(hashes(gone))
        assert all(e.medium == "STORAGE" for e in st + rm)
    finally:
        pub.shutdown()
        sub.close(linger=0)
