"""Weka traces as the published files have them (replay/sources/weka_trace.py): sub-agents' calls counted from their
spawn made absolute, sessions linked for --trace-timing think, and inconsistent times refused in one line; checked on
a real file (tests/replay/data/weka/kv-cache-tester: callanjfox/kv-cache-tester traces/, Apache-2.0)."""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path

import pytest

from replay.plan.trace import reuse_profile
from replay.sources.base import WorkloadError
from replay.sources.block_traces import load_block_trace
from replay.sources.trace_timing import ideal_starts, in_timing_order

DATA = Path(__file__).parent / "data" / "weka"
REAL = DATA / "kv-cache-tester" / "trace_0291.json"


def expected_calls(doc: dict) -> list[tuple[float, int, tuple[int, ...]]]:
    """(absolute t, in, hash_ids) of every call, worked out here from the file: a sub-agent's inner t counts from
    its spawn when its first call's t is below the spawn's (the published files' form)."""
    out = []

    def walk(entries, spawn_t, relative):
        for e in entries:
            t = e["t"] + (spawn_t if relative else 0.0)
            if e["type"] == "subagent":
                inner = e["requests"]
                walk(inner, t, bool(inner) and inner[0]["t"] < t)
            else:
                out.append((t, e["in"], tuple(e["hash_ids"])))

    walk(doc["requests"], 0.0, False)
    return out


def lru_hit_tokens(calls, block: int, capacity_blocks: int) -> int:
    """A prefix cache of `capacity_blocks` whole blocks, LRU, replayed on `calls` (t, in, ids) in the order given."""
    cache: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for _, n, ids in calls:
        whole = ids[: n // block]
        for k, h in enumerate(whole):
            if h not in cache:
                break
            hits += block if (k + 1) * block < n else 0
        for h in whole:
            cache.pop(h, None)
            cache[h] = None
            while len(cache) > capacity_blocks:
                cache.popitem(last=False)
    return hits


def test_sub_agents_of_the_real_trace_run_after_their_spawn_not_at_the_start():
    doc = json.loads(REAL.read_text())
    spawns = [e["t"] for e in doc["requests"] if e["type"] == "subagent"]
    assert spawns == [1148.013, 1180.553]
    trace = load_block_trace(REAL, "weka")
    want = sorted(expected_calls(doc), key=lambda c: c[0])
    assert len(trace.requests) == len(want) == 32
    assert [(r.arrival_s, r.input_tokens) for r in trace.requests] == [(pytest.approx(t), n) for t, n, _ in want]
    sub = [r for r in trace.requests if r.session > 0]
    assert len(sub) == 12 and min(r.arrival_s for r in sub) == pytest.approx(1148.013)
    first_agent = sorted(r.arrival_s for r in sub if r.session == sub[0].session)
    assert first_agent == pytest.approx([1148.013 + d for d in (0, 5, 11, 15, 20)])
    # the parent's first 16 calls (t 0 to 1085) come first, none of the sub-agents' among them
    assert all(r.session == 0 for r in trace.requests[:16])


@pytest.mark.parametrize("capacity_blocks", [300, 700, 1200, 1562, 2500, 3125, 10_000])
def test_plan_hits_follow_the_absolute_order_and_differ_from_the_inner_times_taken_as_they_are(capacity_blocks):
    doc = json.loads(REAL.read_text())
    trace = load_block_trace(REAL, "weka")
    right = sorted(expected_calls(doc), key=lambda c: c[0])
    assert reuse_profile(trace).hit_tokens(capacity_blocks * 64) == lru_hit_tokens(right, 64, capacity_blocks)


def test_the_inner_times_taken_as_they_are_would_change_the_hits():
    doc = json.loads(REAL.read_text())
    naive = []  # what the reader did before: inner t as it is, so the sub-agents ran at 0-54 s

    def walk(entries):
        for e in entries:
            walk(e["requests"]) if e["type"] == "subagent" else naive.append((e["t"], e["in"], tuple(e["hash_ids"])))

    walk(doc["requests"])
    naive.sort(key=lambda c: c[0])
    right = sorted(expected_calls(doc), key=lambda c: c[0])
    assert [c[0] for c in naive[:3]] == [0.0, 0.0, 0.0]  # the parent's first call and both sub-agents' first ones
    profile = reuse_profile(load_block_trace(REAL, "weka"))
    differ = [b for b in (1562, 3125) if lru_hit_tokens(naive, 64, b) != lru_hit_tokens(right, 64, b)]
    assert differ, "the order should matter to an LRU of this size"
    for b in differ:
        assert profile.hit_tokens(b * 64) == lru_hit_tokens(right, 64, b) != lru_hit_tokens(naive, 64, b)


def test_the_parent_waits_for_the_sub_agents_its_recording_outlasts():
    trace = load_block_trace(REAL, "weka")
    reqs = trace.requests
    by_t = {round(r.arrival_s, 3): i for i, r in enumerate(reqs)}
    # agent_001 ends at 1148.013 + 46.656 s: the parent's call at 1209 s is the first after it; agent_002 ends at
    # 1180.553 + 79.184 s: the call at 1269 s waits for it (AIPerf's SPAWN_JOIN placement)
    assert reqs[by_t[1209.0]].joins == (by_t[1168.013],)
    assert reqs[by_t[1269.0]].joins == (by_t[1234.553],)
    assert sum(len(r.joins) for r in reqs) == 2
    # a sub-agent's first call follows the parent's call before the spawn (1085 s), after the time to the spawn
    first = reqs[by_t[1148.013]]
    assert first.after == by_t[1085.0] and first.delay_s == pytest.approx(1148.013 - (1085.0 + 15.64))
    # the others follow the call before them in their session, after its think_time
    assert reqs[by_t[1153.013]].after == by_t[1148.013] and reqs[by_t[1153.013]].delay_s == 3.0
    assert reqs[by_t[1209.0]].after == by_t[1085.0] and reqs[by_t[1209.0]].delay_s == 108.0  # its think_time


@pytest.mark.parametrize("name", ["trace_0291.json", "trace_0187.json"])
def test_an_ideal_server_replays_the_recorded_times_within_the_rounding_of_think_time(name):
    trace = load_block_trace(DATA / "kv-cache-tester" / name, "weka")
    starts = ideal_starts(trace.requests, max_idle_s=None)
    # think_time is recorded in whole seconds: each call drifts by under a second, and drifts add up a little
    assert max(abs(s - r.arrival_s) for s, r in zip(starts, trace.requests, strict=True)) < 2.5
    assert in_timing_order(trace, "think", None).requests[0].arrival_s == 0.0


def test_capped_pauses_shorten_the_ideal_schedule_and_keep_the_joins():
    trace = load_block_trace(REAL, "weka")
    capped = ideal_starts(trace.requests, max_idle_s=60)
    whole = ideal_starts(trace.requests, max_idle_s=None)
    assert max(capped) < max(whole) - 528 + 60 + 182  # the 528 s pause (and 182 s, 108 s, 88 s ones) cut to 60 s
    for i, r in enumerate(trace.requests):  # every call after what it follows and what it joins has ended
        ends = [capped[j] + (trace.requests[j].api_s or 0) for j in (*r.joins, r.after) if j >= 0]
        assert all(capped[i] >= e - 1e-9 for e in ends)


# ---- hand-made structures of the same kind --------------------------------------------------------------------


def call(t, n=128, ids=(1, 2), **extra):
    return {"type": "n", "t": t, "in": n, "out": 4, "hash_ids": list(ids), **extra}


def sub(t, requests, agent="a", **extra):
    return {"type": "subagent", "t": t, "agent_id": agent, "requests": requests, **extra}


def write(tmp_path, requests, name="c.json") -> Path:
    doc = {"id": "c", "block_size": 64, "hash_id_scope": "local", "requests": requests}
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def times(path) -> list[float]:
    return [r.arrival_s for r in load_block_trace(path, "weka").requests]


def test_the_committed_absolute_form_sample_keeps_its_times():
    assert times(DATA / "session_a.json") == [0.0, 4.0, 6.5, 8.0, 12.0]  # its sub-agent's calls already absolute


@pytest.mark.parametrize(
    ("requests", "want"),
    [
        # relative inner times, including one past the spawn's own t (stays relative: 6 + 11)
        ([call(0), sub(6, [call(0), call(5), call(11)]), call(30)], [0, 6, 11, 17, 30]),
        # absolute inner times
        ([call(0), sub(6, [call(6), call(7)]), call(30)], [0, 6, 7, 30]),
        # nested: relative in relative (spawns at 100 and 100 + 10)
        ([call(0), sub(100, [call(0), sub(10, [call(0), call(2)], agent="b"), call(20)]), call(200)],
         [0, 100, 110, 112, 120, 200]),
        # nested: absolute in relative (the inner spawn at 100 + 10 = 110, its calls at 111, 115)
        ([call(0), sub(100, [call(0), sub(10, [call(111), call(115)], agent="b")]), call(200)],
         [0, 100, 111, 115, 200]),
        # a sub-agent spawned at 0: both forms the same
        ([sub(0, [call(0), call(3)]), call(5)], [0, 3, 5]),
        # a sub-agent without calls
        ([call(0), sub(4, []), call(9)], [0, 9]),
    ],
)  # fmt: skip
def test_sub_agent_times_of_either_form_and_nested(tmp_path, requests, want):
    assert times(write(tmp_path, requests)) == pytest.approx(want)


def test_a_join_waits_for_the_sub_agent_even_when_the_parent_pauses_less(tmp_path):
    requests = [
        call(0, api_time=1.0),
        sub(2, [call(0, api_time=1.0), call(10, api_time=20.0, think_time=9.0)], duration_ms=31_000),
        call(40, api_time=1.0, think_time=1.0),  # the recording says the parent waited: 40 s >= 2 + 31 s
        call(42, api_time=1.0, think_time=1.0),
    ]
    trace = load_block_trace(write(tmp_path, requests), "weka")
    r = trace.requests
    assert [x.arrival_s for x in r] == [0, 2, 12, 40, 42]
    assert r[3].joins == (2,) and r[3].after == 0 and r[4].joins == ()
    starts = ideal_starts(r, max_idle_s=None)
    # parent: 0 -> ends 1; sub-agent: spawn 1 s after it, first call at 2, ends 3, next after 9 s at 12, ends 32;
    # the parent's next call 1 s after its previous call ended, but not before the sub-agent's end (32)
    assert starts == pytest.approx([0, 2, 12, 32, 34])
    assert [x.arrival_s for x in in_timing_order(trace, "think", None).requests] == pytest.approx(starts)


def test_a_sub_agent_no_later_call_outlasts_runs_in_the_background(tmp_path):
    requests = [call(0), sub(1, [call(0, api_time=100.0)], duration_ms=100_000), call(5), call(9)]
    trace = load_block_trace(write(tmp_path, requests), "weka")
    assert all(r.joins == () for r in trace.requests)


@pytest.mark.parametrize(
    ("requests", "where", "says"),
    [
        # absolute form (the first call at or after the spawn), then a call before the spawn
        ([call(0), sub(50, [call(50), call(3)])], "requests[1].requests[1]",
         "t 3 s is before its sub-agent's spawn at 50 s"),
        ([call(0), sub(50, [call(60), call(49.5)])], "requests[1].requests[1]", "before its sub-agent's spawn"),
        # nested, absolute in absolute
        ([call(0), sub(10, [call(10), sub(20, [call(21), call(19)], agent="b")])],
         "requests[1].requests[1].requests[1]", "before its sub-agent's spawn at 20 s"),
        # a loop of spawns: an agent spawned inside itself, directly or two levels down
        ([call(0), sub(1, [call(0), sub(2, [call(0)], agent="a")], agent="a")], "requests[1].requests[1]",
         "sub-agent 'a' is spawned inside itself (a loop of spawns)"),
        ([call(0), sub(1, [sub(2, [sub(3, [call(0)], agent="x")], agent="y")], agent="x")],
         "requests[1].requests[0].requests[0]", "sub-agent 'x' is spawned inside itself"),
        # a call before the previous call of its session
        ([call(0), call(10), call(9)], "requests[2]", "t 9 s is before the previous call of its session (10 s)"),
        ([call(0), sub(5, [call(0), call(4), call(2)])], "requests[1].requests[2]", "before the previous call"),
        # times and durations that are not numbers >= 0
        ([call(0), sub(5, [call(0)], duration_ms="long")], "requests[1]", "duration_ms 'long' is not numeric"),
        ([call(0, api_time=-1)], "requests[0]", "api_time '-1' must be a finite number >= 0"),
        ([call(0, think_time=True)], "requests[0]", "think_time 'True' is not numeric"),
        ([{"type": "subagent", "requests": []}], "requests[0]", "missing t"),
    ],
)  # fmt: skip
def test_inconsistent_times_are_one_line_naming_the_file_and_the_call_path(tmp_path, requests, where, says):
    path = write(tmp_path, requests)
    with pytest.raises(WorkloadError) as exc:
        load_block_trace(path, "weka")
    line = str(exc.value)
    assert line.startswith(f"{path}: requests") and f"{path}: {where}: " in line and says in line, line
    assert "\n" not in line


def test_several_files_keep_their_sessions_apart(tmp_path):
    write(tmp_path, [call(0), sub(2, [call(0), call(1)]), call(10)], "a.json")
    write(tmp_path, [call(0), call(5)], "b.json")
    trace = load_block_trace(tmp_path, "weka")
    sessions = {}
    for r in trace.requests:
        sessions.setdefault(r.session, []).append(r.arrival_s)
    assert sorted(sessions.values()) == [[0, 5], [0, 10], [2, 3]]
    for i, r in enumerate(trace.requests):  # every link points to an earlier request of the same file
        assert r.after < i and all(j < i for j in r.joins)
