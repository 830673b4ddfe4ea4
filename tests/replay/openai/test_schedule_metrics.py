"""Arrival schedules and the /metrics arithmetic (counter deltas, resets, hit rates, bytes written)."""

from __future__ import annotations

import itertools

import pytest

from replay.openai.schedule import arrival_offsets_ns, trace_offsets_ns
from replay.openai.server_metrics import Snapshot, derive, parse_prometheus


def _rate(offsets):
    return (len(offsets) - 1) / ((offsets[-1] - offsets[0]) / 1e9)


def test_schedules_are_seeded_and_keep_the_mean_rate():
    a = arrival_offsets_ns(5000, 100.0, "poisson", seed=1)
    assert a == arrival_offsets_ns(5000, 100.0, "poisson", seed=1) != arrival_offsets_ns(5000, 100.0, "poisson", seed=2)
    assert a[0] == 0 and a == sorted(a)
    assert _rate(a) == pytest.approx(100, rel=0.05)
    bursty = arrival_offsets_ns(5000, 100.0, "gamma", burstiness=0.25, seed=1)
    assert _rate(bursty) == pytest.approx(100, rel=0.1)
    gaps = [b - a for a, b in itertools.pairwise(bursty)]
    mean = sum(gaps) / len(gaps)
    cv = (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5 / mean
    assert cv == pytest.approx(2.0, rel=0.15)  # gamma shape k: coefficient of variation 1/sqrt(k)
    const = arrival_offsets_ns(11, 10.0, "constant")
    assert const == [i * 100_000_000 for i in range(11)]
    assert arrival_offsets_ns(3, float("inf")) == [0, 0, 0]
    assert len(arrival_offsets_ns(1000, 10.0, "constant", duration_s=5)) == 50
    with pytest.raises(ValueError):
        arrival_offsets_ns(3, 1.0, "weibull")


def test_trace_offsets_speedup_and_duration():
    assert trace_offsets_ns([10.0, 12.0, 20.0], speedup=2) == [0, 1_000_000_000, 5_000_000_000]
    assert trace_offsets_ns([0.0, 1.0, 9.0], speedup=1, duration_s=5) == [0, 1_000_000_000, -1]
    with pytest.raises(ValueError):
        trace_offsets_ns([0.0], speedup=0)


VLLM_A = """# HELP x
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 100.0
vllm:prompt_tokens_by_source_total{engine="0",source="local_compute"} 900
vllm:prompt_tokens_by_source_total{engine="0",source="local_cache_hit"} 100
vllm:prompt_tokens_by_source_total{engine="0",source="external_kv_transfer"} 0
vllm:num_preemptions_total{engine="0"} 2
vllm:request_queue_time_seconds_sum{engine="0"} 1.0
vllm:request_queue_time_seconds_count{engine="0"} 10
vllm:cache_config_info{block_size="128",engine="0"} 1.0
kvtier_bytes_total{tier="disk",op="write"} 4096
kvtier_bytes_total{tier="disk",op="read"} 100
"""
VLLM_B = (
    VLLM_A.replace("} 1000.0", "} 3000.0")
    .replace('hits_total{engine="0",model_name="m"} 100.0', 'hits_total{engine="0",model_name="m"} 1100.0')
    .replace('"local_compute"} 900', '"local_compute"} 1500')
    .replace('"local_cache_hit"} 100', '"local_cache_hit"} 900')
    .replace('"external_kv_transfer"} 0', '"external_kv_transfer"} 600')
    .replace('num_preemptions_total{engine="0"} 2', 'num_preemptions_total{engine="0"} 5')
    .replace('sum{engine="0"} 1.0', 'sum{engine="0"} 3.0')
    .replace('count{engine="0"} 10', 'count{engine="0"} 20')
    .replace('op="write"} 4096', 'op="write"} 12288')
)


def test_derive_from_counter_deltas():
    a, b = Snapshot(0, parse_prometheus(VLLM_A)), Snapshot(2_000_000_000, parse_prometheus(VLLM_B))
    assert a.block_size() == 128  # a label of vllm:cache_config_info
    d = derive(a, b)
    assert d["prefix_cache_hit_rate"] == pytest.approx(0.5)  # 1000 hits / 2000 queries
    assert d["prompt_tokens_by_source"] == {"local_compute": 600, "local_cache_hit": 800, "external_kv_transfer": 600}
    assert d["hit_rate"] == pytest.approx(0.7)  # (800 + 600) / 2000, local and external together
    assert d["preemptions"] == 3
    assert d["server_queue_time_mean_ms"] == pytest.approx(200.0)
    assert d["kv_written_bytes"] == 8192 and d["kv_written_bytes_source"] == 'kvtier_bytes_total{op="write"}'
    assert d["kv_bytes_by_tier"] == {"disk": {"write": 8192, "read": 0}}
    assert d["interval_s"] == 2.0


def test_counter_reset_and_lmcache_tokens_to_bytes():
    a = Snapshot(
        0,
        parse_prometheus(
            "lmcache:num_stored_tokens_total 500\nvllm:prefix_cache_hits_total 50\n"
            "vllm:prefix_cache_queries_total 100\n"
        ),
    )
    b = Snapshot(
        1,
        parse_prometheus(
            "lmcache:num_stored_tokens_total 200\nvllm:prefix_cache_hits_total 10\nvllm:prefix_cache_queries_total 40\n"
        ),
    )
    d = derive(a, b, kv_bytes_per_token=1024)
    assert d["prefix_cache_hit_rate"] == pytest.approx(0.25)  # restarted server: counts from zero
    assert d["kv_written_bytes"] == 200 * 1024 and "lmcache" in d["kv_written_bytes_source"]
    assert derive(a, a)["prompt_tokens_by_source"] is None
