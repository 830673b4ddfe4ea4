"""The backend's Prometheus exporter, JSON snapshot and full-filesystem handling (no LMCache needed, but they sit
with the adapter tests they serve)."""

import json
import os
import subprocess
import urllib.request

import numpy as np
import pytest

from kvconnector.backend import KvtierBackend
from kvconnector.backend_config import BackendConfig
from kvconnector.errors import ConfigError

N = 50_000


def data(i):
    return memoryview(np.random.default_rng(i).integers(0, 256, N, dtype=np.uint8).tobytes())


def test_metrics_exporter_serves_tier_histograms_and_events_on_loopback(tmp_path):
    b = KvtierBackend(BackendConfig(disk_dir=str(tmp_path), disk_capacity_gb=1e-3, metrics_port=0))
    try:
        assert b.exporter.host == "127.0.0.1"
        b.put("k", [data(1)])
        out = memoryview(bytearray(N))
        assert b.get_into("k", out) and not b.get_into("nope", out)
        text = urllib.request.urlopen(b.exporter.url, timeout=5).read().decode()
        assert 'kvtier_tier_events_total{event="hits",tier="disk"} 1.0' in text
        assert 'kvtier_ops_total{op="write",tier="disk"} 1.0' in text
        assert 'kvtier_bytes_total{op="read",tier="disk"} 50000.0' in text
        assert 'kvtier_op_duration_seconds_count{op="read",part="device",tier="disk"} 1.0' in text
        assert 'kvtier_backend_events_total{event="load_misses"} 1.0' in text
        assert 'kvtier_tier_capacity_bytes{tier="disk"} 1e+06' in text
    finally:
        b.close()
    snap = json.loads((tmp_path / "kvtier-stats.json").read_text())
    assert snap["tiers"][0]["stats"]["read"]["ops"] == 1 and snap["backend_events"]["load_hits"] == 1
    assert os.stat(tmp_path / "kvtier-stats.json").st_mode & 0o777 == 0o600
    assert not [n for n in os.listdir(tmp_path) if "tmp" in n]  # written through a temp file that is gone


def test_spare_writes_are_exported(tmp_path):
    # 2 MB: spares up to 100 KB, one 56 KB entry file; 40 x 50 KB entries overflow 0.8 x 2 MB and evict.
    b = KvtierBackend(BackendConfig(disk_dir=str(tmp_path), disk_capacity_gb=2e-3, metrics_port=0))
    try:
        for i in range(40):
            assert b.put(f"k{i}", [data(i)])
        reused = b.store.tiers[0].counters["spare_writes"]
        assert reused > 0
        text = urllib.request.urlopen(b.exporter.url, timeout=5).read().decode()
        assert f'kvtier_tier_events_total{{event="spare_writes",tier="disk"}} {float(reused)}' in text
    finally:
        b.close()


@pytest.mark.parametrize(
    "d, msg",
    [
        ({"disk_dir": "/x", "io_workers": 0}, "kvtier.io_workers"),
        ({"disk_dir": "/x", "redis_url": "http://h"}, "kvtier.redis_url"),
        ({"disk_dir": "/x", "shared_dir": "/x/"}, "different directories"),
        ({"disk_dir": "/x", "disk_capacity_gb": 0}, "no tier configured"),
    ],
)
def test_config_errors_are_one_clear_line(d, msg):
    with pytest.raises(ConfigError) as ei:
        BackendConfig.from_params(d)
    assert msg in str(ei.value) and "\n" not in str(ei.value)


def test_prefixed_and_bare_keys(tmp_path):
    assert BackendConfig.from_params({"kvtier.disk_dir": "/a", "io_mode": "buffered"}).io_mode == "buffered"
    with pytest.raises(ConfigError, match="given twice"):
        BackendConfig.from_params({"kvtier.disk_dir": "/a", "disk_dir": "/b"})
    extra = {"kvtier.disk_dir": "/a", "storage_plugin.kvtier.module_path": "m", "use_odirect": True}
    assert BackendConfig.from_extra_config(extra).disk_dir == "/a"


@pytest.mark.root(reason="mounting a tmpfs")
def test_full_filesystem_refuses_stores_and_counts_them(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], check=True)
    try:
        # The tier believes it has 10 MB; the filesystem has 256 KiB: the store must refuse, not crash.
        b = KvtierBackend(BackendConfig(disk_dir=str(mnt), disk_capacity_gb=0.01, io_mode="buffered", snapshot_path=""))
        results = [b.put(f"k{i}", [data(i)]) for i in range(10)]
        assert results[0] and not all(results)
        ev = b.events_snapshot()
        assert ev["store_refused_full"] >= 1 and b.store.stats[0].events["enospc"] == ev["store_refused_full"]
        assert not [p for p in os.listdir(mnt) if ".tmp" in p]  # no temp file left behind
        out = memoryview(bytearray(N))
        assert b.get_into("k0", out) and bytes(out) == bytes(data(0))
        b.close()
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
