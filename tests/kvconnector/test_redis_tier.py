"""The Redis tier against a real redis-server on 127.0.0.1 (started and stopped by the fixture)."""

import os
import shutil
import signal
import socket
import subprocess

import numpy as np
import pytest
from helpers import free_port, wait_for
from tier_contract import contract_cases

from kvconnector.backend import KvtierBackend
from kvconnector.backend_config import BackendConfig
from kvconnector.errors import ConfigError, CorruptEntryError, EntryNotFound
from kvconnector.redis_tier import RedisTier

N = 20_000


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server; deploy/install-system-deps.sh)")
    port = free_port()
    d = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen(
        [exe, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no", "--dir", str(d)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )

    def accepting() -> bool:
        assert proc.poll() is None, f"redis-server exited with {proc.returncode}"
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return True
        except OSError:
            return False

    try:
        wait_for(accepting, timeout_s=10, what=f"redis-server to accept connections on port {port}")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def data(seed):
    return np.random.default_rng(seed).integers(0, 256, N, dtype=np.uint8).tobytes()


@pytest.mark.parametrize("check", contract_cases())
def test_the_tier_contract(redis_url, check):
    check(lambda prefix, cap=16 << 20: RedisTier(redis_url, cap, namespace=f"contract-{prefix}"))


def test_round_trip_miss_and_corruption(redis_url):
    t = RedisTier(redis_url, 10 << 20, namespace="t1")
    t.write("m/../x@1", [memoryview(data(1))], N, (2, 3), "bf16/1")
    out = memoryview(bytearray(N))
    timing = t.read("m/../x@1", N, out)
    assert bytes(out) == data(1) and timing.device_ns > 0 and timing.nbytes == N
    assert t.probe("m/../x@1").shape == (2, 3)
    with pytest.raises(EntryNotFound):
        t.read("other", N, out)
    # A flipped byte in Redis is caught by the checksum.
    rkey = t._rkey("m/../x@1")
    t._r.setrange(rkey, 4096 + 5, b"\x00" if data(1)[5] else b"\x01")
    with pytest.raises(CorruptEntryError):
        t.read("m/../x@1", N, out)
    assert all(k.startswith(b"t1:") and b"/" not in k for k in t._r.keys("t1:*"))


def test_waterfall_disk_to_redis_and_restart(redis_url, tmp_path):
    cfg = BackendConfig(
        disk_dir=str(tmp_path / "d"),
        disk_capacity_gb=1e-4,
        redis_url=redis_url,
        redis_namespace="t2",
        redis_capacity_gb=1e-3,
        snapshot_path="",
    )
    b = KvtierBackend(cfg)
    for i in range(20):
        assert b.put(f"k{i}", [memoryview(data(i))])
    kinds = {b.store.contains(f"k{i}") for i in range(20)}
    assert kinds == {"disk", "redis"}
    out = memoryview(bytearray(N))
    assert b.get_into("k0", out) and bytes(out) == data(0)  # k0 was demoted to Redis
    in_redis = {f"k{i}" for i in range(20) if b.store.contains(f"k{i}") == "redis"}
    b.close()
    other = KvtierBackend(cfg.model_copy(update={"disk_dir": str(tmp_path / "d2")}))
    try:  # a second instance (empty local disk) adopts exactly what the first left in Redis, and serves it
        report = next(r for r in other.rescan_reports if r["tier"] == "redis")
        assert report["adopted"] == len(in_redis) > 0
        assert {f"k{i}" for i in range(20) if other.store.contains(f"k{i}") == "redis"} == in_redis
        k = min(in_redis)
        assert other.get_into(k, out) and bytes(out) == data(int(k[1:]))
    finally:
        other.close()


def test_unreachable_redis_is_a_config_error():
    with pytest.raises(ConfigError, match="cannot reach Redis"):
        RedisTier(f"redis://127.0.0.1:{free_port()}/0", 1 << 20)
