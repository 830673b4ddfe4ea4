"""`kvtier replay --trace-timing timestamps|think` on an agentic (Weka) trace against the fake server: think is closed
loop, so a slower server stretches each session, and a parent's call waits for the sub-agents it joins; the flags are
refused where they mean nothing, in replay and in `kvtier plan --trace`."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import pytest

from replay.cli import main as kvtier
from replay.openai.fake_server import FakeServer, FakeServerConfig

REAL = Path(__file__).resolve().parents[1] / "data" / "weka" / "kv-cache-tester" / "trace_0291.json"
MOONCAKE = Path(__file__).resolve().parents[1] / "data" / "mooncake" / "conversation_trace_head300.jsonl"


def call(t, n, api=0.5, think=None):
    c = {"type": "n", "t": t, "in": n, "out": 4, "hash_ids": [1], "api_time": api}
    return c if think is None else {**c, "think_time": think}


def weka(tmp_path, requests, name="c.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"id": "c", "block_size": 64, "hash_id_scope": "local", "requests": requests}))
    return path


def replay(tmp_path, srv, path, *args) -> dict[int, dict]:
    """The run's records by prompt length (each call of these traces has its own)."""
    detail = tmp_path / "d.jsonl"
    argv = ["replay", "--base-url", srv.base_url, "--model", "f", "--quiet", "--source", "weka"]
    argv += ["--dataset-path", str(path), "--max-tokens", "4", "--output", str(tmp_path / "r.json")]
    assert kvtier([*argv, "--detail", str(detail), *args]) == 0
    rows = [json.loads(line) for line in detail.read_text().splitlines()]
    assert all(r["success"] for r in rows)
    return {r["target_prompt_tokens"]: r for r in rows}


# One conversation: calls of 100..104 tokens, 0.1 s apart after the previous one ended (think_time), recorded with
# 0.5 s api_time each, so the trace's own times are 0, 0.6, 1.2, ...
SESSION = [call(0.6 * k, 100 + k, think=0.1 if k else None) for k in range(5)]


@pytest.mark.slow
def test_a_slower_server_stretches_a_session_under_think_and_not_under_timestamps(tmp_path):
    spans = {}
    for ttft in (0, 300):
        with FakeServer(FakeServerConfig(ttft_ms=ttft)) as srv:
            think = replay(tmp_path, srv, weka(tmp_path, SESSION), "--trace-timing", "think")
        calls = [think[100 + k] for k in range(5)]
        for prev, nxt in itertools.pairwise(calls):  # each call 0.1 s after the previous one's answer ended, not before
            assert nxt["sent_ns"] >= prev["last_chunk_ns"] + 0.1e9
            assert nxt["scheduled_ns"] >= prev["last_chunk_ns"] + 0.1e9 - 1e6
        spans[ttft] = (calls[-1]["sent_ns"] - calls[0]["sent_ns"]) / 1e9
    assert spans[300] >= 4 * (0.3 + 0.1)  # four answers of >= 0.3 s and four pauses before the last call
    assert spans[300] > spans[0] + 0.8
    # the same trace on its timestamps: the slow server does not move a request's scheduled time
    with FakeServer(FakeServerConfig(ttft_ms=300)) as srv:
        stamps = replay(tmp_path, srv, weka(tmp_path, SESSION), "--trace-timing", "timestamps")
    t0 = stamps[100]["scheduled_ns"]
    assert [round((stamps[100 + k]["scheduled_ns"] - t0) / 1e6) for k in range(5)] == [0, 600, 1200, 1800, 2400]


@pytest.mark.slow
def test_children_run_before_the_parent_s_next_call(tmp_path):
    requests = [
        call(0, 200, api=0.1),
        # two sub-agents spawned 0.05 s after the parent's first call ended, their calls counted from the spawn;
        # recorded ends 0.15 + 0.5 and 0.15 + 0.3, both before the parent's next call at 1.0 s: it joins both
        {"type": "subagent", "t": 0.15, "agent_id": "a", "duration_ms": 500,
         "requests": [call(0, 300, api=0.1), call(0.2, 301, api=0.1, think=0.1)]},
        {"type": "subagent", "t": 0.15, "agent_id": "b", "duration_ms": 300, "requests": [call(0, 400, api=0.2)]},
        call(1.0, 201, api=0.1, think=0.0),  # the recording's pause is long; think_time 0: only the joins hold it
        call(1.2, 202, api=0.1, think=0.1),
    ]  # fmt: skip
    with FakeServer(FakeServerConfig(ttft_ms=250)) as srv:  # every call slower than recorded
        rows = replay(tmp_path, srv, weka(tmp_path, requests), "--trace-timing", "think", "--max-idle-s", "5")
    first, nxt, last = rows[200], rows[201], rows[202]
    for child in (300, 400):  # the sub-agents start once the parent's call before the spawn ended, plus 0.05 s
        assert rows[child]["sent_ns"] >= first["last_chunk_ns"] + 0.05e9 - 1e6
    assert rows[301]["sent_ns"] >= rows[300]["last_chunk_ns"] + 0.1e9 - 1e6
    children_end = max(rows[c]["last_chunk_ns"] for c in (300, 301, 400))
    assert nxt["sent_ns"] >= children_end  # the parent's next call waited for both sub-agents' last calls
    assert last["sent_ns"] >= nxt["last_chunk_ns"] + 0.1e9 - 1e6
    assert len({r["session_id"] for r in rows.values()}) == 1  # one conversation, its sub-agents included


@pytest.mark.slow
def test_the_idle_cap_shortens_a_long_pause(tmp_path):
    requests = [call(0, 100, api=0.0), call(3600, 101, api=0.0, think=3600)]  # an hour away from the keyboard
    with FakeServer() as srv:
        rows = replay(tmp_path, srv, weka(tmp_path, requests), "--trace-timing", "think", "--max-idle-s", "0.3")
    gap = (rows[101]["sent_ns"] - rows[100]["last_chunk_ns"]) / 1e9
    assert 0.3 - 1e-3 <= gap < 30


@pytest.mark.slow
def test_the_real_trace_replays_every_call_under_think(tmp_path):
    with FakeServer() as srv:
        detail = tmp_path / "d.jsonl"
        rc = kvtier([
            "replay", "--base-url", srv.base_url, "--model", "f", "--quiet", "--source", "weka",
            "--dataset-path", str(REAL), "--trace-block-tokens", "16", "--max-tokens", "2",
            "--trace-timing", "think", "--trace-speedup", "1000", "--max-idle-s", "1",
            "--output", str(tmp_path / "r.json"), "--detail", str(detail),
        ])  # fmt: skip
    assert rc == 0
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["completed"] == 32 and doc["pacing"] == "think" and doc["trace_timing"] == "think"


REPLAY = ["replay", "--base-url", "http://127.0.0.1:9", "--model", "m", "--output", os.devnull]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--source", "weka", "--dataset-path", str(REAL), "--max-idle-s", "5"],
         "--max-idle-s is not read by --source weka (it caps the pauses of --trace-timing think)"),
        (["--source", "synthetic", "--trace-timing", "think"], "--trace-timing is not read by --source synthetic"),
        (["--source", "weka", "--dataset-path", str(REAL), "--trace-timing", "think", "--users", "2"],
         "--users runs its own closed loop"),
        (["--source", "burstgpt", "--trace-path", str(REAL), "--trace-timing", "think"],
         "--trace-timing is not read by --source burstgpt"),
        (["--source", "weka", "--dataset-path", str(REAL), "--trace-timing", "think", "--max-idle-s", "0"],
         "--max-idle-s"),
    ],
)  # fmt: skip
def test_timing_flags_are_refused_where_they_mean_nothing(argv, says, capsys):
    assert kvtier([*REPLAY, *argv]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1, err


@pytest.mark.slow
def test_think_on_a_trace_without_sessions_is_one_line(tmp_path, capsys):
    with FakeServer() as srv:
        argv = ["replay", "--base-url", srv.base_url, "--model", "f", "--quiet", "--source", "mooncake"]
        argv += ["--dataset-path", str(MOONCAKE), "--trace-timing", "think"]
        rc = kvtier([*argv, "--output", str(tmp_path / "r")])
        assert srv.requests_seen == 0
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "has none" in err and str(MOONCAKE) in err, err


# ---- kvtier plan --trace: which order it models --------------------------------------------------------------------


def plan(tmp_path, *args) -> dict:
    out = tmp_path / "p.json"
    argv = ["plan", "--trace", str(REAL), "--format", "weka", "--tier", "l1=1e5", "--quiet", "--output", str(out)]
    assert kvtier([*argv, *args]) == 0
    return json.loads(out.read_text())


def test_plan_says_which_timing_its_order_follows(tmp_path):
    stamps = plan(tmp_path)
    assert stamps["trace_timing"] == "timestamps" and stamps["order"].startswith("timestamps")
    think = plan(tmp_path, "--trace-timing", "think", "--max-idle-s", "60")
    assert think["trace_timing"] == "think" and think["max_idle_s"] == 60 and "ideal server" in think["order"]
    # the same requests, in another order: the sub-agents' calls move against the parent's once pauses are capped
    assert think["traces"][0]["requests"] == stamps["traces"][0]["requests"] == 32
    assert think["traces"][0]["max_hit_rate"] == stamps["traces"][0]["max_hit_rate"]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--trace", str(REAL), "--format", "weka", "--max-idle-s", "5"], "--max-idle-s caps the pauses"),
        (["--trace", str(MOONCAKE), "--trace-timing", "think"], "has none"),
    ],
)
def test_plan_refuses_timing_flags_that_mean_nothing(tmp_path, capsys, args, says):
    out = tmp_path / "p.json"
    assert kvtier(["plan", *args, "--tier", "l1=1e5", "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1 and not out.exists(), err
