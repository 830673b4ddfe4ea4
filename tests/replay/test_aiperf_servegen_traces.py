"""AIPerf's Mooncake superset (--source/--format aiperf-mooncake) and ServeGen's offline traces (servegen): their
samples (hand-made: tests/replay/data/aiperf_mooncake/README.md, tests/replay/data/servegen/README.md) read with the
right times, sessions and blocks; a bad row is one line naming file:line; plan, replay and bench each run or refuse
them."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from bench_helpers import write_config

from replay.cli import main as kvtier
from replay.plan.trace import reuse_profile
from replay.sources.base import WorkloadError
from replay.sources.block_traces import LoadStopped, load_block_trace, merge_traces
from replay.sources.registry import SOURCES
from replay.sources.trace_timing import has_sessions, ideal_starts, in_timing_order

DATA = Path(__file__).parent / "data"
SESSIONS = DATA / "aiperf_mooncake" / "sessions_handmade.jsonl"
NO_IDS = DATA / "aiperf_mooncake" / "no_hash_ids_handmade.jsonl"
SG_A = DATA / "servegen" / "trace_a_handmade.jsonl"
SG_B = DATA / "servegen" / "trace_b_handmade.jsonl"
MOONCAKE = DATA / "mooncake" / "conversation_trace_head300.jsonl"


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ---- AIPerf's Mooncake superset ----------------------------------------------------------------------------------


def expected_times(doc: list[dict]) -> list[float]:
    """Each row's time in seconds, worked out here from the file: its timestamp, else its session's previous row's
    time plus its delay (a row alone or a session's first: its delay from the start)."""
    last: dict[str, float] = {}
    out = []
    for r in doc:
        prev = last.get(r["session_id"], 0.0) if "session_id" in r else 0.0
        t = r["timestamp"] / 1000 if "timestamp" in r else prev + r.get("delay", 0) / 1000
        if "session_id" in r:
            last[r["session_id"]] = t
        out.append(t)
    return out


def test_the_aiperf_sample_reads_its_times_sessions_texts_and_blocks():
    doc = rows(SESSIONS)
    trace = load_block_trace(SESSIONS, "aiperf-mooncake")
    times = expected_times(doc)
    order = sorted(range(len(doc)), key=lambda i: (times[i], i))
    assert [r.arrival_s for r in trace.requests] == pytest.approx([times[i] for i in order])
    assert [r.arrival_s for r in trace.requests] == pytest.approx([0, 0.5, 1.0, 1.5, 2.0, 2.0, 3.0, 3.5, 4.0])
    assert trace.block_tokens == 512 and trace.has_block_ids
    for r, i in zip(trace.requests, order, strict=True):
        row = doc[i]
        assert r.hash_ids == tuple(row.get("hash_ids", ()))
        assert r.output_tokens == row["output_length"]
        if "input_length" in row:
            assert r.input_tokens == row["input_length"] and r.text is None
        else:  # a text prompt: sent as it is, its tokens estimated at 4 characters each
            assert r.text is not None and r.input_tokens == math.ceil(len(r.text) / 4)
    text_rows = [r.text for r in trace.requests if r.text is not None]
    assert text_rows[0] == doc[5]["text_input"]
    assert text_rows[1] == doc[6]["messages"][0]["content"] + "\n" + doc[6]["messages"][1]["content"][0]["text"]
    # sessions: s1, s2, s3 in the order they first appear; rows alone have none
    assert [r.session for r in trace.requests] == [0, 1, -1, 2, 0, 1, 0, -1, 2]
    # each row follows its session's previous one (as positions in time order), the pause its delay
    assert [r.after for r in trace.requests] == [-1, -1, -1, -1, 0, 1, 4, -1, 3]
    assert [r.delay_s for r in trace.requests if r.session >= 0] == pytest.approx([0, 0.5, 1.5, 2.0, 1.5, 1.0, 2.5])


def test_think_timing_runs_each_session_closed_loop():
    trace = load_block_trace(SESSIONS, "aiperf-mooncake")
    assert has_sessions(trace)
    # an infinitely fast server reproduces the rows' times; a call that takes 10 s delays its session's next call
    assert ideal_starts(trace.requests, None) == pytest.approx([r.arrival_s for r in trace.requests])
    slow = [type(r)(**{**{f: getattr(r, f) for f in r.__slots__}, "api_s": 10.0}) for r in trace.requests]
    starts = ideal_starts(slow, None)
    assert starts[4] == pytest.approx(0 + 10 + 2.0)  # s1's second row: 2 s after its first ended
    assert starts[6] == pytest.approx(starts[4] + 10 + 1.0)
    assert starts[2] == pytest.approx(1.0)  # a row alone keeps its time
    ordered = in_timing_order(trace, "think", None)
    assert [r.arrival_s for r in ordered.requests] == pytest.approx([r.arrival_s for r in trace.requests])


def test_a_fast25_file_reads_the_same_as_the_strict_format():
    strict = load_block_trace(MOONCAKE, "mooncake")
    superset = load_block_trace(MOONCAKE, "aiperf-mooncake")
    assert [(r.arrival_s, r.input_tokens, r.output_tokens, r.hash_ids) for r in superset.requests] == [
        (r.arrival_s, r.input_tokens, r.output_tokens, r.hash_ids) for r in strict.requests
    ]
    assert not has_sessions(superset)
    assert reuse_profile(superset).max_hit_rate == reuse_profile(strict).max_hit_rate


@pytest.mark.parametrize(
    "row",
    [
        {"session_id": "s", "input_length": 600, "output_length": 4},
        {"timestamp": 0, "input_length": 600, "output_length": 4},
        {"timestamp": 0, "text_input": "hello", "output_length": 4},
        {"delay": 5, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]},
    ],
)
def test_the_strict_format_names_the_superset_for_an_aiperf_row(tmp_path, row):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(WorkloadError, match="--source aiperf-mooncake") as exc:
        load_block_trace(path, "mooncake")
    assert str(exc.value).startswith(f"{path}:1: missing ")
    assert load_block_trace(path, "aiperf-mooncake").requests  # and there it is read


def test_a_trace_without_hash_ids_claims_no_reuse():
    trace = load_block_trace(NO_IDS, "aiperf-mooncake")
    assert not trace.has_block_ids and len(trace.requests) == 4
    assert [r.arrival_s for r in trace.requests] == pytest.approx([0, 10.535, 27.482, 30.001])
    assert reuse_profile(trace).max_hit_rate == 0  # two prompts of 655 tokens: equal lengths, nothing shared


GOOD = '{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]}'


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ('{"timestamp": 5, "output_length": 4}', "exactly one of input_length, text_input, messages (found none)"),
        ('{"input_length": 5, "text_input": "hi"}', "(found input_length, text_input)"),
        ('{"text_input": "hi", "messages": [{"role": "user", "content": "x"}]}', "(found text_input, messages)"),
        ('{"text_input": "hi", "hash_ids": [1]}', "hash_ids need input_length"),
        ('{"payload": {"prompt": "hi"}}', "a payload row is a request body"),
        ('{"text_input": 7}', "text_input is int, not text"),
        ('{"messages": []}', "messages must be a non-empty list"),
        ('{"messages": "hi"}', "messages must be a non-empty list"),
        ('{"messages": [{"content": "hi"}]}', "messages[0] is not a chat message with a role"),
        ('{"messages": [{"role": "user", "content": 3}]}', "messages[0].content is int, not text"),
        (
            '{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}',
            "messages[0].content holds a part that is not text",
        ),
        ('{"session_id": 7, "input_length": 5}', "session_id 7 is not text"),
        ('{"timestamp": -1, "input_length": 5}', "timestamp '-1' must be a finite number >= 0"),
        ('{"delay": "soon", "input_length": 5}', "delay 'soon' is not numeric"),
        ('{"delay": true, "input_length": 5}', "delay 'True' is not numeric"),
        ('{"input_length": 5, "output_length": -2}', "output_length '-2'"),
        ('{"input_length": 5, "output_length": 1.5}', "output_length '1.5' is not a whole number"),
        ('{"input_length": "many"}', "input_length 'many' is not numeric"),
        ('{"input_length": 600, "hash_ids": [1, "2"]}', "hash_ids holds '2', not an integer"),
        ('{"input_length": 600, "hash_ids": [1, 2, 3]}', "3 hash_ids for input_length 600"),
        ("[1, 2]", "expected a JSON object, found list"),
        ("{not json", "not a JSON object"),
    ],
)
def test_a_bad_aiperf_row_is_one_line_naming_its_place(tmp_path, line, says):
    path = tmp_path / "t.jsonl"
    path.write_text(GOOD + "\n\n" + line + "\n")
    with pytest.raises(WorkloadError) as exc:
        load_block_trace(path, "aiperf-mooncake")
    msg = str(exc.value)
    assert msg.startswith(f"{path}:3: ") and says in msg and "\n" not in msg, msg


def test_a_session_going_back_in_time_is_refused(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"session_id": "a", "timestamp": 2000, "input_length": 5}\n'
        '{"session_id": "b", "timestamp": 1000, "input_length": 5}\n'  # another session may start earlier
        '{"session_id": "a", "timestamp": 1500, "input_length": 5}\n'
    )
    with pytest.raises(WorkloadError) as exc:
        load_block_trace(path, "aiperf-mooncake")
    assert str(exc.value) == f"{path}:3: timestamp 1500 ms is before the previous row of session 'a' (2000 ms)"


def test_the_aiperf_reader_keeps_the_bounds(tmp_path):
    assert len(load_block_trace(SESSIONS, "aiperf-mooncake", max_requests=3).requests) == 3
    assert [r.arrival_s for r in load_block_trace(SESSIONS, "aiperf-mooncake", until_s=2.0).requests] == [
        0,
        0.5,
        1.0,
        1.5,
    ]
    with pytest.raises(WorkloadError, match="more than 10 block uses"):
        load_block_trace(SESSIONS, "aiperf-mooncake", max_block_uses=10)
    with pytest.raises(LoadStopped):
        load_block_trace(SESSIONS, "aiperf-mooncake", should_stop=lambda: True)
    # a text prompt cut to the context bound is cut as its tokens were counted, 4 characters a token
    cut = load_block_trace(SESSIONS, "aiperf-mooncake", max_context_tokens=30)
    texts = [r for r in cut.requests if r.text is not None]
    assert texts and all(len(r.text) <= 4 * r.input_tokens and r.input_tokens + r.output_tokens <= 30 for r in texts)
    # a rescaled block scales the made prompts, not the texts
    small = load_block_trace(SESSIONS, "aiperf-mooncake", block_tokens=16)
    whole = load_block_trace(SESSIONS, "aiperf-mooncake")
    for a, b in zip(whole.requests, small.requests, strict=True):
        assert b.input_tokens == (a.input_tokens if a.text is not None else math.ceil(a.input_tokens / 32))


# ---- ServeGen offline ---------------------------------------------------------------------------------------------


def test_the_servegen_sample_reads_in_file_order_without_times():
    doc = rows(SG_A)
    trace = load_block_trace(SG_A, "servegen")
    assert trace.block_tokens == 16 and trace.shared_ids and not has_sessions(trace)
    assert [r.arrival_s for r in trace.requests] == [0.0] * len(doc)
    assert [(r.input_tokens, r.hash_ids) for r in trace.requests] == [
        (row["input_length"], tuple(row["hash_ids"])) for row in doc
    ]
    assert {r.output_tokens for r in trace.requests} == {0}  # no answer length in the file
    assert not SOURCES["servegen"].timed and SOURCES["servegen"].block_trace


def test_servegen_files_share_one_id_namespace():
    a, b = load_block_trace(SG_A, "servegen"), load_block_trace(SG_B, "servegen")
    merged = merge_traces([a, b])
    assert len(merged.requests) == len(a.requests) + len(b.requests)
    # kept apart (a format whose ids are per file), each file hits only its own blocks
    apart = merge_traces([type(a)(a.name, a.requests, 16, a.report), type(b)(b.name, b.requests, 16, b.report)])
    alone = reuse_profile(a).hit_tokens(1e9) + reuse_profile(b).hit_tokens(1e9)
    assert reuse_profile(apart).hit_tokens(1e9) == alone
    # one namespace: b-0 finds the system prompt (0-3) a's requests stored, and b-1 a-0's blocks 100 and 101 too
    assert b.requests[1].hash_ids[:6] == a.requests[0].hash_ids[:6] == (0, 1, 2, 3, 100, 101)
    assert reuse_profile(merged).hit_tokens(1e9) == alone + 16 * (4 + 2)


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ('{"type": "text", "input_length": 20, "hash_ids": [1, 2]}', "missing request_id"),
        ('{"request_id": "x", "input_length": 20}', "missing hash_ids"),
        ('{"request_id": "x", "input_length": 20, "hash_ids": [1, 2, 3]}', "3 hash_ids for input_length 20"),
        ('{"request_id": "x", "input_length": "x", "hash_ids": []}', "input_length 'x' is not numeric"),
        ('{"request_id": "x", "input_length": 20, "hash_ids": 5}', "hash_ids must be a list"),
        ('{"request_id": "x", "input_length": 20, "hash_ids": [], "output_length": -1}', "output_length '-1'"),
    ],
)
def test_a_bad_servegen_row_is_one_line_naming_its_place(tmp_path, line, says):
    path = tmp_path / "t.jsonl"
    path.write_text(SG_A.read_text().splitlines()[0] + "\n" + line + "\n")
    with pytest.raises(WorkloadError) as exc:
        load_block_trace(path, "servegen")
    assert str(exc.value).startswith(f"{path}:2: ") and says in str(exc.value), str(exc.value)


# ---- the drivers: each runs them or refuses in one line --------------------------------------------------------------

REPLAY = ["replay", "--base-url", "http://127.0.0.1:1", "--model", "m", "--quiet", "--output"]


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        ([], "--source servegen has no arrival times: give --users N"),
        (["--trace-speedup", "2", "--users", "2"], "--trace-speedup is not read by --source servegen"),
        (["--max-idle-s", "5", "--users", "2"], "--max-idle-s is not read by --source servegen"),
    ],
)
def test_replay_refuses_servegen_without_a_pace_or_with_a_timing_flag(tmp_path, capsys, argv, says):
    out = tmp_path / "r.json"
    assert kvtier([*REPLAY, str(out), "--source", "servegen", "--dataset-path", str(SG_A), *argv]) == 2
    assert says in one_line(capsys) and not out.exists()


def test_bench_refuses_a_speedup_for_servegen(tmp_path, capsys):
    from replay.synthetic.cli import main as bench

    cfg = write_config(tmp_path, duration=5)
    argv = ["--config", cfg, "--source", "servegen", "--dataset-path", str(SG_A)]
    for speedup in ("0", "2"):
        assert bench([*argv, "--trace-speedup", speedup]) == 2
        assert "--trace-speedup is not read by --source servegen (its requests have no times" in one_line(capsys)
    assert not (tmp_path / "out.json").exists()


def plan(*args: str, check: int = 0) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, "-m", "replay.cli", "plan", *args], capture_output=True, text=True, timeout=120)
    assert p.returncode == check, p.stderr
    return p


@pytest.mark.slow
def test_plan_says_in_one_line_a_trace_without_ids_has_no_reuse_model(tmp_path):
    out = tmp_path / "p.json"
    p = plan("--trace", str(NO_IDS), "--format", "aiperf-mooncake", "--tier", "l1=1e4", "--output", str(out), "--quiet")
    assert p.stderr == f"kvtier plan --trace: {NO_IDS}: no block ids: no reuse model (every request a miss)\n"
    entry = json.loads(out.read_text())["traces"][0]
    assert entry["block_ids"] is False and entry["max_hit_rate"] == 0 and entry["requests"] == 4
    # a trace with ids: no such line, and its reuse modelled
    p = plan("--trace", str(SESSIONS), "--format", "aiperf-mooncake", "--output", str(out), "--quiet")
    entry = json.loads(out.read_text())["traces"][0]
    assert p.stderr == "" and entry["block_ids"] is True and entry["max_hit_rate"] > 0


@pytest.mark.slow
def test_plan_models_aiperf_sessions_think_and_servegen_files_together(tmp_path):
    out = tmp_path / "p.json"
    plan("--trace", str(SESSIONS), "--format", "aiperf-mooncake", "--trace-timing", "think", "--output", str(out))
    doc = json.loads(out.read_text())
    assert doc["trace_timing"] == "think" and doc["traces"][0]["requests"] == 9
    plan("--trace", str(SG_A), "--trace", str(SG_B), "--format", "servegen", "--output", str(out), "--quiet")
    union = json.loads(out.read_text())["traces"][2]
    a, b = load_block_trace(SG_A, "servegen"), load_block_trace(SG_B, "servegen")
    assert union["name"] == "all" and union["max_hit_rate"] == reuse_profile(merge_traces([a, b])).max_hit_rate
    p = plan("--trace", str(SG_A), "--format", "servegen", "--trace-timing", "think", "--output", str(out), check=2)
    assert p.stderr.count("\n") == 1 and "this servegen trace has none" in p.stderr, p.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fmt", "path", "pace"),
    [
        ("servegen", SG_A, ["--users", "2"]),
        ("servegen", SG_A, ["--max-concurrency", "1"]),
        ("aiperf-mooncake", SESSIONS, ["--trace-speedup", "1000"]),
        ("aiperf-mooncake", SESSIONS, ["--trace-timing", "think", "--trace-speedup", "1000"]),
        ("aiperf-mooncake", NO_IDS, ["--trace-speedup", "1000"]),
    ],
)
def test_replay_runs_them_and_the_server_hits_what_the_plan_says(tmp_path, fmt, path, pace):
    from replay.openai.fake_server import FakeServer, FakeServerConfig

    trace = load_block_trace(path, fmt, block_tokens=16)
    out = tmp_path / "r.json"
    with FakeServer(FakeServerConfig(block_size=16)) as srv:
        rc = kvtier([
            *REPLAY[:2], srv.base_url, "--model", "fake", "--endpoint", "completions", "--quiet",
            "--source", fmt, "--dataset-path", str(path), "--trace-block-tokens", "16", "--max-tokens", "1",
            "--output", str(out), *pace,
        ])  # fmt: skip
        bodies = srv.recent_bodies
        metrics = urllib.request.urlopen(srv.base_url + "/metrics", timeout=10).read().decode()
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["completed"] == len(trace.requests) == len(bodies)
    assert doc["trace_block_ids"] == trace.has_block_ids
    prompts = sorted(b["prompt"].removeprefix("User: ").removesuffix("\nAssistant:") for b in bodies)
    texts = [r.text for r in trace.requests if r.text is not None]
    assert all(t in prompts for t in texts)  # a text prompt is sent as the trace has it
    made = sorted(len(p.split()) for p in prompts if p not in texts)
    assert made == sorted(r.input_tokens for r in trace.requests if r.text is None)
    if "think" in pace:
        assert doc["pacing"] == "think"
    value = {m.split("{")[0]: float(m.rsplit(" ", 1)[1]) for m in metrics.splitlines() if m.startswith("vllm:")}
    hits = value["vllm:prefix_cache_hits_total"]
    if "--users" not in pace:  # one request at a time, in the plan's order: the server hits what the plan says
        # (in tokens, not as a rate: a text prompt's tokens are estimated from its characters, which the fake
        # server's tokenizer, a token a word, does not count alike; a block either way for the prompt's "User: ")
        assert hits == pytest.approx(reuse_profile(trace).hit_tokens(math.inf), abs=16)
    assert (hits > 0) == trace.has_block_ids


@pytest.mark.slow
@pytest.mark.parametrize(("fmt", "path"), [("servegen", SG_A), ("aiperf-mooncake", SESSIONS)])
def test_bench_runs_them_against_the_plan(tmp_path, fmt, path):
    from replay.synthetic.cli import main as bench

    cfg = write_config(tmp_path, duration=60, cpu_mem_gb=1, storage_capacity_gb=0.000001)
    argv = ["--config", cfg, "--source", fmt, "--dataset-path", str(path), "--trace-block-tokens", "16"]
    assert bench([*argv, *([] if fmt == "servegen" else ["--trace-speedup", "0"])]) == 0
    t = json.loads((tmp_path / "out.json").read_text())["trace"]
    trace = load_block_trace(path, fmt, block_tokens=16)
    assert t["requests"] == len(trace.requests) and t["source"] == fmt
    assert t["hit_rate"] == t["predicted_hit_rate"] == pytest.approx(reuse_profile(trace).max_hit_rate, abs=1e-6)
