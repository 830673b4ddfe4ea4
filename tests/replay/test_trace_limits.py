"""Every limit a user sets applies in the trace modes (replay, bench and plan reading a block-hash trace), or the mode
refuses it; what a trace mode does before its first request is bounded and stops on SIGINT/SIGTERM."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from bench_helpers import write_config
from helpers import wait_for

from replay.cli import main as kvtier
from replay.sources.block_traces import FORMATS, MAX_BLOCK_TOKENS, UNTIMED_FORMATS, LoadStopped, load_block_trace

DATA = Path(__file__).parent / "data"
FIXTURES = {
    "mooncake": DATA / "mooncake" / "conversation_trace_head300.jsonl",
    "bailian": DATA / "bailian" / "bailian_format_example.jsonl",
    "weka": DATA / "weka",
    "azure": DATA / "azure" / "AzureLLMInferenceTrace_conv_head300.csv",
    "aiperf-mooncake": DATA / "aiperf_mooncake" / "sessions_handmade.jsonl",
    "servegen": DATA / "servegen" / "trace_a_handmade.jsonl",
}
ROOT = Path(__file__).resolve().parents[2]


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def mooncake_rows(path: Path, rows: int, *, input_tokens=2048, ids=4, step_ms=10, first_input=None) -> Path:
    with path.open("w") as f:
        for i in range(rows):
            n = first_input if (first_input is not None and i == 0) else input_tokens
            hashes = list(range(i * ids, i * ids + min(ids, -(-n // 512))))
            f.write(json.dumps({"timestamp": i * step_ms, "input_length": n, "output_length": 4, "hash_ids": hashes}))
            f.write("\n")
    return path


# ---- the loader: one place every driver's bounds go through ----
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("limit", [1, 36, 60])
def test_every_format_cuts_its_rows_to_the_context_bound_and_counts_them(fmt, limit):
    whole = load_block_trace(FIXTURES[fmt], fmt, block_tokens=16)
    cut = load_block_trace(FIXTURES[fmt], fmt, block_tokens=16, max_context_tokens=limit)
    over = sum(1 for r in whole.requests if r.input_tokens + r.output_tokens > limit)
    assert over > 0  # the fixtures have rows over every limit tried
    assert cut.report.truncated == {"over_max_context_tokens": over}
    for a, b in zip(whole.requests, cut.requests, strict=True):
        assert b.input_tokens + b.output_tokens <= limit
        assert b.input_tokens == min(a.input_tokens, limit)
        assert len(b.hash_ids) <= math.ceil(b.input_tokens / 16)
        assert b.hash_ids == a.hash_ids[: len(b.hash_ids)]  # the prefix is the trace's, cut short


@pytest.mark.parametrize("huge", ["1e15", "1000000000000000", "9.9e18", "123456789012345678901234567890"])
def test_an_absurd_row_is_cut_not_carried(tmp_path, huge):
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]}\n'
        f'{{"timestamp": 5, "input_length": {huge}, "output_length": {huge}, "hash_ids": [1, 2, 3]}}\n'
    )
    for block in (None, 16, MAX_BLOCK_TOKENS):
        trace = load_block_trace(path, block_tokens=block, max_context_tokens=4096)
        assert [r.input_tokens + r.output_tokens <= 4096 for r in trace.requests] == [True, True]
        assert trace.report.truncated["over_max_context_tokens"] >= 1


def test_a_window_stops_the_read_at_its_first_late_row(tmp_path):
    path = mooncake_rows(tmp_path / "t.jsonl", 1000, step_ms=1000)  # a row a second
    assert len(load_block_trace(path, until_s=10).requests) == 10
    assert len(load_block_trace(path, until_s=0.5).requests) == 1
    assert len(load_block_trace(path, until_s=1e9).requests) == 1000


def test_block_uses_past_the_bound_are_refused_as_they_are_read(tmp_path):
    path = mooncake_rows(tmp_path / "t.jsonl", 100, ids=4)  # 4 whole blocks a row
    assert len(load_block_trace(path, max_block_uses=400).requests) == 100
    with pytest.raises(Exception, match=r"more than 399 block uses by its request 100,.*--max-requests"):
        load_block_trace(path, max_block_uses=399)
    with pytest.raises(Exception, match="more than 10 block uses by its request 3,"):
        load_block_trace(path, max_block_uses=10)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_a_stop_asked_for_abandons_the_load(fmt):
    with pytest.raises(LoadStopped):
        load_block_trace(FIXTURES[fmt], fmt, should_stop=lambda: True)
    assert load_block_trace(FIXTURES[fmt], fmt, should_stop=lambda: False).requests


# ---- values out of range and options not read: one line, exit 2, in every mode ----
REPLAY = ["replay", "--base-url", "http://127.0.0.1:1", "--model", "m", "--quiet"]


def _trace(fmt="mooncake") -> list[str]:
    return ["--source", fmt, "--dataset-path", str(FIXTURES[fmt])]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--trace-block-tokens", str(2**63)], "--trace-block-tokens"),
        (["--trace-block-tokens", str(2**64 + 5)], "--trace-block-tokens"),
        (["--trace-block-tokens", "100000000"], "--trace-block-tokens"),
        (["--trace-block-tokens", str(MAX_BLOCK_TOKENS + 1)], "--trace-block-tokens"),
        (["--trace-block-tokens", "0"], "--trace-block-tokens"),
        (["--trace-speedup", "1e-300"], "--trace-speedup"),
        (["--trace-speedup", "5e-324"], "--trace-speedup"),
        (["--trace-speedup", "0.0009"], "--trace-speedup"),
        (["--trace-speedup", "0"], "--trace-speedup"),
        (["--input-len", "5"], "--input-len is not read by --source mooncake"),
        (["--range-ratio", "0.5"], "--range-ratio is not read by --source mooncake"),
        (["--prefix-len", "5"], "--prefix-len is not read by --source mooncake"),
        (["--prefix-groups", "3"], "--prefix-groups is not read by --source mooncake"),
        (["--turns", "3"], "--turns is not read by --source mooncake"),
        (["--output-len", "7"], "--output-len is not read by --source mooncake"),
    ],
)
@pytest.mark.parametrize("fmt", ["mooncake", "azure"])
def test_replay_refuses_a_trace_value_out_of_range_or_not_read(tmp_path, capsys, argv, says, fmt):
    out = tmp_path / "r.json"
    assert kvtier([*REPLAY, *_trace(fmt), "--output", str(out), *argv]) == 2
    line = one_line(capsys)
    assert line.startswith("kvtier replay: ") and says.replace("mooncake", fmt) in line
    assert "Traceback" not in line and not out.exists()


@pytest.mark.parametrize(
    ("source", "argv", "says"),
    [
        (["--source", "sharegpt", "--dataset-path", "x.json"], ["--trace-speedup", "2"], "--trace-speedup is not"),
        (["--source", "sharegpt", "--dataset-path", "x.json"], ["--input-len", "9"], "--input-len is not read"),
        (["--source", "burstgpt", "--trace-path", "x.csv"], ["--prefix-len", "9"], "--prefix-len is not read"),
        (["--source", "synthetic"], ["--trace-speedup", "3"], "--trace-speedup is not read by --source synthetic"),
        (["--source", "synthetic"], ["--trace-speedup", "1e-300"], "--trace-speedup"),
    ],
)
def test_replay_refuses_options_its_other_sources_do_not_read(tmp_path, capsys, source, argv, says):
    assert kvtier([*REPLAY, *source, "--output", str(tmp_path / "r.json"), *argv]) == 2
    assert says in one_line(capsys)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--replay-cycles", "2"], "--replay-cycles is not read by --source mooncake"),
        (["--max-conversations", "5"], "--max-conversations is not read by --source mooncake"),
        (["--burst-trace-path", "x.csv"], "--burst-trace-path is not read by --source mooncake"),
        (["--trace-block-tokens", str(2**63)], "--trace-block-tokens"),
        (["--trace-block-tokens", "100000000"], "--trace-block-tokens"),
        (["--trace-speedup", "1e-300"], "--trace-speedup 1e-300: 0 (no delay) or at least 0.001"),
        (["--trace-speedup", "-1"], "--trace-speedup"),
    ],
)
def test_bench_refuses_a_trace_value_out_of_range_or_not_read(tmp_path, capsys, argv, says):
    cfg = write_config(tmp_path)
    assert kvtier(["bench", "--config", cfg, *_trace(), *argv]) == 2
    assert says in one_line(capsys)
    assert not (tmp_path / "out.json").exists()


def test_bench_refuses_a_trace_block_without_a_trace(tmp_path, capsys):
    assert kvtier(["bench", "--config", write_config(tmp_path), "--trace-block-tokens", "16"]) == 2
    assert "--trace-block-tokens rescales a block-hash trace: give --source" in one_line(capsys)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--trace-block-tokens", str(2**63)], "--trace-block-tokens"),
        (["--trace-block-tokens", str(MAX_BLOCK_TOKENS * 2)], "--trace-block-tokens"),
        (["--kv-dtype", "fp8"], "--kv-dtype fp8 is read with --model M only"),
    ],
)
def test_plan_refuses_a_trace_value_out_of_range_or_not_read(tmp_path, capsys, argv, says):
    out = tmp_path / "p.json"
    assert kvtier(["plan", "--trace", str(FIXTURES["mooncake"]), "--output", str(out), *argv]) == 2
    assert says in one_line(capsys)
    assert not out.exists()


def test_plan_refuses_traces_too_large_to_model_before_reading_them(tmp_path, capsys):
    big = tmp_path / "big.jsonl"
    with big.open("wb") as f:  # sparse: 300 MiB of nothing, never read
        f.truncate(300 << 20)
    out = tmp_path / "p.json"
    t0 = time.monotonic()
    assert kvtier(["plan", "--trace", str(big), "--output", str(out)]) == 2
    line = one_line(capsys)
    assert "315 MB of traces, over the 256 MiB" in line and "--max-requests N" in line
    assert time.monotonic() - t0 < 1.0 and not out.exists()
    # with several traces the bound is on all of them together
    half = tmp_path / "half.jsonl"
    with half.open("wb") as f:
        f.truncate(150 << 20)
    assert kvtier(["plan", "--trace", str(half), "--trace", str(half), "--output", str(out)]) == 2
    assert "over the 256 MiB" in one_line(capsys)


def _sparse(path: Path, mib: int) -> Path:
    with path.open("wb") as f:  # nothing on disk, never read
        f.truncate(mib << 20)
    return path


@pytest.mark.parametrize(
    ("driver", "flag"),
    [
        (["bench", "--duration", "1", "--trace-speedup", "0"], "--max-requests"),
        ([*REPLAY, "--max-concurrency", "1"], "--num-requests"),
    ],
    ids=["bench", "replay"],
)
def test_every_driver_refuses_a_trace_too_large_before_reading_it_and_names_its_own_bound(
    tmp_path, capsys, driver, flag
):
    big = _sparse(tmp_path / "big.jsonl", 300)
    out = tmp_path / "r.json"
    t0 = time.monotonic()
    assert kvtier([*driver, "--source", "mooncake", "--dataset-path", str(big), "--output", str(out)]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]  # replay may say first that /tokenize is not there
    assert "315 MB of traces, over the 256 MiB" in line and f"give {flag} N" in line, line
    assert time.monotonic() - t0 < 5.0 and not out.exists()
    # the driver's bound lifts the refusal: the file is read (and this one, all zeros, is then refused as malformed)
    assert kvtier([*driver, "--source", "mooncake", "--dataset-path", str(big), "--output", str(out), flag, "5"]) == 2
    assert "MB of traces" not in capsys.readouterr().err


def test_the_block_use_bound_names_the_drivers_flag(tmp_path):
    path = mooncake_rows(tmp_path / "t.jsonl", 10, ids=4)
    with pytest.raises(Exception, match=r"more than 10 block uses by its request 3,.*give --num-requests N"):
        load_block_trace(path, max_block_uses=10, limit_flag="--num-requests")


# ---- the limits applied, end to end ----
@pytest.mark.slow
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_replay_sends_no_prompt_over_max_prompt_tokens(tmp_path, fmt):
    from replay.openai.fake_server import FakeServer, FakeServerConfig

    limit = 100
    with FakeServer(FakeServerConfig(block_size=16)) as srv:
        out = tmp_path / "r.json"
        rc = kvtier([
            *REPLAY[:2], srv.base_url, "--model", "fake", "--endpoint", "completions", "--quiet", *_trace(fmt),
            "--num-requests", "40", *(["--users", "2"] if fmt in UNTIMED_FORMATS else ["--trace-speedup", "1000000"]),
            "--max-tokens", "1",
            "--max-prompt-tokens", str(limit), "--output", str(out),
        ])  # fmt: skip
        bodies = srv.recent_bodies
    assert rc == 0
    doc = json.loads(out.read_text())
    whole = load_block_trace(FIXTURES[fmt], fmt, max_requests=40)
    over = sum(1 for r in whole.requests if r.input_tokens + r.output_tokens > limit)
    assert over > 0
    assert doc["load_report"]["truncated"] == {"over_max_context_tokens": over}
    assert doc["load_report"]["max_prompt_tokens"] == limit
    prompts = [b["prompt"].removeprefix("User: ").removesuffix("\nAssistant:") for b in bodies]
    assert prompts and max(len(p.split()) for p in prompts) <= limit  # the fake tokenizer counts words


@pytest.mark.slow
def test_bench_applies_max_context_tokens_to_a_trace(tmp_path):
    trace = mooncake_rows(tmp_path / "t.jsonl", 20, first_input=10**15)
    cfg = write_config(tmp_path, duration=30, cpu_mem_gb=0.5)
    argv = ["bench", "--config", cfg, "--source", "mooncake", "--dataset-path", str(trace), "--trace-speedup", "0"]
    assert kvtier([*argv, "--max-context-tokens", "4096"]) == 0
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["workload"]["load_report"]["truncated"] == {"over_max_context_tokens": 1}
    assert doc["workload"]["max_context_tokens"] == 4096
    assert doc["trace"]["requests"] == 20 and doc["trace"]["prompt_tokens"] == 4096 + 19 * 2048
    # without the flag the model's context length bounds the row (the small model of the tests has none: the tiers')
    assert doc["summary"]["prompt_tokens"] < 10**6


@pytest.mark.slow
def test_bench_without_delays_starts_the_trace_at_once(tmp_path):
    trace = mooncake_rows(tmp_path / "t.jsonl", 74_000, input_tokens=64, ids=1)
    cfg = write_config(tmp_path, duration=3, cpu_mem_gb=0.5)
    argv = ["bench", "--config", cfg, "--source", "mooncake", "--dataset-path", str(trace), "--trace-speedup", "0"]
    assert kvtier([*argv, "--trace-block-tokens", "16"]) == 0
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["trace"]["requests"] > 100, doc["trace"]
    assert doc["summary"]["window"]["overrun_s"] < 2.0, doc["summary"]["window"]


# ---- signals during the preparation: 130 / 143 within seconds ----
def _spawn(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "replay.cli", *argv],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _reading(proc: subprocess.Popen, trace: Path) -> bool:
    """The process holds the trace open and has read into it: the signal then lands in the preparation."""
    assert proc.poll() is None, proc.communicate()[1]  # still running
    fds = Path(f"/proc/{proc.pid}/fd")
    for fd in fds.iterdir() if fds.exists() else ():
        try:
            if os.readlink(fd) == str(trace):
                pos = (Path(f"/proc/{proc.pid}/fdinfo") / fd.name).read_text().split()[1]
                return int(pos) > 0
        except OSError:  # the fd closed meanwhile
            continue
    return False


def _stop_while_reading(proc: subprocess.Popen, sig: int, trace: Path) -> tuple[int, float, str]:
    # an event, not a delay: on a loaded machine the interpreter's start-up alone can take seconds
    wait_for(lambda: _reading(proc, trace), timeout_s=60, interval_s=0.02, what="the trace being read")
    proc.send_signal(sig)
    t0 = time.monotonic()
    _, err = proc.communicate(timeout=15)
    return proc.returncode, time.monotonic() - t0, err


@pytest.fixture(scope="module")
def big_trace(tmp_path_factory) -> Path:
    # about 40 MB: several seconds to read here, and more on a loaded machine
    return mooncake_rows(tmp_path_factory.mktemp("big") / "big.jsonl", 160_000, input_tokens=60 * 512, ids=60)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_replay_stops_on_a_signal_while_it_reads_a_trace(tmp_path, big_trace, sig):
    from replay.openai.fake_server import FakeServer

    with FakeServer() as srv:
        out = tmp_path / "r.json"
        argv = [*REPLAY[:1], "--base-url", srv.base_url, "--model", "m", "--quiet", "--endpoint", "completions"]
        proc = _spawn([*argv, "--source", "mooncake", "--dataset-path", str(big_trace), "--output", str(out)])
        rc, took, err = _stop_while_reading(proc, sig, big_trace)
    assert rc == 128 + sig, err
    assert took < 5.0, took
    assert "Traceback" not in err
    doc = json.loads(out.read_text())  # the run had begun (its /tokenize probe): its results say it was cut short
    assert doc["aborted"].startswith("interrupted") and doc["completed"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_plan_stops_on_a_signal_while_it_reads_a_trace(tmp_path, big_trace, sig):
    out = tmp_path / "p.json"
    proc = _spawn(["plan", "--trace", str(big_trace), "--tier", "a=1e5", "--output", str(out), "--quiet"])
    rc, took, err = _stop_while_reading(proc, sig, big_trace)
    assert rc == 128 + sig, err
    assert took < 5.0 and "AttributeError" not in err and "internal error" not in err, err
    assert json.loads(out.read_text())["status"] == "interrupted"


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_bench_stops_on_a_signal_while_it_reads_a_trace(tmp_path, big_trace, sig):
    cfg = write_config(tmp_path, duration=60, cpu_mem_gb=0.5)
    argv = ["bench", "--config", cfg, "--source", "mooncake", "--dataset-path", str(big_trace), "--trace-speedup", "0"]
    proc = _spawn(argv)
    rc, took, err = _stop_while_reading(proc, sig, big_trace)
    assert rc == 128 + sig, err
    assert took < 5.0 and "Traceback" not in err and "internal error" not in err, err
    assert not os.path.exists(tmp_path / "cache") or not any((tmp_path / "cache").rglob("trace*"))
