"""The stack's Prometheus configuration and recording rules, checked by Prometheus's own promtool (no server started:
tests/e2e/test_prometheus_stack.py runs them against a live stack)."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from deploy.prometheus_config import RULES, config, main, scrape_targets
from kvconnector.backend import KvtierBackend
from kvconnector.backend_config import BackendConfig
from kvconnector.metrics import BackendCollector

needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool not installed (apt-get install prometheus)"
)


def _endpoints(n: int = 1, mode: str = "mp", l2: str = "kvtier", host: str = "127.0.0.1") -> dict:
    insts = []
    for i in range(n):
        h = f"10.253.7.{10 + i}" if host == "nodes" else host
        insts.append(
            {
                "vllm": f"http://{h}:8000" if host == "nodes" else f"http://{h}:{8001 + i}",
                "lmcache_metrics": f"http://{h}:{8090 + i}/metrics",
                "kvtier_metrics": f"http://{h}:{8100 + i}/metrics",
            }
        )
    return {"mode": mode, "l2": l2, "instances": insts}


def _promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=60)


@needs_promtool
def test_promtool_accepts_the_recording_rules():
    p = _promtool("check", "rules", str(RULES))
    assert p.returncode == 0, p.stdout + p.stderr
    assert re.search(r"SUCCESS: 9 rules found", p.stdout), p.stdout


@needs_promtool
@pytest.mark.parametrize(
    "endpoints",
    [
        _endpoints(),
        _endpoints(3),
        _endpoints(2, host="nodes"),
        _endpoints(l2="lmcache-fs"),
        _endpoints(mode="inprocess"),
    ],
    ids=["one", "instances", "nodes", "lmcache-fs", "inprocess"],
)
def test_promtool_accepts_the_generated_config(tmp_path, endpoints):
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config(endpoints, 0.5)))
    p = _promtool("check", "config", str(path))
    assert p.returncode == 0, p.stdout + p.stderr


def test_one_target_per_instance_of_what_runs_labelled_with_its_index():
    jobs = scrape_targets(_endpoints(2, host="nodes"))
    assert jobs["vllm"] == [(0, "http://10.253.7.10:8000/metrics"), (1, "http://10.253.7.11:8000/metrics")]
    assert [i for i, _ in jobs["kvtier"]] == [0, 1]
    cfg = config(_endpoints(2, host="nodes"), 1)
    kv = next(j for j in cfg["scrape_configs"] if j["job_name"] == "kvtier")
    assert kv["static_configs"][1] == {"targets": ["10.253.7.11:8101"], "labels": {"stack_instance": "1"}}
    assert cfg["global"]["scrape_interval"] == "1000ms" and cfg["rule_files"] == [str(RULES)]
    # LMCache's own fs adapter: no kvtier exporter; in-process LMCache: no LMCache server to scrape
    assert set(scrape_targets(_endpoints(l2="lmcache-fs"))) == {"vllm", "lmcache"}
    assert set(scrape_targets(_endpoints(mode="inprocess"))) == {"vllm", "kvtier"}


def test_bad_interval_is_one_line_and_exit_2(tmp_path, capsys):
    ep = tmp_path / "endpoints.json"
    ep.write_text("{}")
    with pytest.raises(SystemExit) as exc:
        main([str(ep), "--interval", "0"])
    assert exc.value.code == 2
    assert "--interval must be > 0" in capsys.readouterr().err


def _served(backend) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BackendCollector(backend))
    return generate_latest(registry).decode()


def test_every_kvtier_series_the_rules_read_is_one_the_exporter_serves(tmp_path):
    """A rule over a misspelt name records nothing, silently: the names are checked against a real backend's
    exporter after a store and a load (vLLM's and LMCache's names are checked on a live stack, in the e2e test)."""
    b = KvtierBackend(BackendConfig(disk_dir=str(tmp_path / "disk"), disk_capacity_gb=0.01, snapshot_path=""))
    try:
        before = _served(b)
        data = np.arange(4096, dtype=np.uint8)
        assert b.put("k", [memoryview(data)])
        assert b.get_into("k", memoryview(bytearray(4096)))
        served = _served(b)
    finally:
        b.close()
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    read = {m for r in rules for m in re.findall(r"\b(kvtier_[a-z_]+)\b", r["expr"])}
    assert read == {
        "kvtier_tier_events_total",
        "kvtier_backend_events_total",
        "kvtier_bytes_total",
        "kvtier_ops_total",
        "kvtier_op_duration_seconds_bucket",
    }
    for name in read:
        assert re.search(rf"^{name}{{", served, re.M), f"{name} is not served by kvconnector/metrics.py"
    # the label values the rules select on
    assert 'kvtier_tier_events_total{event="hits",tier="disk"} 1.0' in served
    assert 'kvtier_backend_events_total{event="load_hits"} 1.0' in served
    # and they are there, at 0, before the first event: rate() takes a series' first sample as its start, so a
    # counter born at its first event would lose that event
    assert 'kvtier_tier_events_total{event="hits",tier="disk"} 0.0' in before
    for ev in ("lookup_hits", "lookup_misses", "load_hits", "load_misses", "store_ok"):
        assert f'kvtier_backend_events_total{{event="{ev}"}} 0.0' in before


@needs_promtool
def test_the_rules_compute_what_they_say_on_known_series(tmp_path):
    """promtool's rule unit tests (prometheus.io/docs/prometheus/latest/configuration/unit_testing_rules/): series
    growing at known rates, every rule's value at 2m."""
    s = 'stack_instance="0"'

    def grow(series: str, per_15s: int) -> dict:
        return {"series": series, "values": f"0+{per_15s}x12"}

    inputs = [
        grow(f'vllm:prompt_tokens_by_source_total{{{s},source="local_compute"}}', 30),
        grow(f'vllm:prompt_tokens_by_source_total{{{s},source="local_cache_hit"}}', 0),
        grow(f'vllm:prompt_tokens_by_source_total{{{s},source="external_kv_transfer"}}', 90),
        grow(f"lmcache_mp_lookup_requested_tokens_total{{{s}}}", 100),
        grow(f"lmcache_mp_lookup_hit_l1_tokens_total{{{s}}}", 20),
        grow(f"lmcache_mp_lookup_hit_l2_tokens_total{{{s}}}", 50),
        grow(f'kvtier_tier_events_total{{{s},event="hits",tier="disk"}}', 3),
        grow(f'kvtier_tier_events_total{{{s},event="hits",tier="shared"}}', 1),
        grow(f'kvtier_backend_events_total{{{s},event="load_hits"}}', 4),
        grow(f'kvtier_backend_events_total{{{s},event="load_misses"}}', 4),
        grow(f'kvtier_bytes_total{{{s},tier="disk",op="read"}}', 1500),
        grow(f'kvtier_ops_total{{{s},tier="disk",op="read"}}', 15),
    ]
    # 20 reads per 15 s: 10 under 1 ms, 10 between 1 and 10 ms
    hist = f'kvtier_op_duration_seconds_bucket{{{s},tier="disk",op="read",part="total"'
    inputs += [grow(hist + ',le="0.001"}', 10), grow(hist + ',le="0.01"}', 20), grow(hist + ',le="+Inf"}', 20)]

    def exp(record: str, value: float, **labels: str) -> dict:
        """The rule's value within 1e-9 of `value` (promtool 2.42 compares samples exactly)."""
        sel = ",".join([s, *(f'{k}="{v}"' for k, v in labels.items())])
        expr = f"abs({record}{{{sel}}} - {value!r}) < bool 1e-9"
        return {"expr": expr, "eval_time": "2m", "exp_samples": [{"labels": f"{{{sel}}}", "value": 1}]}

    src, lm, kv = (
        "stack_instance_source:vllm_prompt_tokens:ratio_rate1m",
        "stack_instance_tier:lmcache_lookup_hit_tokens:ratio_rate1m",
        "stack_instance_tier:kvtier_load_hits:ratio_rate1m",
    )
    q = "stack_instance_tier_op_part:kvtier_op_duration_seconds:quantile_rate1m"
    lat = {"tier": "disk", "op": "read", "part": "total"}
    tests = [
        exp(src, 0.25, source="local_compute"),
        exp(src, 0.0, source="local_cache_hit"),
        exp(src, 0.75, source="external_kv_transfer"),
        exp(lm, 0.2, tier="l1"),
        exp(lm, 0.5, tier="l2"),
        exp(kv, 0.375, tier="disk"),
        exp(kv, 0.125, tier="shared"),
        exp("stack_instance_tier_op:kvtier_bytes:rate1m", 100.0, tier="disk", op="read"),
        exp("stack_instance_tier_op:kvtier_ops:rate1m", 1.0, tier="disk", op="read"),
        exp(q, 0.001, **lat, quantile="0.5"),  # rank 10 of 20: the top of the first bucket
        exp(q, 0.0082, **lat, quantile="0.9"),  # rank 18: 8/10 of the way through 1..10 ms
    ]
    spec = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "15s",
        "tests": [{"interval": "15s", "input_series": inputs, "promql_expr_test": tests}],
    }
    path = tmp_path / "rules_test.yml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    p = _promtool("test", "rules", str(path))
    assert p.returncode == 0, p.stdout + p.stderr
