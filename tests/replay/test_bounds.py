"""One input row never makes unbounded work: requests are cut to the model's context length and to what the tiers
hold (and counted), bad numbers are bad rows (file:line), the event loop stays free for signals, and the --duration
window holds with 100,000 users. Real files, real runs, real processes."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from bench_helpers import SMALL_MODEL, run, write_config
from helpers import wait_for

from replay.sources.base import WorkloadError
from replay.sources.burstgpt import load_burstgpt
from replay.sources.sharegpt import estimate_tokens, load_sharegpt
from replay.synthetic.cli import main
from replay.synthetic.view import STATUS_ENV

HEADER = ["Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type"]


def write_trace(path, rows, bom=False):
    with open(path, "w", newline="", encoding="utf-8-sig" if bom else "utf-8") as f:
        w = csv.writer(f)
        w.writerow(HEADER)
        for ts, req, resp in rows:
            w.writerow([ts, "ChatGPT", req, resp, "", "Conversation log"])
    return path


def huge_sharegpt(path, message_bytes=10 << 20):
    convs = [
        {
            "id": "big",
            "conversations": [
                {"from": "human", "value": "word " * (message_bytes // 5)},
                {"from": "gpt", "value": "ok"},
            ],
        },
        {"id": "small", "conversations": [{"from": "human", "value": "hello there"}, {"from": "gpt", "value": "hi"}]},
    ]
    path.write_text(json.dumps(convs))
    return path


# ---- loaders ---------------------------------------------------------------------------------------------------------
def test_sharegpt_huge_message_is_cut_to_the_context_and_counted(tmp_path):
    convs, report = load_sharegpt(
        huge_sharegpt(tmp_path / "sg.json"), count_tokens=estimate_tokens, max_context_tokens=4096
    )
    big = convs[0].turns[0]
    assert big.input_tokens + big.output_tokens <= 4096 and big.input_tokens == 4096
    assert len(big.text) < 4096 * 8  # the text is cut too, for drivers that send it
    assert convs[1].turns[0].input_tokens == estimate_tokens("hello there")
    assert report.truncated == {"over_max_context_tokens": 1}


def test_burstgpt_huge_row_is_cut_and_counted(tmp_path):
    trace = write_trace(tmp_path / "t.csv", [(0, "1e12", 10), (1.5, 100, 20)])
    convs, report = load_burstgpt(trace, max_context_tokens=8192)
    assert [(c.turns[0].input_tokens, c.turns[0].output_tokens) for c in convs] == [(8192, 0), (100, 20)]
    assert report.truncated == {"over_max_context_tokens": 1}


@pytest.mark.parametrize(
    "row, match",
    [
        (("inf", 10, 10), r"t\.csv:3: Timestamp 'inf'"),
        (("nan", 10, 10), r"t\.csv:3: Timestamp 'nan'"),
        (("-1", 10, 10), r"t\.csv:3: Timestamp '-1'"),
        ((1, "inf", 10), r"t\.csv:3: Request tokens 'inf'"),
        ((1, 10, "-5"), r"t\.csv:3: Response tokens '-5'"),
        ((1, "1.7", 10), r"t\.csv:3: Request tokens '1.7' is not a whole number"),
    ],
)
def test_burstgpt_non_finite_negative_or_fractional_values_are_bad_rows(tmp_path, row, match):
    trace = write_trace(tmp_path / "t.csv", [(0, 10, 10), row])
    with pytest.raises(WorkloadError, match=match):
        load_burstgpt(trace)


def test_burstgpt_bom_header_is_read_and_binary_is_a_bad_file(tmp_path):
    convs, _ = load_burstgpt(write_trace(tmp_path / "bom.csv", [(0, 10, 10)], bom=True))
    assert len(convs) == 1
    binary = tmp_path / "bin.csv"
    binary.write_bytes(b"Timestamp,Model,Request tokens,Response tokens\n" + bytes(range(128, 256)) * 4)
    with pytest.raises(WorkloadError, match=r"bin\.csv:2: not UTF-8"):
        load_burstgpt(binary)
    no_newline = tmp_path / "blob.csv"  # a row within the row bound, its one field over csv's
    no_newline.write_bytes(b"x" * (2 << 20))
    with pytest.raises(WorkloadError, match=r"blob\.csv:1: malformed CSV \(field larger than field limit"):
        load_burstgpt(no_newline)


def test_sharegpt_with_bom_and_cut_multibyte_tail(tmp_path):
    items = [
        {"id": "a", "conversations": [{"from": "human", "value": "héllo"}, {"from": "gpt", "value": "wörld"}]},
        {"id": "b", "conversations": [{"from": "human", "value": "ünïcode tail"}]},
    ]
    data = "\ufeff".encode() + json.dumps(items, ensure_ascii=False).encode()
    cut = data[: data.index("ünïcode".encode()) + 1]  # cuts "ü" in the middle of its two bytes
    (tmp_path / "sg.json").write_bytes(cut)
    convs, report = load_sharegpt(tmp_path / "sg.json", count_tokens=estimate_tokens)
    assert [c.conversation_id for c in convs] == ["a"] and report.skipped


# ---- bench runs ------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_bench_cuts_a_huge_sharegpt_message_to_the_model_context(tmp_path):
    sg = huge_sharegpt(tmp_path / "sg.json")
    model = {"small": {**SMALL_MODEL, "max_context_tokens": 2000}}
    t0 = time.monotonic()
    doc = run(tmp_path, dataset_path=str(sg), model_configs=model, duration=2, replay_cycles=1, num_users=1)
    assert time.monotonic() - t0 < 30
    assert doc["status"] == "completed" and doc["summary"]["total_requests"] == 2
    assert doc["workload"]["max_context_tokens"] == 2000
    assert doc["workload"]["load_report"]["truncated"] == {"over_max_context_tokens": 1}
    assert doc["summary"]["prompt_tokens"] <= 2000 + 10


@pytest.mark.slow
def test_entries_are_bounded_by_the_largest_tier(tmp_path):
    # No context length known for this model: the tiers (0.2 GB disk) bound the entries, counted as such.
    tpl = {"t": {"context_tokens": [400_000, 400_000], "generate_tokens": [1, 1], "think_time_s": [0, 0]}}
    doc = run(tmp_path, user_templates=tpl, duration=1.5, num_users=1, disable_prefix_caching=True)
    assert doc["status"] == "completed" and doc["summary"]["total_requests"] >= 1
    assert doc["workload"]["truncated_requests"]["over_tier_capacity"] >= 1
    assert doc["summary"]["prompt_tokens"] <= doc["summary"]["total_requests"] * 0.2e9 * 0.95 / 2048


def _kvtier():
    return [sys.executable, "-m", "replay.cli", "bench"]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_huge_request_leaves_the_loop_free_for_signals(tmp_path, sig):
    trace = write_trace(tmp_path / "t.csv", [(0, "1e12", 10), (0.1, "1e12", 10), (0.2, 5, 5)])
    cfg = write_config(
        tmp_path, use_burst_trace=True, burst_trace_path=str(trace), trace_speedup=0, duration=30, num_users=2
    )
    status = tmp_path / "live.status"  # the run's live snapshots (every 0.5 s), as --num-clients reads them
    proc = subprocess.Popen(
        _kvtier() + ["--config", cfg],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=dict(os.environ, **{STATUS_ENV: str(status)}),
    )

    def running() -> bool:
        assert proc.poll() is None, proc.communicate()[1]
        return status.exists()

    wait_for(running, timeout_s=120, what="the run's first live snapshot")
    t0 = time.monotonic()
    proc.send_signal(sig)
    try:
        proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"{sig.name} was not acted on within 10 s")
    assert time.monotonic() - t0 < 10
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["status"] == "interrupted"


@pytest.mark.slow
def test_bench_with_a_huge_burstgpt_row_keeps_the_window(tmp_path):
    trace = write_trace(tmp_path / "t.csv", [(0, "1e12", 10), (0.1, 5, 5)])
    t0 = time.monotonic()
    doc = run(tmp_path, use_burst_trace=True, burst_trace_path=str(trace), trace_speedup=0, duration=3)
    assert time.monotonic() - t0 < 3 + 8
    assert doc["summary"]["window"]["overrun_s"] < 5
    assert doc["workload"]["truncated_requests"]["over_tier_capacity"] >= 1


@pytest.mark.slow
def test_100000_users_keep_the_window_and_say_why(tmp_path):
    cfg = write_config(tmp_path, num_users=100_000, duration=3)
    t0 = time.monotonic()
    r = subprocess.run(_kvtier() + ["--config", cfg], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    wall = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    assert wall < 15
    doc = json.loads((tmp_path / "out.json").read_text())
    w = doc["summary"]["window"]
    assert doc["summary"]["elapsed_time"] < 3 + 5
    assert w["users_requested"] == 100_000 and 0 < w["users_started"] <= 100_000
    if w["users_started"] < 100_000:
        assert "users started" in w["reason"]


# ---- bad model configs: one line, exit 2 -----------------------------------------------------------------------------
GOOD = {"num_hidden_layers": 4, "num_attention_heads": 4, "hidden_size": 256}


@pytest.mark.parametrize(
    "content, match",
    [
        (json.dumps([GOOD]), "expected a JSON object"),
        (json.dumps({**GOOD, "num_attention_heads": 0}), "num_attention_heads"),
        (json.dumps({**GOOD, "num_hidden_layers": "x"}), "num_hidden_layers"),
        (json.dumps({**GOOD, "num_hidden_layers": 1.7}), "num_hidden_layers"),
        (json.dumps({**GOOD, "hidden_size": 250}), "multiple"),
        (json.dumps({"text_config": None}), "lacks 'num_hidden_layers'"),
        (json.dumps({"text_config": [1]}), "text_config must be an object"),
        (json.dumps({**GOOD, "max_position_embeddings": -1}), "max_position_embeddings"),
        (b"\xff\xfe\x00binary", "not valid JSON"),
    ],
)
def test_bad_model_config_is_one_line_naming_the_file(tmp_path, capfd, content, match):
    path = tmp_path / "config.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    assert main(["--config", write_config(tmp_path, model=str(path), model_configs={})]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(path) in err[0] and match in err[0], err
    assert not os.listdir(tmp_path / "cache") if (tmp_path / "cache").exists() else True


@pytest.mark.slow
def test_model_context_length_bounds_requests_and_flag_lowers_it(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**GOOD, "max_position_embeddings": 300}))
    tpl = {"t": {"context_tokens": [1000, 1000], "generate_tokens": [1, 1], "think_time_s": [0, 0]}}
    doc = run(
        tmp_path,
        model=str(path),
        model_configs={},
        user_templates=tpl,
        duration=1,
        num_users=1,
        disable_prefix_caching=True,
    )
    assert doc["workload"]["max_context_tokens"] == 300
    assert doc["summary"]["prompt_tokens"] == 300 * doc["summary"]["total_requests"] > 0
    assert (
        main(["--config", write_config(tmp_path, model=str(path), model_configs={}), "--max-context-tokens", "400"])
        == 2
    )


@pytest.mark.parametrize(
    "content, match",
    [
        (b"\x00\x01\x02\xff\xfe garbage\n1,2,3\n", "t.csv:1: not UTF-8"),
        ("\ufeffTimestamp,Model\n1,x\n".encode(), "missing column(s) Request tokens"),
    ],
)
def test_bad_trace_file_is_one_line(tmp_path, capfd, content, match):
    (tmp_path / "t.csv").write_bytes(content)
    cfg = write_config(tmp_path, use_burst_trace=True, burst_trace_path=str(tmp_path / "t.csv"))
    assert main(["--config", cfg]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and match in err[0], err
