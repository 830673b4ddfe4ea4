"""`kvtier bench` accepts every flag of the MLPerf KV Cache reference implementation with its meaning: the reference's
list (tests/replay/data/mlperf_reference_flags.txt, made from its argparse at a56caea) against kvtier's parser; the
defaults of the shared flags; --num-gpus, --tensor-parallel, --validation-trace; and --io-trace-log as the
reference's trace-only mode (the same operations as a real run, none of them done)."""

import ast
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from replay.common.leftovers import KEPT_NAME
from replay.outputs.io_trace import MLPERF_COLUMNS
from replay.synthetic.cli import build_parser, config_from_args, main
from replay.synthetic.config import REFERENCE_BURST_TRACE_PATH, BenchConfig

FLAGS_FILE = Path(__file__).parent / "data" / "mlperf_reference_flags.txt"
KVTIER = [sys.executable, "-m", "replay.cli", "bench"]
SAMPLE = {"int": "1", "float": "0.5", "str": "x"}

# Shared flags whose default differs from the reference's, on purpose (replay/synthetic/README.md, "Flags and defaults
# of the MLPerf reference"). Every other shared flag defaults as there; a new difference fails the test below.
DIFFERENT_DEFAULTS = {
    "--model": "tiny-1b: a bare `kvtier bench` is a quick look on any machine (the spec's commands name the model)",
    "--gpu-mem-gb": "16 with CUDA, 0 without: a GPU tier kvtier cannot allocate is an error, not a silent skip",
    "--cpu-mem-gb": "4: kvtier's CPU tier holds real memory (the spec's commands give 0, 4, 16 or 32)",
    "--generation-mode": "none: a bare run measures the store, not simulated GPU time (the spec's commands name it)",
    "--log-level": "WARNING: kvtier's own view (live line, tables) replaces the reference's INFO log lines",
    "--output": "results/<UTC time>.json, never reused, where the reference writes benchmark_results_<time>.json",
}


def reference_flags() -> list[dict]:
    rows = []
    for line in FLAGS_FILE.read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        flag, kind, type_, choices, default = (part.strip() for part in line.split("|"))
        rows.append(
            {
                "flag": flag,
                "switch": kind == "switch",
                "type": type_,
                "choices": [] if choices == "-" else choices.split(","),
                "default": default,
            }
        )
    return rows


def test_the_fixture_is_the_references_list():
    rows = reference_flags()
    assert len(rows) == 40 and len({r["flag"] for r in rows}) == 40
    assert {"--num-gpus", "--tensor-parallel", "--validation-trace", "--io-trace-log"} <= {r["flag"] for r in rows}


@pytest.mark.parametrize("ref", reference_flags(), ids=lambda r: r["flag"])
def test_every_reference_flag_parses_into_the_config(ref, tmp_path):
    values = ref["choices"] or ([] if ref["switch"] else [SAMPLE[ref["type"]]])
    for value in values or [None]:
        argv = [ref["flag"]] if value is None else [ref["flag"], value]
        if ref["flag"] == "--config":
            argv = ["--config", str(Path(__file__).parent / "data" / "mlperf_reference_config.yaml")]
        args = build_parser().parse_args(argv)  # argparse exits 2 on a flag or choice it does not know
        if ref["flag"] != "--log-level":  # an option of the invocation, not of the run
            cfg = config_from_args(args)
            dest = ref["flag"][2:].replace("-", "_")
            if dest != "config":
                assert getattr(cfg, dest) == (True if value is None else type(getattr(cfg, dest))(value))


def kvtier_default(flag: str):
    dest = flag[2:].replace("-", "_")
    if flag == "--log-level":
        return build_parser().parse_args([]).log_level
    if flag == "--burst-trace-path":  # used when --use-burst-trace is given without a path
        return BenchConfig(use_burst_trace=True).burst_trace_path
    if dest not in BenchConfig.model_fields:
        return "<not a config key>"
    return BenchConfig.model_fields[dest].get_default(call_default_factory=True)


def test_shared_flags_default_as_in_the_reference_except_the_listed_ones():
    differ = {}
    for ref in reference_flags():
        if ref["flag"] == "--config" or ref["default"] == "-":
            continue
        theirs = ast.literal_eval(ref["default"])
        ours = kvtier_default(ref["flag"])
        if ours != theirs:
            differ[ref["flag"]] = (theirs, ours)
    assert set(differ) | {"--output"} == set(DIFFERENT_DEFAULTS), differ
    assert kvtier_default("--burst-trace-path") == REFERENCE_BURST_TRACE_PATH
    # The reference's units and requests by default: GiB for every size flag, its request model.
    assert BenchConfig().size_unit == "GiB" and BenchConfig().request_model == "reference"
    # In the trace-only mode no tier holds memory: the reference's tier sizes by default, a given size wins.
    traced = BenchConfig(io_trace_log="t.csv")
    assert (traced.gpu_mem_gb, traced.cpu_mem_gb) == (16, 32)
    assert BenchConfig(io_trace_log="t.csv", cpu_mem_gb=0, gpu_mem_gb=1).cpu_mem_gb == 0


@pytest.mark.parametrize(
    "flags,needle",
    [
        (["--num-gpus", "2", "--tensor-parallel", "4"], "--tensor-parallel 4 exceeds --num-gpus 2"),
        (["--tensor-parallel", "0"], "--tensor-parallel"),
        (["--num-gpus", "0"], "--num-gpus"),
        (["--validation-trace", "{d}/nothere.json"], "--validation-trace"),
        (["--validation-trace", "{d}/bad.json"], "record 0 lacks cache_hit"),
        (["--io-trace-log", "{d}/ops.csv", "--io-op-log", "{d}/ops.csv"], "give each output its own file"),
        (["--io-trace-log", "{d}/t.csv", "--enable-latency-tracing"], "--io-trace-log runs without any"),
    ],
)
@pytest.mark.slow
def test_bad_values_are_one_line_and_exit_2(flags, needle, tmp_path):
    (tmp_path / "bad.json").write_text(json.dumps([{"context_tokens": 1}]))
    flags = [f.format(d=tmp_path) for f in flags]
    out = tmp_path / "r.json"
    base = ["--duration", "1", "--no-progress", "--cache-dir", str(tmp_path / "c"), "--output", str(out)]
    p = subprocess.run(KVTIER + base + flags, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert needle in p.stderr and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert not out.exists()


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    # 4 layers x 2 x 2 heads x 64 x 2 bytes = 2 KiB per token.
    path = tmp_path_factory.mktemp("model") / "config.json"
    path.write_text(
        json.dumps({"num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 2, "hidden_size": 128})
    )
    return str(path)


def bench(tmp_path, name, model, *flags):
    out = tmp_path / f"{name}.json"
    argv = ["--model", model, "--num-users", "1", "--max-requests", "10", "--duration", "60", "--seed", "5"]
    argv += ["--gpu-mem-gb", "0", "--cpu-mem-gb", "0.02", "--storage-capacity-gb", "0.2", "--no-progress"]
    argv += ["--cache-dir", str(tmp_path / name), "--output", str(out), *flags]
    assert main(argv) == 0
    return json.loads(out.read_text())


TIERS = {"gpu": "Tier-0", "cpu": "Tier-1", "disk": "Tier-2"}


@pytest.mark.slow
def test_trace_only_logs_the_real_runs_operations_and_does_none(tmp_path, small_model):
    # One user and a request limit: the operation stream depends on the seed only, so a real run and a trace-only
    # run of the same command must log the same operations in the same order.
    real = bench(tmp_path, "real", small_model, "--io-op-log", str(tmp_path / "real.csv"))
    trace = bench(tmp_path, "trace", small_model, "--keep-cache", "--io-trace-log", str(tmp_path / "trace.csv"))
    real_ops = [
        (r["op"], TIERS[r["tier"]], r["key"], int(r["bytes"]))
        for r in csv.DictReader(open(tmp_path / "real.csv"))
        if r["op"] != "evict"  # a deletion: the reference's trace has no row for it
    ]
    with open(tmp_path / "trace.csv") as f:
        assert next(csv.reader(f)) == list(MLPERF_COLUMNS)
    rows = list(csv.DictReader(open(tmp_path / "trace.csv")))
    trace_ops = [(r["Operation"].lower(), r["Tier"], r["Key"], int(r["Object_Size_Bytes"])) for r in rows]
    assert trace_ops == real_ops and len(real_ops) > 20
    assert {"Tier-1", "Tier-2"} <= {r["Tier"] for r in rows}
    # the reference's phases: Prefill writes, Decode reads, Evict for both rows of a demotion
    demoted = [r for r in rows if r["Phase"] == "Evict"]
    assert demoted and {r["Operation"] for r in demoted} <= {"Read", "Write"}
    assert {r["Phase"] for r in rows if r["Operation"] == "Write"} <= {"Prefill", "Evict"}
    assert {r["Phase"] for r in rows if r["Operation"] == "Read"} <= {"Decode", "Evict"}
    # timestamps are Unix times, in order within a run of one user
    stamps = [float(r["Timestamp"]) for r in rows]
    assert stamps == sorted(stamps) and abs(stamps[0] - trace["summary"]["window"]["start_unix_s"]) < 60
    # the same requests, the same tier decisions, and no device I/O: no entry file, zero device time
    assert trace["summary"]["total_requests"] == real["summary"]["total_requests"] == 10
    for name in ("cpu", "disk"):
        for op in ("read", "write"):
            assert trace["tiers"][name][op]["bytes"] == real["tiers"][name][op]["bytes"]
    assert real["tiers"]["disk"]["write"]["device_ms"]["p50"] > 0 == trace["tiers"]["disk"]["write"]["device_ms"]["max"]
    assert [f for _, _, files in os.walk(tmp_path / "trace") for f in files if f != KEPT_NAME] == []  # the keep mark
    assert trace["trace_only"] is True and real["trace_only"] is False
    assert any("trace-only mode" in n for n in trace["notes"])


@pytest.mark.slow
def test_num_gpus_and_tensor_parallel_in_the_trace(tmp_path, small_model):
    # 8 x 0.01 GiB of GPU tier, TP 4: every entry is a quarter of the model's 2,048 B/token. No CUDA needed: the
    # trace-only mode's tiers are no-ops of their sizes.
    doc = bench(
        tmp_path,
        "tp",
        small_model,
        *("--num-gpus", "8", "--gpu-mem-gb", "0.01", "--tensor-parallel", "4", "--size-unit", "GiB"),
        *("--io-trace-log", str(tmp_path / "tp.csv")),
    )
    assert doc["tiers"]["gpu"]["capacity_bytes"] == 8 * int(0.01 * 2**30)
    assert doc["model"]["bytes_per_token"] == 512 and doc["model"]["full_bytes_per_token"] == 2048
    rows = list(csv.DictReader(open(tmp_path / "tp.csv")))
    assert any(r["Tier"] == "Tier-0" for r in rows)
    assert all(int(r["Object_Size_Bytes"]) % 512 == 0 for r in rows)


def test_validation_compares_the_any_tier_hit_rate_within_5_percent(tmp_path):
    from replay.synthetic.validation_trace import load_validation_trace, validate_run

    rec = {"context_tokens": 1000, "generation_tokens": 100, "read_bytes": 30, "write_bytes": 10}
    path = tmp_path / "t.json"
    path.write_text(json.dumps([{**rec, "cache_hit": i < 3} for i in range(4)]))  # 3 of 4 hit
    stats = load_validation_trace(str(path))
    assert stats["cache_hit_rate"] == 0.75 and stats["read_write_ratio"] == 3.0 and stats["total_requests"] == 4

    def verdict(store_hit_rate, spec_hit_rate=0.0):
        summary = {"cache_stats": {"store_hit_rate": store_hit_rate, "cache_hit_rate": spec_hit_rate}}
        return validate_run(stats, summary)

    assert verdict(0.76)["passed"] and verdict(0.76)["comparison"]["cache_hit_rate"]["error_pct"] == 1.333
    assert not verdict(0.70)["passed"]  # 6.7% off
    assert not verdict(0.0, spec_hit_rate=0.75)["passed"]  # the reference's quantity: any tier, not the fast tiers
    path.write_text(json.dumps([{**rec, "cache_hit": False}]))
    none_hit = load_validation_trace(str(path))
    assert validate_run(none_hit, {"cache_stats": {"store_hit_rate": 0.0}})["passed"]
    assert not validate_run(none_hit, {"cache_stats": {"store_hit_rate": 0.1}})["passed"]


@pytest.mark.slow
def test_merged_results_keep_the_semantics_and_the_validation(tmp_path, small_model):
    from replay.synthetic.merge import main as merge_main

    rec = {"context_tokens": 1000, "generation_tokens": 100, "read_bytes": 1, "write_bytes": 1}
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps([{**rec, "cache_hit": True}, {**rec, "cache_hit": False}]))
    files = []
    for seed in ("5", "6"):  # two trace-only runs (quick: no device I/O), as two clients of one job write them
        log = str(tmp_path / f"s{seed}.csv")
        doc = bench(
            tmp_path, f"s{seed}", small_model, "--seed", seed, "--validation-trace", str(trace), "--io-trace-log", log
        )
        assert doc["validation"]["trace_stats"]["cache_hit_rate"] == 0.5
        files.append(str(tmp_path / f"s{seed}.json"))
    assert merge_main([*files, "-o", str(tmp_path / "m.json")]) == 0
    m = json.loads((tmp_path / "m.json").read_text())
    assert (m["request_model"], m["size_unit"], m["trace_only"]) == ("reference", "GiB", True)
    hit = m["summary"]["cache_stats"]["store_hit_rate"]
    assert m["validation"]["comparison"]["cache_hit_rate"]["benchmark"] == hit
    assert m["validation"]["passed"] == (abs(hit - 0.5) / 0.5 * 100 <= 5)


class FakeCudaTorch:
    """A stand-in for torch on a machine with one 80 GiB CUDA device (there is no GPU here): only what the GPU pool
    check reads."""

    class cuda:  # torch.cuda
        @staticmethod
        def get_device_properties(index):
            return type("Props", (), {"total_memory": 80 * 2**30})()


def test_a_gpu_pool_larger_than_the_device_is_refused_before_the_run(tmp_path, monkeypatch):
    from kvconnector.errors import ConfigError
    from replay.synthetic import bench as bench_module

    monkeypatch.setattr(bench_module, "cuda_torch", lambda: FakeCudaTorch)
    cfg = BenchConfig(num_gpus=2, gpu_mem_gb=60, cpu_mem_gb=0)
    with pytest.raises(ConfigError, match=r"--gpu-mem-gb 2 x 60 GiB = 128.8 GB: more than the 85.9 GB"):
        bench_module.build_tiers(cfg, str(tmp_path), [])
    # the trace-only mode holds no memory: the same node is modelled without the device
    traced = BenchConfig(num_gpus=2, gpu_mem_gb=60, cpu_mem_gb=0, io_trace_log=str(tmp_path / "t.csv"))
    tiers = bench_module.build_tiers(traced, str(tmp_path), [])
    assert [(t.name, t.capacity_bytes) for t in tiers[:1]] == [("gpu", 120 * 2**30)]
