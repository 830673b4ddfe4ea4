"""The Redis tier on a real Redis Cluster of three masters on 127.0.0.1 (deploy/redis_cluster.py starts it once for
the module): entries spread over every master, a slot migrated under the tier (ASK, then MOVED), two instances
sharing entries, and a master killed while a thread keeps storing and loading. Run with `pytest -s` to see the fault
test's counts."""

import random
import shutil
import signal
import threading
import time
from collections import Counter

import numpy as np
import pytest
import redis
from helpers import free_port, wait_for
from redis.crc import key_slot

from deploy import redis_cluster
from kvconnector.backend import KvtierBackend
from kvconnector.backend_config import BackendConfig
from kvconnector.errors import ConfigError, EntryNotFound
from kvconnector.redis_tier import RedisTier

N = 8192
SOCKET_TIMEOUT_S = 1.0

needs_redis = pytest.mark.skipif(
    shutil.which("redis-server") is None or shutil.which("redis-cli") is None,
    reason="redis-server is not installed (apt-get install redis-server; deploy/install-system-deps.sh)",
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    nodes = redis_cluster.start(tmp_path_factory.mktemp("redis-cluster"), masters=3)
    try:
        yield nodes
    finally:
        nodes.stop()


def data(seed: int, n: int = N) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def node(port: int) -> redis.Redis:
    return redis.Redis("127.0.0.1", port)


def holder(nodes, rkey: str) -> int:
    """The port of the master that holds `rkey`, asked of every master (CLUSTER KEYSLOT, GETKEYSINSLOT)."""
    slot = node(nodes.ports[0]).execute_command("CLUSTER", "KEYSLOT", rkey)
    ports = [p for p in nodes.ports if rkey.encode() in node(p).execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1000)]
    assert len(ports) == 1, f"{rkey} held by {ports}"
    return ports[0]


def slot_owners(nodes) -> dict[int, int]:
    """slot -> port of its master, as the cluster says now."""
    owners = {}
    for start, end, master, *_ in node(nodes.ports[0]).execute_command("CLUSTER", "SLOTS"):
        owners.update(dict.fromkeys(range(start, end + 1), int(master[1])))
    return owners


@needs_redis
@pytest.mark.slow
def test_entries_spread_over_every_master(cluster):
    t = RedisTier(cluster.url, 1 << 30, namespace="spread")
    keys = [f"model/x@{i}" for i in range(24)]
    for i, k in enumerate(keys):
        t.write(k, [memoryview(data(i))], N, (2, N // 2), "uint8")
    held = {k: holder(cluster, t._rkey(k)) for k in keys}
    assert set(held.values()) == set(cluster.ports)  # no hash tag: keys land on all three masters
    out = memoryview(bytearray(N))
    for i, k in enumerate(keys):
        assert t.read(k, N, out).nbytes == N and bytes(out) == data(i)
        assert t.probe(k).shape == (2, N // 2)
    assert sorted(h.key for h in t.scan()) == sorted(keys)  # every master scanned
    t.delete(keys[0])
    assert t.probe(keys[0]) is None
    with pytest.raises(EntryNotFound):
        t.read(keys[0], N, out)
    assert t.describe()["cluster"] is True and t.describe()["url"] == cluster.url
    assert not t.fallbacks
    t.close()


@needs_redis
@pytest.mark.slow
def test_a_slot_migrated_to_another_master_is_followed(cluster):
    """Migrate the slot of a stored entry to another master under the tier: mid-migration the old master answers
    ASK, afterwards MOVED; redis-py follows both and the reads succeed."""
    t = RedisTier(cluster.url, 1 << 30, namespace="moved")
    t.write("moving", [memoryview(data(7))], N)
    rkey = t._rkey("moving")
    slot = key_slot(rkey.encode())
    src = holder(cluster, rkey)
    dst = next(p for p in cluster.ports if p != src)
    src_id, dst_id = (node(p).execute_command("CLUSTER", "MYID").decode() for p in (src, dst))
    node(dst).execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
    node(src).execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
    in_slot = node(src).execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1000)
    node(src).execute_command("MIGRATE", "127.0.0.1", dst, "", 0, 5000, "KEYS", *in_slot)
    out = memoryview(bytearray(N))
    assert t.read("moving", N, out) and bytes(out) == data(7)  # ASK: the key is on dst, the slot still src's
    for p in cluster.ports:
        node(p).execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
    assert holder(cluster, rkey) == dst
    out[:] = b"\0" * N
    assert t.read("moving", N, out) and bytes(out) == data(7)  # MOVED: the tier's slot map still said src
    assert t._r.nodes_manager.get_node_from_slot(slot).port == dst
    assert t.probe("moving").payload_nbytes == N and not t.fallbacks
    t.close()


@needs_redis
@pytest.mark.slow
def test_two_instances_share_entries_through_probe_and_scan(cluster):
    cfg = BackendConfig(
        disk_capacity_gb=0, redis_url=cluster.url, redis_namespace="two", redis_capacity_gb=1, snapshot_path=""
    )
    a, b = KvtierBackend(cfg), KvtierBackend(cfg)
    try:
        for i in range(12):
            assert (a if i % 2 else b).put(f"k{i}", [memoryview(data(i))])
        out = memoryview(bytearray(N))
        for i in range(12):  # each finds the other's entries by probe (lookup) and serves them
            reader = b if i % 2 else a
            assert reader.lookup(f"k{i}") and reader.get_into(f"k{i}", out) and bytes(out) == data(i)
    finally:
        a.close()
        b.close()
    c = KvtierBackend(cfg)  # a third instance adopts all twelve by scanning every master
    try:
        assert next(r for r in c.rescan_reports if r["tier"] == "redis")["adopted"] == 12
        held = {holder(cluster, c.store.tiers[0]._rkey(f"k{i}")) for i in range(12)}
        assert len(held) > 1
    finally:
        c.close()


def test_unreachable_or_malformed_cluster_is_one_config_error():
    url = f"redis-cluster://127.0.0.1:{free_port()},127.0.0.1:{free_port()}"
    for bad, match in [(url, "cannot reach Redis Cluster at"), ("redis-cluster://127.0.0.1", "is not host:port")]:
        with pytest.raises(ConfigError, match=match) as info:
            RedisTier(bad, 1 << 20)
        assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="cannot reach Redis Cluster"):
        KvtierBackend(BackendConfig(disk_capacity_gb=0, redis_url=url, snapshot_path=""))
    with pytest.raises(ConfigError, match="redis-cluster://"):
        BackendConfig.validated({"redis_url": "cluster://127.0.0.1:7000"})


@needs_redis
@pytest.mark.slow
@pytest.mark.serial  # timed: each failed operation within the socket timeout
def test_a_stopped_master_fails_an_operation_within_the_socket_timeout(cluster):
    """A master that hangs (SIGSTOP) rather than dies: a load or a store on it fails once the socket timeout passes,
    not later (a store's failed write is not followed by a delete waiting as long again); the other masters answer
    meanwhile; after SIGCONT its slots are served again."""
    url = f"{cluster.url}?socket_timeout={SOCKET_TIMEOUT_S}"
    b = KvtierBackend(BackendConfig(disk_capacity_gb=0, redis_url=url, redis_namespace="stopped", snapshot_path=""))
    t = b.store.tiers[0]
    owners = slot_owners(cluster)
    on = {
        p: [k for k in (f"s{i}" for i in range(60)) if owners[key_slot(t._rkey(k).encode())] == p]
        for p in cluster.ports
    }
    victim, other = cluster.ports[0], cluster.ports[2]
    for k in (on[victim][0], on[other][0]):
        assert b.put(k, [memoryview(data(int(k[1:])))])
    out = memoryview(bytearray(N))
    cluster.send(victim, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        assert not b.get_into(on[victim][0], out)
        t1 = time.monotonic()
        assert not b.put(on[victim][1], [memoryview(data(1))])
        t2 = time.monotonic()
        for took in (t1 - t0, t2 - t1):
            assert SOCKET_TIMEOUT_S * 0.9 < took < SOCKET_TIMEOUT_S + 0.5
        assert b.get_into(on[other][0], out) and bytes(out) == data(int(on[other][0][1:]))
    finally:
        cluster.send(victim, signal.SIGCONT)
    k = on[victim][0]
    assert wait_for(lambda: b.get_into(k, out), timeout_s=10, what="the resumed master to serve its slot")
    assert bytes(out) == data(int(k[1:]))
    events = b.events_snapshot()
    assert events["load_errors"] >= 1 and events["store_errors"] == 1 == t.fallbacks["write_errors"]
    assert t.fallbacks["read_errors"] == events["load_errors"] and not t.fallbacks["delete_errors"]
    b.close()


def slowest(ops: list[tuple]) -> str:
    return f"{max(o[4] for o in ops) * 1000:.0f} ms" if ops else "none"


@needs_redis
@pytest.mark.slow
@pytest.mark.serial  # timed: each failed operation within the socket timeout
def test_a_master_killed_under_load(cluster):
    """A thread stores and loads through a backend whose only tier is the cluster; one master is SIGKILLed, then
    restarted on its port and data directory (appendonly yes, fsync every second)."""
    url = f"{cluster.url}?socket_timeout={SOCKET_TIMEOUT_S}"
    b = KvtierBackend(
        BackendConfig(disk_capacity_gb=0, redis_url=url, redis_namespace="fault", redis_capacity_gb=1, snapshot_path="")
    )
    tier = b.store.tiers[0]
    owners = slot_owners(cluster)

    def owner(key: str) -> int:
        return owners[key_slot(tier._rkey(key).encode())]

    victim = cluster.ports[1]
    # (when, op, master port, outcome, seconds); outcome "ok", "error" (the op failed) or "vanished" (a load found
    # the entry gone: the restarted master lost it)
    ops: list[tuple[float, str, int, str, float]] = []
    stored: list[tuple[float, int]] = []  # (when, i) of entries stored
    vanished: list[str] = []
    corrupt = 0
    stop = threading.Event()

    def load_and_store() -> None:
        nonlocal corrupt
        rng = random.Random(0)
        out = memoryview(bytearray(N))
        i = 0
        while not stop.is_set():
            t0 = time.monotonic()
            ok = b.put(f"f{i}", [memoryview(data(i))])
            ops.append((t0, "store", owner(f"f{i}"), "ok" if ok else "error", time.monotonic() - t0))
            if ok:
                stored.append((t0, i))
            if stored:
                j = rng.choice(stored)[1]
                t0 = time.monotonic()
                ok = b.get_into(f"f{j}", out)
                # A failed load leaves the entry indexed (to be served once its master is back); a vanished one not.
                outcome = "ok" if ok else "error" if b.store.contains(f"f{j}") else "vanished"
                ops.append((t0, "load", owner(f"f{j}"), outcome, time.monotonic() - t0))
                if outcome == "vanished":
                    vanished.append(f"f{j}")
                corrupt += ok and bytes(out) != data(j)
            i += 1

    def on_victim(since: float, outcome: str | None = None, op: str | None = None) -> int:
        """Operations on the victim's slots begun after `since`, of that outcome and kind if given."""
        return sum(
            1 for t, o, p, r, _ in list(ops) if t > since and p == victim and outcome in (None, r) and op in (None, o)
        )

    # Each phase lasts until what it must show has happened (a loaded machine only makes it longer): entries stored
    # on the victim more than the AOF's 1 s fsync interval before the kill, failed stores and loads on the dead
    # master beside successes on the others, and operations on its slots after it recovered.
    worker = threading.Thread(target=load_and_store)
    worker.start()
    try:
        t_start = time.monotonic()
        wait_for(
            lambda: time.monotonic() - t_start > 1.5 and on_victim(t_start, "ok") >= 10,
            timeout_s=60,
            what="stores and loads on every master",
        )
        t_kill = time.monotonic()
        cluster.kill(victim)
        t_dead = time.monotonic()  # an operation begun between the two may have been served before the end
        wait_for(
            lambda: (
                on_victim(t_dead, "error", "store") >= 2
                and on_victim(t_dead, "error", "load") >= 2
                and sum(1 for t, _, p, _, _ in list(ops) if t > t_dead and p != victim) > 10
            ),
            timeout_s=60,
            what="failed operations on the dead master and served ones on the others",
        )
        t_restart = time.monotonic()
        cluster.start_node(victim)
        wait_for(
            lambda: any(t > t_restart and p == victim and r == "ok" for t, _, p, r, _ in ops),
            timeout_s=30,
            what="an operation on the restarted master's slots to succeed",
        )
        t_recovered = next(t + d for t, _, p, r, d in ops if t > t_restart and p == victim and r == "ok")
        wait_for(lambda: on_victim(t_recovered) >= 5, timeout_s=30, what="operations after the recovery")
    finally:
        stop.set()
        worker.join(30)

    before = [o for o in ops if o[0] + o[4] < t_kill]
    down = [o for o in ops if t_dead < o[0] < t_restart]
    after = [o for o in ops if o[0] > t_recovered]
    failed = [o for o in ops if o[3] != "ok"]
    kinds = Counter(f"{op} {r} on {'the killed master' if p == victim else 'the others'}" for _, op, p, r, _ in failed)
    events = b.events_snapshot()
    print(
        f"\nkilled master under load: {len(ops)} ops ({len(before)} before the kill, {len(down)} while down, "
        f"{len(after)} after recovery); failed: {dict(kinds)}; backend: store_errors={events.get('store_errors', 0)} "
        f"load_errors={events.get('load_errors', 0)} load_misses={events.get('load_misses', 0)}; tier fallbacks: "
        f"{dict(tier.fallbacks)}; corrupt served: {corrupt}; slowest failed op while down "
        f"{slowest([o for o in failed if o[0] < t_restart])}, after the restart "
        f"{slowest([o for o in failed if o[0] > t_restart])} "
        f"(socket timeout {SOCKET_TIMEOUT_S * 1000:.0f} ms); recovery {t_recovered - t_restart:.2f} s after the "
        "restart (appendonly yes, appendfsync everysec)"
    )
    assert corrupt == 0
    assert before and all(o[3] == "ok" for o in before)
    # The other masters kept serving: every operation on their slots succeeded, throughout.
    assert sum(1 for o in down if o[2] != victim) > 10
    assert all(o[3] == "ok" for o in ops if o[2] != victim)
    # The dead master's operations failed, each within the socket timeout, and were counted, not raised.
    on_victim_down = [o for o in down if o[2] == victim]
    assert on_victim_down and all(o[3] == "error" for o in on_victim_down)
    assert all(o[4] < SOCKET_TIMEOUT_S for o in failed)
    failed_stores = sum(1 for o in failed if o[1] == "store")
    failed_loads = sum(1 for o in failed if o[1] == "load" and o[3] == "error")
    assert events.get("store_errors", 0) == failed_stores == tier.fallbacks["write_errors"] > 0
    assert events.get("load_errors", 0) == failed_loads == tier.fallbacks["read_errors"] > 0
    # Recovered: its slots are served again; only an entry stored in the last second before the kill (the AOF's
    # fsync interval) may have been lost, and a lost one is a miss.
    assert any(o[2] == victim for o in after) and all(o[3] != "error" for o in after)
    assert set(vanished) <= {f"f{i}" for t, i in stored if t > t_kill - 1.0}
    out = memoryview(bytearray(N))
    old = [i for t, i in stored if t <= t_kill - 1.0 and owner(f"f{i}") == victim]
    assert old and all(b.get_into(f"f{i}", out) and bytes(out) == data(i) for i in old)
    b.close()
