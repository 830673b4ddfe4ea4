"""Restart persistence of the backend's directories: valid entries come back in LRU order, the rest is removed."""

import os

import numpy as np

from kvconnector.backend import KvtierBackend
from kvconnector.backend_config import BackendConfig

N = 10_000


def data(i):
    return np.random.default_rng(i).integers(0, 256, N, dtype=np.uint8).tobytes()


def cfg(d, **kw):
    return BackendConfig(disk_dir=str(d), snapshot_path="", **{"disk_capacity_gb": 1e-3, **kw})


def test_restart_keeps_lru_order_and_capacity(tmp_path):
    b = KvtierBackend(cfg(tmp_path))
    for i in range(10):
        b.put(f"k{i}", [memoryview(data(i))])
    paths = {k: b.store.tiers[0].path_for(k) for k in (f"k{i}" for i in range(10))}
    b.close()
    for i, k in enumerate(paths):  # make the mtimes distinct, k0 oldest
        os.utime(paths[k], ns=(10**18 + i * 10**9, 10**18 + i * 10**9))
    # Restart with room for only ~4 entries: the newest survive, the oldest are removed from the directory.
    small = KvtierBackend(cfg(tmp_path, disk_capacity_gb=5e-5))
    try:
        keep = [k for k in paths if small.store.contains(k)]
        assert keep == ["k6", "k7", "k8", "k9"]
        assert not os.path.exists(paths["k0"]) and os.path.exists(paths["k9"])
        out = memoryview(bytearray(N))
        assert small.get_into("k9", out) and bytes(out) == data(9)
    finally:
        small.close()


def test_rescan_off_and_payload_verification(tmp_path):
    b = KvtierBackend(cfg(tmp_path))
    b.put("a", [memoryview(data(1))])
    b.put("b", [memoryview(data(2))])
    p = b.store.tiers[0].path_for("b")
    b.close()
    with open(p, "r+b") as fh:  # flip a payload byte: the header stays valid
        fh.seek(4096 + 7)
        fh.write(b"\x00" if data(2)[7] else b"\x01")
    off = KvtierBackend(cfg(tmp_path, rescan_on_start=False))
    assert len(off.store) == 0 and os.path.exists(p)
    off.close()
    lazy = KvtierBackend(cfg(tmp_path))  # header-only rescan adopts it; the load catches it
    assert len(lazy.store) == 2 and not lazy.get_into("b", memoryview(bytearray(N)))
    lazy.close()
    b = KvtierBackend(cfg(tmp_path))
    b.put("b", [memoryview(data(3))])
    b.close()
    with open(p, "r+b") as fh:
        fh.seek(4096 + 7)
        fh.write(b"\x00" if data(3)[7] else b"\x01")
    strict = KvtierBackend(cfg(tmp_path, rescan_verify_payload=True))
    try:
        assert len(strict.store) == 1 and strict.rescan_reports[0]["corrupt_removed"] == 1 and not os.path.exists(p)
    finally:
        strict.close()
