"""--target-hit-rate's sessions (replay/sources/target_hit_rate.py): the hit rate `kvtier plan --trace`'s LRU model
gives them at --cache-tokens is the target within one block of a prompt, the cache size matters (a cache much
smaller loses the hits, a larger one gains none), and a target out of reach is refused with what would reach it."""

from __future__ import annotations

import re

import pytest

from replay.plan.trace import reuse_profile
from replay.sources.base import WorkloadError
from replay.sources.target_hit_rate import FILL, shape_for, target_trace

CASES = [  # target, cache tokens, prompt tokens, block tokens, requests (None: ten turns a session)
    (0.6, 20_000, 512, 16, None),
    (0.3, 20_000, 500, 16, 300),
    (0.05, 50_000, 1000, 16, None),
    (0.85, 2e5, 2048, 16, None),
    (0.5, 1e5, 4096, 256, None),
    (0.0, 5_000, 256, 16, 100),
    (0.7, 3_000, 100, 1, None),
]


@pytest.mark.parametrize("target,cache,prompt,block,requests", CASES)
def test_the_plan_gives_the_target_at_the_cache_and_not_at_a_smaller_one(target, cache, prompt, block, requests):
    shape = shape_for(target, cache, block_tokens=block, prompt_tokens=prompt, requests=requests)
    profile = reuse_profile(target_trace(shape, 8))
    at_cache = profile.hit_rate(cache)
    assert at_cache == pytest.approx(shape.hit_rate, abs=1e-12)  # the shape's own arithmetic is the plan's
    assert abs(at_cache - target) <= block / prompt  # within one block of a prompt
    assert profile.hit_rate(cache * 4) == pytest.approx(at_cache)  # more room holds nothing more of it
    if target > 0:
        # the turns fill FILL of the cache: a cache a third smaller keeps no session's context until its next turn
        assert profile.hit_rate(cache * FILL * 2 / 3) < target / 4


def test_every_request_has_the_prompt_length_and_the_sessions_take_turns():
    shape = shape_for(0.5, 20_000, block_tokens=16, prompt_tokens=520, requests=200)
    trace = target_trace(shape, 7)
    assert {(r.input_tokens, r.output_tokens, r.arrival_s) for r in trace.requests} == {(520, 7, 0.0)}
    first = [r.hash_ids[0] for r in trace.requests]
    assert first[: shape.sessions] == sorted(set(first))  # a new context each session, then the same again
    assert first[shape.sessions :] == first[: len(first) - shape.sessions]
    tails = [h for r in trace.requests for h in r.hash_ids[shape.shared_blocks :]]
    assert len(tails) == len(set(tails))  # a question's blocks are its own


@pytest.mark.parametrize(
    "target,cache,prompt,requests",
    [(0.95, 20_000, 512, None), (0.9, 2e6, 2048, 2000), (0.98, 40_000, 1024, 500)],
)
def test_a_target_out_of_reach_names_the_requests_that_reach_it(target, cache, prompt, requests):
    with pytest.raises(WorkloadError) as e:
        shape_for(target, cache, block_tokens=16, prompt_tokens=prompt, requests=requests)
    msg = str(e.value)
    assert "\n" not in msg and f"--target-hit-rate {target:g}" in msg
    need = int(re.search(r"give at least ([\d,]+) requests", msg).group(1).replace(",", ""))
    shape = shape_for(target, cache, block_tokens=16, prompt_tokens=prompt, requests=need)  # the remedy works
    assert abs(shape.hit_rate - target) <= 16 / prompt


@pytest.mark.parametrize(
    "cache,prompt,says",
    [(100, 512, "holds 6 blocks"), (20_000, 16, "has 1"), (float("inf"), 512, "holds 0 blocks")],
)
def test_a_cache_that_holds_no_prompt_or_a_prompt_of_one_block_is_refused(cache, prompt, says):
    with pytest.raises(WorkloadError, match=says):
        shape_for(0.5, cache, block_tokens=16, prompt_tokens=prompt)


def test_a_target_no_run_reaches_asks_for_a_lower_one():
    # 512 tokens in 16-token blocks share at most 31 of 32 blocks: 1.0 would need every turn to hit, the first too
    with pytest.raises(WorkloadError, match="give a lower target"):
        shape_for(1.0, 20_000, block_tokens=16, prompt_tokens=512)


def test_a_target_past_one_is_refused():
    with pytest.raises(WorkloadError, match="0 to 1"):
        shape_for(1.2, 20_000, block_tokens=16, prompt_tokens=512)
