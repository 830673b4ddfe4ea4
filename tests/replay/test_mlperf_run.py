"""`kvtier mlperf run`: kvtier's own MLPerf KV cache harness (replay/mlperf/run.py).

Fast: every CLOSED override is refused before anything runs, in one line naming the rule (exit 2, no run
directory made); the rank layout of Rules.md 6.3.3.1; the cache and results directories on one filesystem (refused
in CLOSED, a warning in OPEN); whatif's capacity gate; each trial's mpirun line as the wrapper reads it.
Slow: an OPEN run of one Option, one trial, two ranks through the real mpirun, whose summary equals
`kvtier mlperf summary` of the same tree and which `kvtier check` passes; SIGINT between trials and during one."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import wait_for

from replay.mlperf.cli import build_parser, main
from replay.mlperf.record import wrapper_flags
from replay.mlperf.run import Plan, make_plan, rank_layout, trial_command
from replay.mlperf.summary import summarize


@pytest.fixture
def dirs(tmp_path):
    """(results dir, cache dir) on two filesystems: the cache under /dev/shm where it is another one."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK) and os.stat(shm).st_dev != os.stat(tmp_path).st_dev):
        pytest.skip("no second filesystem (/dev/shm) for the cache")
    cache = shm / f"kvtier-run-{os.getpid()}-{tmp_path.name}"
    yield tmp_path / "results", cache
    subprocess.run(["rm", "-rf", str(cache)], check=False)


def refused(capsys, tmp_path, *argv) -> str:
    try:
        rc = main(["run", *argv])
    except SystemExit as exc:  # argparse's own refusal (one line: OneLineParser)
        rc = exc.code
    out, err = capsys.readouterr()
    assert rc == 2 and not out and len(err.splitlines()) == 1 and "Traceback" not in err, (rc, out, err)
    assert not list(tmp_path.glob("results/*")), "nothing is written before a refusal"
    return err.strip().removeprefix("kvtier mlperf: ").removeprefix("kvtier mlperf run: ")


CLOSED_OVERRIDES = [
    (["--trials", "2"], "kvcacheClosedSequenceLocks: --trials 2, must be 3"),
    (["--trials", "5"], "kvcacheClosedSequenceLocks: --trials 5, must be 3"),
    (["--seed", "7"], "kvcacheClosedSequenceLocks: --seed 7, must be 42"),
    (["--inter-option-delay", "90"], "kvcacheClosedSequenceLocks: --inter-option-delay 90, must be 20"),
    (["--inter-option-delay", "0"], "kvcacheClosedSequenceLocks: --inter-option-delay 0, must be 20"),
    (["--config", "x.yaml"], "kvcacheClosedSequenceLocks: --config x.yaml: not permitted in CLOSED"),
    (["--enable-autoscaling"], "kvcacheAutoscalingProhibited: --enable-autoscaling: not permitted in CLOSED"),
    (["--num-users", "8"], "kvcacheFixedWorkloadPerOption: --num-users 8"),
    (["--duration", "30"], "kvcacheFixedWorkloadPerOption: --duration 30"),
    (["--model", "llama3.1-8b"], "kvcacheFixedWorkloadPerOption: --model llama3.1-8b"),
    (["--cpu-mem-gb", "0"], "kvcacheFixedWorkloadPerOption: --cpu-mem-gb 0"),
    (["--gpu-mem-gb", "0"], "kvcacheFixedWorkloadPerOption: --gpu-mem-gb 0"),
    (["--max-concurrent-allocs", "16"], "kvcacheFixedWorkloadPerOption: --max-concurrent-allocs 16"),
    (["--generation-mode", "none"], "kvcacheFixedWorkloadPerOption: --generation-mode none"),
    (["--options", "1"], "kvcacheFixedWorkloadPerOption: --options 1, must be 1 2 3"),
    (["--start-delay", "0"], "kvcacheClosedImmutable: --start-delay 0, must be 90"),
    (["--end-delay", "5"], "kvcacheClosedImmutable: --end-delay 5, must be 90"),
    (["--enable-rag"], "kvcacheClosedImmutable: workload flags"),
    (["--rag-num-docs", "3"], "kvcacheClosedImmutable: --rag-num-docs"),
    (["--performance-profile", "latency"], "kvcacheClosedImmutable: --performance-profile"),
]


@pytest.mark.parametrize("flags, said", CLOSED_OVERRIDES)
def test_a_closed_override_is_refused_naming_the_rule(capsys, tmp_path, flags, said):
    base = ["--mode", "closed", "--results-dir", str(tmp_path / "results"), "--cache-dir", "/dev/shm/x"]
    assert refused(capsys, tmp_path, *base, *flags).startswith(said)


@pytest.mark.parametrize("flags", [["--trials", "3"], ["--seed", "42"], ["--inter-option-delay", "20"]])
def test_a_closed_flag_equal_to_its_lock_is_no_override(tmp_path, flags):
    argv = ["run", "--mode", "closed", "--results-dir", str(tmp_path), "--cache-dir", "/dev/shm/x", *flags]
    args = build_parser().parse_args(argv)
    try:
        make_plan(args, argv)
    except Exception as exc:  # only the filesystem check may refuse here (/dev/shm absent or on /tmp's filesystem)
        assert "kvcachePosixCacheDir" in str(exc)


@pytest.mark.parametrize(
    "hosts, np_, npn, want",
    [
        (["a"], None, None, (1, 1)),
        (["a"], 4, None, (4, 4)),
        (["a", "b"], 8, None, (4, 8)),
        (["a", "b"], None, 3, (3, 6)),
        (["a", "b"], 6, 3, (3, 6)),
        (["a", "b", "c", "d"], None, None, (1, 4)),
    ],
)
def test_the_rank_layout_of_rule_6_3_3_1(hosts, np_, npn, want):
    assert rank_layout(hosts, np_, npn) == want


@pytest.mark.parametrize(
    "flags, said",
    [
        (["--hosts", "a", "b", "--num-processes", "3"], "kvcacheClientDefinition: --num-processes 3 does not divide"),
        (["--hosts", "a", "b", "--num-processes", "6", "--npernode", "2"], "is not --npernode 2 x 2 hosts"),
        (["--num-processes", "0"], "kvcacheClientDefinition: --num-processes 0, must be at least 1"),
        (["--npernode", "-1"], "kvcacheClientDefinition: --npernode -1"),
        (["--trials", "0"], "--trials 0: must be at least 1"),
        (["--inter-option-delay", "-1"], "--inter-option-delay -1: must be at least 0"),
        (["--start-delay", "-2"], "--start-delay -2: seconds"),
        (["--config", "/no/such.yaml"], "--config /no/such.yaml: no such file"),
        (["--mpirun", "/no/mpirun"], "--mpirun /no/mpirun: not found"),
        (["--options", "4"], "invalid choice: 4"),
        (["--num-users", "many"], "invalid int value"),
    ],
)
def test_open_refusals(capsys, tmp_path, flags, said):
    base = ["--mode", "open", "--results-dir", str(tmp_path / "results"), "--cache-dir", str(tmp_path / "c")]
    assert said in refused(capsys, tmp_path, *base, *flags)


def test_one_filesystem_is_refused_in_closed_and_warned_in_open(capsys, tmp_path, caplog):
    base = ["--results-dir", str(tmp_path / "results"), "--cache-dir", str(tmp_path / "cache" / "deep")]
    said = refused(capsys, tmp_path, "--mode", "closed", *base)
    assert said.startswith("kvcachePosixCacheDir: --cache-dir") and "on one filesystem" in said
    argv = ["run", "--mode", "open", *base]
    with caplog.at_level(logging.WARNING):
        plan = make_plan(build_parser().parse_args(argv), argv)
    assert plan.same_filesystem and "kvcachePosixCacheDir" in caplog.text


def test_whatif_refuses_a_cache_without_room(capsys, tmp_path, dirs):
    results, cache = dirs
    base = ["--mode", "whatif", "--results-dir", str(results), "--cache-dir", str(cache)]
    said = refused(capsys, tmp_path, *base, "--num-users", "100000000")
    assert "bytes free, Option 1 needs" in said and "capacity" in said
    argv = ["run", *base, "--num-users", "1"]
    assert make_plan(build_parser().parse_args(argv), argv).mode == "whatif"


def plan_of(tmp_path, *flags) -> Plan:
    argv = ["run", "--mode", "open", "--results-dir", str(tmp_path / "r"), "--cache-dir", str(tmp_path / "c"), *flags]
    return make_plan(build_parser().parse_args(argv), argv)


def test_open_flags_supersede_one_key_at_a_time_and_defaults_never(tmp_path):
    plan = plan_of(tmp_path, "--num-users", "8", "--hosts", "h1", "h2", "--npernode", "2", "--seed", "5")
    cmd = trial_command(plan, tmp_path / "shim", tmp_path / "run" / "option_3" / "trial_0", 3)
    flags = wrapper_flags(" ".join(cmd))
    # Option 3's values, but for the one flag given
    assert flags["--num-users"] == "8" and flags["--model"] == "llama3.1-70b-instruct"
    assert flags["--max-concurrent-allocs"] == "4" and flags["--cpu-mem-gb"] == "0" and flags["--gpu-mem-gb"] == "0"
    assert flags["--rank-output-base"].endswith("option_3/trial_0") and flags["--seed-base"] == "5"
    assert flags["--rank-cache-base"] == str(tmp_path / "c") and flags["--config"] == str(tmp_path / "shim/config.yaml")
    assert cmd[cmd.index("-n") + 1] == "4" and cmd[cmd.index("-host") + 1] == "h1:2,h2:2"
    assert "--bind-to" in cmd and cmd.index("--mca") < cmd.index(sys.executable)


def pids_naming(text: str) -> list[int]:
    """Processes whose command line names `text` (this test's run directory)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if text in (d / "cmdline").read_bytes().decode(errors="replace"):
                    out.append(int(d.name))
            except OSError:
                continue
    return out


def run_cli(results: Path, cache: Path, *flags) -> subprocess.Popen:
    argv = ["--mode", "open", "--results-dir", str(results), "--cache-dir", str(cache), "--num-processes", "2"]
    argv += ["--num-users", "2", "--inter-option-delay", "0", "--start-delay", "0", "--end-delay", "0"]
    argv += ["--gpu-mem-gb", "0", "--cpu-mem-gb", "0", "--no-progress", *flags]
    return subprocess.Popen(
        [sys.executable, "-m", "replay.cli", "mlperf", "run", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def the_run_dir(results: Path) -> Path:
    (run,) = (results / "open" / "kv_cache" / "run").iterdir()
    return run


@pytest.mark.slow
def test_an_open_run_writes_the_summary_of_its_rank_files(dirs):
    results, cache = dirs
    p = run_cli(results, cache, "--options", "1", "--trials", "1", "--duration", "4")
    out, err = p.communicate(timeout=240)
    assert p.returncode == 0, (out, err)
    run = the_run_dir(results)
    (path,) = run.glob("kvcache_run_summary_*.json")
    doc = json.loads(path.read_text())
    # `kvtier mlperf summary` of the same tree (as JSON: the Options' keys are strings there)
    assert doc == json.loads(json.dumps(summarize(str(run), 2, 1, 2, 1, doc["run_datetime"])))
    assert doc["total_ranks"] == 2 and list(doc["options"]) == ["1"] and not doc["partial_failure"]
    for rank in (0, 1):
        (f,) = (run / "option_1" / "trial_0" / f"rank_{rank}").glob("kvcache_results_*.json")
        cfg = json.loads(f.read_text())["config"]
        assert cfg["seed"] == 42 + rank and cfg["cache_dir"] == str(cache / f"rank_{rank}") and cfg["num_users"] == 2
    assert f"summary: {path}" in out and "Option 1 trial 1/1: mpirun exited 0" in out
    check = subprocess.run([sys.executable, "-m", "replay.cli", "check", str(run)], capture_output=True, text=True)
    assert check.returncode == 0 and "FAIL" not in check.stdout, check.stdout
    # a second run into the same results directory: a directory of its own
    before = {f: f.read_bytes() for f in run.rglob("*") if f.is_file()}
    p = run_cli(results, cache, "--options", "1", "--trials", "1", "--duration", "1", "--num-processes", "1")
    p.communicate(timeout=240)
    runs = sorted((results / "open" / "kv_cache" / "run").iterdir())
    assert len(runs) == 2 and run in runs
    assert before == {f: f.read_bytes() for f in run.rglob("*") if f.is_file()}  # the first run's files untouched


@pytest.mark.slow
@pytest.mark.parametrize("when", ["between trials", "during a trial"])
def test_sigint_leaves_a_partial_summary_and_no_process(dirs, when):
    results, cache = dirs
    delay = "60" if when == "between trials" else "0"
    p = run_cli(
        results,
        cache,
        "--options",
        "1",
        "2",
        "--trials",
        "1",
        "--duration",
        "3" if delay != "0" else "60",
        "--inter-option-delay",
        delay,
    )
    runs = results / "open" / "kv_cache" / "run"

    def stage():
        if not runs.is_dir() or not any(runs.iterdir()):
            return None
        rec = next(the_run_dir(results).glob("kvtier_mlperf_run_*.json"), None)
        try:
            doc = json.loads(rec.read_text()) if rec else None
        except ValueError:
            return None
        if doc and doc["commands"]:
            first = doc["commands"][0]
            if when == "between trials" and first["exit_status"] is not None:
                return doc
            if when == "during a trial" and list((the_run_dir(results) / "option_1" / "trial_0").glob("rank_*")):
                return doc
        return None

    wait_for(stage, timeout_s=120, interval_s=0.2, what="the run at its stage")
    if when == "during a trial":
        time.sleep(3)  # the ranks' kvtier bench under way
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, (out, err)
    run = the_run_dir(results)
    (path,) = run.glob("kvcache_run_summary_*.json")
    doc = json.loads(path.read_text())
    assert doc["partial_failure"] and doc["stopped_by"] == "SIGINT"
    if when == "between trials":
        assert list(doc["options"]) == ["1"] and doc["options_not_run"] == [2]
        assert not doc["options"]["1"]["partial_failure"]
    else:
        assert doc["options"] == {} and doc["options_not_run"] == [1, 2]
        assert not list(run.glob("option_1/trial_0/rank_*/kvcache_results_*.json"))  # nothing the harness takes
    record = json.loads(next(run.glob("kvtier_mlperf_run_*.json")).read_text())
    assert record["status"] == "stopped" and record["stopped_by"] == "SIGINT"
    wait_for(lambda: not pids_naming(str(run)), timeout_s=10, what="no process of the run")
