"""Replay's per-round figures from real runs in rounds against the fake server's bounded LRU,
with a real kvtier backend's exporter as a second /metrics URL: the hit rate against the ideal, excess recompute,
TPOT, requests/s, the TTFT and decode shares of a round, errors, KV bytes per tier per round, and the summary's media
identity (per-tier bytes and operations, stores and loads) that the rounds add up to."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kvconnector.backend import KvtierBackend
from kvconnector.backend_config import BackendConfig
from replay.openai.cli import main
from replay.openai.fake_server import FakeServer, FakeServerConfig
from replay.outputs.plots import write_replay_plots

BLOCK = 16
ROUNDS = 10
SESSIONS = 8
ENTRY = 40_000
pytestmark = pytest.mark.slow  # two replays of 10 rounds: 5-15 s on a loaded 2-core machine
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _replay(tmp_path: Path, cache_tokens: int, metrics: list[str], srv: FakeServer, name: str) -> dict:
    out = tmp_path / f"{name}.json"
    argv = ["--base-url", srv.base_url, "--model", "fake", "--output", str(out), "--quiet", "--source", "synthetic"]
    argv += ["--rounds", str(ROUNDS), "--concurrency", str(SESSIONS), "--output-len", "32", "--input-len", "32"]
    argv += ["--block-size", str(BLOCK)]
    for url in metrics:
        argv += ["--metrics-url", url]
    assert main(argv) == 0
    return json.loads(out.read_text())


class _StoreOnArrival:
    """The fake server's per-request hook (its fault_plan, answering "no fault"): one entry put into the kvtier
    backend as each request arrives, before it is answered, so each put falls inside its request's round."""

    def __init__(self, backend: KvtierBackend) -> None:
        self.backend, self.puts = backend, 0
        self.payload = memoryview(np.random.default_rng(0).integers(0, 256, ENTRY, dtype=np.uint8).tobytes())

    def __call__(self, n_req: int) -> None:
        assert self.backend.put(f"k{n_req}", [self.payload])
        self.puts += 1
        return None


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rounds")
    backend = KvtierBackend(BackendConfig(disk_dir=str(tmp / "disk"), disk_capacity_gb=0.05, metrics_port=0))
    cfg = dict(block_size=BLOCK, ttft_ms=30.0, itl_ms=1.0)
    writer = _StoreOnArrival(backend)
    try:
        # about two rounds' working set: the chain heads go first and reuse collapses
        with FakeServer(FakeServerConfig(cache_tokens=1200, fault_plan=writer, **cfg)) as srv:
            small = _replay(tmp, 1200, [srv.base_url + "/metrics", backend.exporter.url], srv, "small")
        with FakeServer(FakeServerConfig(cache_tokens=1 << 20, **cfg)) as srv:
            large = _replay(tmp, 1 << 20, [srv.base_url + "/metrics"], srv, "large")
    finally:
        backend.close()
    return tmp, small, large, writer.puts


def test_hit_rate_against_ideal_and_excess_recompute(runs):
    _, small, large, _ = runs
    for s in (small, large):
        first, *later = s["rounds"]
        assert first["ideal_hit_rate"] == 0 and first["hit_to_ideal"] is None  # nothing to reuse in round 1
        for r in later:
            assert r["hit_to_ideal"] == pytest.approx(r["hit_rate"] / r["ideal_hit_rate"], abs=1e-3)
        for r in s["rounds"]:
            assert r["errors"] == 0 and r["errors_by_kind"] is None and r["completed"] == SESSIONS
    late = small["rounds"][5:]
    # collapsed: under a quarter of the ideal, and most of the reusable prefix computed again
    assert all(r["hit_to_ideal"] < 0.25 for r in late), [r["hit_to_ideal"] for r in small["rounds"]]
    assert all(r["excess_recompute_share"] > 0.75 for r in late), [r["excess_recompute_share"] for r in late]
    assert all(r["excess_recompute_per_request"] > 0.75 * r["reusable_tokens_per_request"] for r in late)
    # a cache that holds everything recomputes only what no cache could have held; the fake server keeps the answers'
    # blocks (as vLLM does), so it beats the ideal of a prefill-only cache (LMCache's) whenever an answer ends a block
    assert any(r["hit_rate"] > r["ideal_hit_rate_prompt_only"] + 0.02 for r in large["rounds"][1:])
    for r in large["rounds"][1:]:
        assert r["ideal_hit_rate_prompt_only"] <= r["ideal_hit_rate"]
        assert r["hit_to_ideal"] > 0.93, r
        assert r["excess_recompute_share"] < 0.05 and r["excess_recompute_per_request"] < 0.05 * 32 * r["round"], r


def test_latency_throughput_and_shares_per_round(runs):
    _, small, _, _ = runs
    for r in small["rounds"]:
        # 1 ms between tokens against a 30 ms first token (a late server sends overdue tokens back to back: >= 0)
        assert 0 <= r["tpot_p50_ms"] < r["ttft_p50_ms"]
        assert r["requests_per_s"] == pytest.approx(r["completed"] / r["wall_s"], rel=0.01)
        # every request starts with the round: its TTFT (>= 30 ms) and its decode are parts of the round's wall clock
        assert 0.0 < r["ttft_share"] and 0.0 <= r["decode_share"]
        assert r["ttft_share"] + r["decode_share"] <= 1.0001
        assert r["ttft_share"] >= 0.03 / r["wall_s"] * 0.95


def test_kv_bytes_per_tier_per_round_and_media_identity(runs):
    tmp, small, large, puts = runs
    assert puts == ROUNDS * SESSIONS
    per_round = [r["kv_bytes_by_tier"]["disk"]["write"] for r in small["rounds"]]
    assert sum(per_round) == pytest.approx(puts * ENTRY, rel=0.05)  # entry files carry a small header
    assert all(b > 0 for b in per_round), per_round  # each round's puts land in that round
    mi = small["media_identity"]
    assert mi["tiers"]["disk"]["bytes_write"] == sum(per_round) and mi["tiers"]["disk"]["ops_write"] == puts
    assert mi["stores"] == puts and mi["bytes_written"] == sum(per_round)
    assert mi["rounds_add_up"] is True
    # the run without kvtier's exporter has no tiers, said as such, not zeros
    assert large["media_identity"]["tiers"] is None and large["rounds"][1]["kv_bytes_by_tier"] is None
    written = write_replay_plots(small, [], tmp / "plots")
    png = tmp / "plots" / "round_bytes.png"
    assert str(png) in written and png.read_bytes().startswith(PNG_MAGIC)


def test_think_time_is_a_pause_between_rounds(tmp_path):
    out = tmp_path / "pause.json"
    with FakeServer(FakeServerConfig(block_size=BLOCK)) as srv:
        argv = ["--base-url", srv.base_url, "--model", "fake", "--output", str(out), "--quiet", "--source", "synthetic"]
        argv += [
            "--rounds",
            "3",
            "--concurrency",
            "2",
            "--output-len",
            "4",
            "--input-len",
            "8",
            "--think-time-ms",
            "400",
        ]
        assert main(argv) == 0
    s = json.loads(out.read_text())
    walls = sum(r["wall_s"] for r in s["rounds"])
    assert s["duration_s"] - walls >= 2 * 0.4 * 0.95  # two pauses, outside every round's wall clock
    assert all(r["wall_s"] < 0.4 for r in s["rounds"]), [r["wall_s"] for r in s["rounds"]]
