"""`kvtier replay --target-hit-rate R --cache-tokens C` against a prefix-caching server (the fake server's LRU of
whole blocks, `cache_tokens` of them): the hit rate the server measures is the target within 0.03, and the summary
puts it beside the target and the plan; a server whose cache is smaller than the run was told misses instead."""

from __future__ import annotations

import json

import pytest

from replay.cli import main as kvtier
from replay.openai.fake_server import FakeServer, FakeServerConfig

pytestmark = pytest.mark.slow


def replay(tmp_path, server_cache: int, target: float, cache: int = 20_000, *extra: str, ttft_ms: float = 0) -> dict:
    with FakeServer(FakeServerConfig(block_size=16, cache_tokens=server_cache, ttft_ms=ttft_ms)) as srv:
        out = tmp_path / f"hr-{target}-{server_cache}.json"
        rc = kvtier([
            "replay", "--base-url", srv.base_url, "--model", "fake", "--endpoint", "completions", "--quiet",
            "--target-hit-rate", str(target), "--cache-tokens", str(cache), "--input-len", "512", "--users", "4",
            "--max-tokens", "1", "--metrics-url", srv.base_url + "/metrics", "--output", str(out), *extra,
        ])  # fmt: skip
    assert rc == 0
    return json.loads(out.read_text())


@pytest.mark.parametrize("target", [0.1, 0.3, 0.6, 0.85])
def test_the_server_measures_the_target(tmp_path, target):
    doc = replay(tmp_path, 20_000, target)
    t = doc["target_hit_rate"]
    assert doc["completed"] == t["requests"] == 10 * t["sessions"]
    assert t["measured_hit_rate"] == doc["server_metrics"]["hit_rate"]
    assert t["measured_hit_rate"] == pytest.approx(target, abs=0.03), t
    # the completion prompt's "User: " shifts the server's blocks by a token or two against the trace's: the server
    # measures the plan within a few thousandths
    assert t["measured_hit_rate"] == pytest.approx(t["planned_hit_rate_of_completed"], abs=0.01), t


def test_a_server_cache_smaller_than_told_measures_the_miss(tmp_path):
    doc = replay(tmp_path, 10_000, 0.6)
    assert doc["target_hit_rate"]["measured_hit_rate"] < 0.1


def test_a_window_that_ends_early_plans_for_the_requests_done(tmp_path):
    # a 2 s window at 100 ms a request, four at a time: about 80 of the 350 requests, more of them sessions' first
    # turns (which miss); the plan for the requests done says so, and the server measures it
    doc = replay(tmp_path, 20_000, 0.6, 20_000, "--duration", "2", ttft_ms=100)
    t = doc["target_hit_rate"]
    assert 40 < doc["completed"] < t["requests"]
    assert t["planned_hit_rate_of_completed"] < t["planned_hit_rate"] - 0.1
    assert t["measured_hit_rate"] == pytest.approx(t["planned_hit_rate_of_completed"], abs=0.02), t
