"""`kvtier bench --source mooncake --dataset-path FILE`: a block-hash trace replayed block by block on the real tiered
store, its measured per-tier hit rates beside kvtier plan's prediction for the same tiers. The committed Mooncake
sample, its 512-token blocks scaled to 16 tokens (2,048 B/token: 32 KiB a block) so a run takes seconds."""

import json
from pathlib import Path

import pytest
from bench_helpers import write_config

from replay.plan.trace import reuse_profile
from replay.sources.block_traces import load_block_trace
from replay.synthetic.cli import main
from replay.synthetic.config import BenchConfig

SAMPLE = Path(__file__).parent / "data" / "mooncake" / "conversation_trace_head300.jsonl"
REQUESTS = 150
NO_ROOM_BELOW_GB = 0.000001  # a disk tier smaller than one block: no tier below the CPU


def trace_run(tmp_path, *flags, **overrides) -> dict:
    path = write_config(tmp_path, duration=120, **overrides)
    argv = ["--config", path, "--source", "mooncake", "--dataset-path", str(SAMPLE), "--trace-block-tokens", "16"]
    assert main([*argv, "--trace-speedup", "0", "--max-requests", str(REQUESTS), *flags]) == 0
    return json.loads((tmp_path / "out.json").read_text())


def plan(capacities_tokens: list[int]) -> list[float]:
    """What `kvtier plan --trace` predicts, computed here from the trace alone."""
    trace = load_block_trace(SAMPLE, "mooncake", block_tokens=16, max_requests=REQUESTS)
    return reuse_profile(trace).tier_hit_rates(capacities_tokens)


@pytest.mark.slow
def test_two_tiers_measured_against_the_plan(tmp_path):
    doc = trace_run(tmp_path, cpu_mem_gb=0.02, storage_capacity_gb=0.2)
    t = doc["trace"]
    assert t["requests"] == REQUESTS
    cpu, disk = t["tiers"]
    # the tiers at their target usage, in whole 16-token blocks of 32 KiB
    ratio = BenchConfig().eviction.target_usage_ratio
    assert cpu["capacity_tokens"] == int(ratio * 0.02e9) // 32768 * 16
    assert [cpu["predicted_hit_rate"], disk["predicted_hit_rate"]] == pytest.approx(
        plan([cpu["capacity_tokens"], disk["capacity_tokens"]]), abs=1e-6
    )
    # the disk tier serves what the CPU tier lost; measured agree with the plan within 2 points per tier
    assert disk["hit_rate"] > 0.005, t
    for row in t["tiers"]:
        assert row["hit_rate"] == pytest.approx(row["predicted_hit_rate"], abs=0.02), row
    assert t["hit_rate"] == pytest.approx(t["predicted_hit_rate"], abs=0.02)
    # the same trace without the disk tier finds less
    (tmp_path / "alone").mkdir()
    alone = trace_run(tmp_path / "alone", cpu_mem_gb=0.02, storage_capacity_gb=NO_ROOM_BELOW_GB)["trace"]
    assert alone["hit_rate"] < t["hit_rate"] - 0.005, (alone, t)


@pytest.mark.slow
def test_one_unbounded_tier_measures_exactly_the_plan(tmp_path):
    t = trace_run(tmp_path, cpu_mem_gb=1, storage_capacity_gb=NO_ROOM_BELOW_GB)["trace"]
    trace = load_block_trace(SAMPLE, "mooncake", block_tokens=16, max_requests=REQUESTS)
    best = reuse_profile(trace).max_hit_rate  # every block seen before hits
    assert best > 0.02
    assert t["hit_rate"] == t["predicted_hit_rate"] == pytest.approx(best, abs=1e-6)
    assert t["tiers"][0]["hit_rate"] == t["tiers"][0]["predicted_hit_rate"]
    assert t["prompt_tokens"] == sum(r.input_tokens for r in trace.requests)


def bad(tmp_path, capsys, *flags, **overrides) -> str:
    path = write_config(tmp_path, **overrides)
    assert main(["--config", path, *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kvtier bench: "), err
    assert not (tmp_path / "out.json").exists()
    return err[0]


def test_bad_input_is_one_line_and_nothing_written(tmp_path, capsys):
    assert "--dataset-path" in bad(tmp_path, capsys, "--source", "mooncake")
    assert "--source nope" in bad(tmp_path, capsys, "--source", "nope", "--dataset-path", str(SAMPLE))
    missing = tmp_path / "missing.jsonl"
    assert str(missing) in bad(tmp_path, capsys, "--source", "mooncake", "--dataset-path", str(missing))
    rows = tmp_path / "bad.jsonl"
    rows.write_text(SAMPLE.read_text().splitlines()[0] + "\n" + '{"timestamp": 1, "input_length": "x"}\n')
    assert f"{rows}:2" in bad(tmp_path, capsys, "--source", "mooncake", "--dataset-path", str(rows))


@pytest.mark.parametrize(
    "flag", [["--enable-rag"], ["--prefix-model", "chained"], ["--decode-only"], ["--request-rate", "5"]]
)
def test_other_modes_are_refused(tmp_path, capsys, flag):
    line = bad(tmp_path, capsys, "--source", "mooncake", "--dataset-path", str(SAMPLE), *flag)
    assert flag[0] in line


@pytest.mark.slow
def test_a_trace_of_zero_token_prompts_is_run_and_its_results_written(tmp_path):
    # every prompt 0 tokens: no hit rate to measure or predict (None), and the results are still written
    zero = tmp_path / "zero.jsonl"
    zero.write_text(
        "".join(f'{{"timestamp": {i}, "input_length": 0, "output_length": 3, "hash_ids": []}}\n' for i in range(5))
    )
    path = write_config(tmp_path, duration=60)
    assert main(["--config", path, "--source", "mooncake", "--dataset-path", str(zero), "--trace-speedup", "0"]) == 0
    doc = json.loads((tmp_path / "out.json").read_text())
    t = doc["trace"]
    assert t["requests"] == 5 and t["prompt_tokens"] == 0
    assert t["hit_rate"] is None and t["predicted_hit_rate"] is None
    assert all(row["hit_rate"] is None and row["predicted_hit_rate"] is None for row in t["tiers"])


@pytest.mark.parametrize(
    "flags, needle",
    [
        (["--trace-timing", "think"], "--trace-timing paces a block-hash trace: give --source"),
        (["--max-idle-s", "5"], "--max-idle-s paces a block-hash trace: give --source"),
        (["--source", "mooncake", "--dataset-path", str(SAMPLE), "--max-idle-s", "5"], "caps the pauses of --trace"),
        (["--source", "mooncake", "--dataset-path", str(SAMPLE), "--trace-timing", "think"], "mooncake trace has none"),
        (
            ["--source", "mooncake", "--dataset-path", str(SAMPLE), "--trace-timing", "think", "--max-idle-s", "0"],
            "max",
        ),
    ],
)
def test_trace_timing_mistakes_are_one_line(tmp_path, capsys, flags, needle):
    assert needle in bad(tmp_path, capsys, *flags)
