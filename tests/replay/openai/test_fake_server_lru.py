"""The fake server's bounded LRU prefix cache: `kvtier replay --rounds` against a capacity
smaller than the sessions' working set sees the hit-rate cliff, against a large one the ideal; no vLLM needed."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest

from replay.openai.cli import main
from replay.openai.fake_server import FakeServer, FakeServerConfig

BLOCK = 16
# 8 sessions of 10 rounds, 32 input + 32 answer tokens a round: about 8 x 66 tokens more per round, 5,000 at the end.
ROUNDS = ("--source", "synthetic", "--rounds", "10", "--concurrency", "8", "--output-len", "32", "--input-len", "32")


def replay_rounds(tmp_path: Path, cache_tokens: int, process: bool = False) -> list[dict]:
    out = tmp_path / f"r{cache_tokens}.json"
    with FakeServer(FakeServerConfig(block_size=BLOCK, cache_tokens=cache_tokens), process=process) as srv:
        rc = main(
            ["--base-url", srv.base_url, "--model", "fake", "--output", str(out), "--quiet", *ROUNDS]
            + ["--block-size", str(BLOCK), "--metrics-url", srv.base_url + "/metrics"]
        )
    assert rc == 0
    rounds = json.loads(out.read_text())["rounds"]
    assert [r["round"] for r in rounds] == list(range(1, 11)) and all(r["completed"] == 8 for r in rounds)
    return rounds


def test_small_cache_collapses_and_large_cache_tracks_the_ideal(tmp_path):
    small = replay_rounds(tmp_path, cache_tokens=1200)  # about two rounds' working set
    large = replay_rounds(tmp_path, cache_tokens=1 << 20)
    late = small[5:]
    assert all(r["hit_rate"] < 0.25 * r["ideal_hit_rate"] for r in late), [r["hit_rate"] for r in small]
    assert small[1]["hit_rate"] == pytest.approx(small[1]["ideal_hit_rate"], abs=0.03)  # before the crossing
    for r in large[1:]:
        assert r["hit_rate"] == pytest.approx(r["ideal_hit_rate"], abs=0.05), r
        assert r["ideal_hit_rate"] > 0.6


@pytest.mark.slow
def test_capacity_reaches_a_server_process(tmp_path):
    # --cache-tokens on the fake server's command line (process mode, as the overhead benchmark runs it)
    late = replay_rounds(tmp_path, cache_tokens=1200, process=True)[5:]
    assert all(r["hit_rate"] < 0.25 * r["ideal_hit_rate"] for r in late)


async def _cached(url: str, prompts: list[str]) -> list[int]:
    """cached_tokens of each completion, sent one after another."""
    out = []
    async with aiohttp.ClientSession() as s:
        for p in prompts:
            body = {
                "model": "m",
                "prompt": p,
                "max_tokens": 1,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            async with s.post(url + "/v1/completions", json=body) as resp:
                usage = None
                async for line in resp.content:
                    if line.startswith(b"data: {") and b'"usage"' in line:
                        usage = json.loads(line[6:])["usage"]
            out.append(usage["prompt_tokens_details"]["cached_tokens"])
    return out


def test_lru_keeps_the_recently_used_chain(tmp_path):
    a = " ".join(f"a{i}" for i in range(40))  # 2 full blocks of 16 and 8 tokens
    b = " ".join(f"b{i}" for i in range(40))
    with FakeServer(FakeServerConfig(block_size=BLOCK, cache_tokens=3 * BLOCK)) as srv:
        # a, then b: b's blocks and the answer's push a's head out (3 blocks of room); a misses from its head
        assert asyncio.run(_cached(srv.base_url, [a, b, a, a])) == [0, 0, 0, 32]
    with FakeServer(FakeServerConfig(block_size=BLOCK)) as srv:  # unbounded: a's chain is still there
        assert asyncio.run(_cached(srv.base_url, [a, b, a])) == [0, 0, 32]
