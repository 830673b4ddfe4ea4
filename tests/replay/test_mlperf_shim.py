"""`kvtier mlperf shim DIR`: the directory mlpstorage runs as the reference's kv-cache.py and mlperf_wrapper.py.

Fast: the written files (the recorded Python and kvtier directory, the delays, valid Python, executable), rewriting
a shim and never a foreign file; the wrapper's rank, seed and paths; kv-cache.py's --output and environment.
Slow: the wrapper run as mpirun runs it (two ranks at once, mpirun's variables set, the harness's Option flags),
each rank running kvtier bench into its own rank_<N>/ with seed 42 + N, and the files aggregated; a rank stopped by
SIGTERM leaves no results file the harness would take and no process; a refused run leaves no file at all."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import wait_for

from replay.mlperf import kvcache_script, wrapper_script
from replay.mlperf.options import OPTIONS
from replay.mlperf.shim import MARK, ROOT, write_shim
from replay.mlperf.summary import summarize
from replay.synthetic.cli import build_parser, config_from_args

# Every key of a rank file that mlpstorage's aggregation (mlpstorage_py/benchmarks/kvcache.py at 2f65ef1) and
# Rules.md 6.3.4 read.
HARNESS_KEYS = [
    ("summary", "cache_stats", "tier_storage_read_bandwidth_gbps"),
    ("summary", "cache_stats", "tier_storage_write_bandwidth_gbps"),
    ("summary", "avg_throughput_tokens_per_sec"),
    ("summary", "storage_throughput_tokens_per_sec"),
    ("summary", "storage_io_latency_ms", "p95"),
    ("summary", "cache_stats", "storage_read_device_p95_ms"),
    ("summary", "cache_stats", "storage_write_device_p95_ms"),
    ("summary", "cache_stats", "storage_entries"),
]


def dig(doc, path):
    for key in path:
        doc = doc[key]
    return doc


def test_the_shim_records_this_python_and_this_kvtier(tmp_path):
    written = write_shim(str(tmp_path / "shim"), start_delay_s=0, end_delay_s=2.5)
    assert [p.name for p in written] == ["kv-cache.py", "mlperf_wrapper.py", "config.yaml"]
    kv, wrapper, config = (p.read_text() for p in written)
    assert f"KVTIER_PYTHON = {sys.executable!r}\n" in kv and f"KVTIER_ROOT = {str(ROOT)!r}\n" in kv
    assert "START_DELAY_S = 0\n" in wrapper and "END_DELAY_S = 2.5\n" in wrapper
    for text in (kv, wrapper):
        assert text.startswith("#!/usr/bin/env python3\n" + MARK)
        compile(text, "shim", "exec")
    assert config.strip().endswith("{}") and MARK in config
    assert all(os.access(p, os.X_OK) for p in written[:2]) and not os.access(written[2], os.X_OK)


def test_a_shim_is_rewritten_and_a_foreign_file_never(tmp_path):
    write_shim(str(tmp_path), start_delay_s=1)
    write_shim(str(tmp_path), start_delay_s=7)  # moving kvtier or changing a delay: write it again
    assert "START_DELAY_S = 7\n" in (tmp_path / "mlperf_wrapper.py").read_text()
    for name in ("kv-cache.py", "mlperf_wrapper.py", "config.yaml"):
        other = tmp_path / f"other-{name}"
        other.mkdir()
        (other / name).write_text("the reference's\n")
        with pytest.raises(Exception, match=f"{name}: exists and is no kvtier shim's"):
            write_shim(str(other))
        assert sorted(p.name for p in other.iterdir()) == [name]  # nothing else written either
    link = tmp_path / "linked"
    link.mkdir()
    (link / "kv-cache.py").symlink_to(tmp_path / "kv-cache.py")  # even a link to a shim: it would write through
    with pytest.raises(Exception, match="exists and is no kvtier shim's"):
        write_shim(str(link))


@pytest.mark.parametrize(
    "env, rank",
    [
        ({}, 0),
        ({"OMPI_COMM_WORLD_RANK": "3"}, 3),
        ({"PMI_RANK": "5"}, 5),
        ({"OMPI_COMM_WORLD_RANK": "2", "PMI_RANK": "9"}, 2),  # Open MPI's first
        ({"OMPI_COMM_WORLD_RANK": "", "PMI_RANK": "4"}, 4),
    ],
)
def test_the_rank_comes_from_mpiruns_variables(env, rank):
    assert wrapper_script.rank_of(env) == rank


@pytest.mark.parametrize("value", ["x", "-1", "1.0", " 2"])
def test_a_rank_variable_that_is_no_rank_is_refused(value):
    with pytest.raises(ValueError, match="not an MPI rank"):
        wrapper_script.rank_of({"PMI_RANK": value})


def test_the_wrappers_command_line_and_layout():
    import datetime as dt

    args, forwarded = wrapper_script.parser().parse_known_args(
        ["--rank-output-base", "/r/option_2/trial_1", "--rank-cache-base", "/c", "--seed-base", "40", "--seed", "1"]
        + ["--model", "llama3.1-8b", "--config", "/s/config.yaml"]
    )
    assert forwarded == ["--seed", "1", "--model", "llama3.1-8b", "--config", "/s/config.yaml"]  # no abbreviation
    cmd, out_dir, cache_dir = wrapper_script.rank_command(args, forwarded, 3, dt.datetime(2026, 1, 2, 3, 4, 5))
    assert out_dir == Path("/r/option_2/trial_1/rank_3") and cache_dir == Path("/c/rank_3")
    assert cmd[1] == str(Path(wrapper_script.__file__).resolve().parent / "kv-cache.py")
    # the rank's own values last: argparse keeps the last of a repeated flag
    assert cmd[-6:] == ["--seed", "43", "--output", str(out_dir / "kvcache_results_20260102_030405.json")] + [
        "--cache-dir",
        str(cache_dir),
    ]
    assert (args.start_delay, args.end_delay) == (90, 90)  # the reference's defaults, unless the shim wrote others


@pytest.mark.parametrize(
    "argv, found",
    [
        (["--model", "m"], None),
        (["--output", "a.json"], "a.json"),
        (["--output", "a.json", "--seed", "1", "--output", "b.json"], "b.json"),  # the last, as argparse
        (["--output=a.json"], "a.json"),
        (["--output", "a.json", "--output=b.json"], "b.json"),
    ],
)
def test_kvcache_finds_the_output_it_promotes(argv, found):
    got, at = kvcache_script.output_of(argv)
    assert got == found
    if found:
        moved = kvcache_script.with_output(argv, at, "X")
        assert kvcache_script.output_of(moved)[0] == "X" and len(moved) == len(argv)


def test_kvtier_runs_without_mpiruns_variables():
    env = {"OMPI_COMM_WORLD_SIZE": "2", "PMI_SIZE": "2", "PMIX_RANK": "1", "PATH": "/bin", "KVTIER_X": "1"}
    assert kvcache_script.kvtier_environ(env) == {"PATH": "/bin", "KVTIER_X": "1"}


# ---- the shim run as mpirun runs it ---------------------------------------------------------------------------------
OPTION_FLAGS = (  # the flags mlpstorage gives kv-cache.py for an OPEN Option (tiny here: a test's budget)
    "--model tiny-1b --num-users 2 --duration 2 --gpu-mem-gb 0.0 --cpu-mem-gb 0.0 --max-concurrent-allocs 16 "
    "--generation-mode none --rag-num-docs 10 --autoscaler-mode qos --performance-profile throughput"
).split()


@pytest.fixture
def shim(tmp_path) -> Path:
    d = tmp_path / "shim"
    r = subprocess.run(
        [sys.executable, "-m", "replay.cli", "mlperf", "shim", str(d), "--start-delay", "0", "--end-delay", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    return d


def start_rank(shim: Path, tmp_path: Path, rank: int, size: int, *flags: str, env: dict | None = None):
    """mlperf_wrapper.py as mpirun starts it (mpirun's variables set), from a directory outside the checkout."""
    argv = [
        sys.executable,
        str(shim / "mlperf_wrapper.py"),
        "--rank-output-base",
        str(tmp_path / "run/option_1/trial_0"),
    ]
    argv += ["--rank-cache-base", str(tmp_path / "cache"), "--seed-base", "42", "--config", str(shim / "config.yaml")]
    mpi = {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(size), "PMIX_RANK": str(rank)}
    return subprocess.Popen(
        argv + list(flags),
        env={**os.environ, **mpi, **(env or {})},
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.slow
def test_two_ranks_run_kvtier_bench_each_in_its_own_place_and_aggregate(shim, tmp_path):
    ranks = [start_rank(shim, tmp_path, r, 2, *OPTION_FLAGS) for r in (0, 1)]
    outs = [p.communicate(timeout=240)[0] for p in ranks]
    assert [p.returncode for p in ranks] == [0, 0], outs
    docs = []
    for r in (0, 1):
        rank_dir = tmp_path / "run/option_1/trial_0" / f"rank_{r}"
        (results,) = rank_dir.iterdir()  # the results file alone: nothing in flight, nothing set aside
        assert results.name.startswith("kvcache_results_") and results.suffix == ".json"
        doc = json.loads(results.read_text())
        assert doc["summary"]["status"] == "completed" and doc["config"]["seed"] == 42 + r
        assert doc["config"]["cache_dir"] == str(tmp_path / "cache" / f"rank_{r}")
        assert doc["config"]["max_concurrent_allocs"] == 16 and doc["config"]["cpu_mem_gb"] == 0
        for key in HARNESS_KEYS:
            assert isinstance(dig(doc, key), (int, float)), key
        docs.append(doc)
    assert dig(docs[0], HARNESS_KEYS[0]) > 0  # storage was read: gpu and cpu tiers are off
    s = summarize(str(tmp_path / "run"), ranks=2, trials=1, run_datetime="t")["options"][1]
    assert s["partial_failure"] is False and s["missing_files"] == []
    assert s["aggregated_read_bandwidth_gbps"] == sum(dig(d, HARNESS_KEYS[0]) for d in docs)
    assert s["aggregated_storage_throughput_tokens_per_sec"] == sum(dig(d, HARNESS_KEYS[3]) for d in docs)
    assert s["aggregated_p95_latency_ms"] == max(dig(d, HARNESS_KEYS[4]) for d in docs)
    assert s["aggregated_device_read_p95_ms"] == max(dig(d, HARNESS_KEYS[5]) for d in docs)


def processes_naming(text: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if proc.name.isdigit() and text in cmdline:
            found.append(f"{proc.name}: {cmdline}")
    return found


@pytest.mark.slow
def test_a_stopped_rank_leaves_no_result_and_no_process(shim, tmp_path):
    status = tmp_path / "status.json"  # kvtier bench's live figures: its window is running once this exists
    p = start_rank(shim, tmp_path, 0, 1, *OPTION_FLAGS, "--duration", "120", env={"KVTIER_CLIENT_STATUS": str(status)})
    wait_for(lambda: status.exists() or p.poll() is not None, timeout_s=120, what="the rank's window")
    assert p.poll() is None, p.communicate()[0]
    p.send_signal(signal.SIGTERM)
    out = p.communicate(timeout=120)[0]
    assert p.returncode == 128 + signal.SIGTERM, out
    rank_dir = tmp_path / "run/option_1/trial_0/rank_0"
    assert list(rank_dir.glob("kvcache_results_*.json")) == []  # nothing the harness would count
    (aside,) = rank_dir.glob("kvtier_failed_kvcache_results_*.json")
    assert json.loads(aside.read_text())["summary"]["status"] != "completed"  # the partial results, kept aside
    assert processes_naming(str(tmp_path)) == []


@pytest.mark.slow
def test_a_refused_run_writes_nothing(shim, tmp_path):
    p = start_rank(shim, tmp_path, 0, 1, *OPTION_FLAGS, "--num-users", "0")
    out = p.communicate(timeout=120)[0]
    assert p.returncode == 2 and "kvtier bench: " in out and "Traceback" not in out, out
    assert list((tmp_path / "run/option_1/trial_0/rank_0").iterdir()) == []


# ---- the flags mlpstorage gives a rank, as kvtier bench reads them ---------------------------------------------------
@pytest.mark.parametrize("number", sorted(OPTIONS))
@pytest.mark.parametrize("mode", ["closed", "open"])
def test_kvtier_bench_reads_each_options_flags_as_the_table_has_them(number, mode, tmp_path):
    """What kv-cache.py receives from the wrapper for an Option (mlpstorage's --config first, the Option's flags, in
    OPEN the global knobs mlpstorage always forwards there, then the rank's own), parsed by kvtier bench's own parser:
    every value of Table KVCache-1 arrives with its meaning."""
    option = OPTIONS[number]
    shim = write_shim(str(tmp_path / "shim"))
    argv = ["--config", str(shim[2]), *option.flags()]
    if mode == "open":
        argv += ["--rag-num-docs", "10", "--autoscaler-mode", "qos", "--performance-profile", "throughput"]
    argv += ["--seed", "45", "--output", str(tmp_path / "r.json"), "--cache-dir", str(tmp_path / "c" / "rank_3")]
    cfg = config_from_args(build_parser().parse_args(argv))
    assert (cfg.model, cfg.num_users, cfg.duration) == (option.model, option.num_users, option.duration_s)
    assert (cfg.gpu_mem_gb, cfg.cpu_mem_gb) == (option.gpu_mem_gb, option.cpu_mem_gb)
    assert (cfg.max_concurrent_allocs, cfg.generation_mode) == (option.max_concurrent_allocs, "none")
    assert (cfg.seed, cfg.cache_dir) == (45, str(tmp_path / "c" / "rank_3"))
