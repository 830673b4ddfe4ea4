"""`kvtier check RUN_DIR`: the kvcache rules of Rules.md section 6 over a run directory, by rule ID.

Each test builds the run directory mlpstorage writes for a CLOSED run where every rule holds (mlperf_helpers.
harness_tree: its metadata, every rank's file, the summary), alters it by hand the way a run goes wrong, and reads
`kvtier check`'s lines: one FAIL line per thing wrong, naming the rule's ID; exit 1. The unaltered tree passes
(exit 0); a directory that is no run directory is refused (exit 2, one line)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mlperf_helpers import RUN_DATETIME, edit_rank, finish, harness_tree, rank_file, write_metadata

from replay.check import main


@pytest.fixture
def dirs(tmp_path):
    """(run directory, cache directory, results directory): the cache on another filesystem than the results where
    this machine has one (/dev/shm), else a path that does not exist here (the filesystem check is then skipped)."""
    results = tmp_path / "results"
    results.mkdir()
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK) and os.stat(shm).st_dev != os.stat(tmp_path).st_dev:
        cache = shm / f"kvtier-check-{os.getpid()}-{tmp_path.name}"
        cache.mkdir()
        yield results / "run", cache, results
        shutil.rmtree(cache, ignore_errors=True)
    else:
        yield results / "run", tmp_path / "not-here" / "cache", results


def closed_run(dirs, ranks=2, trials=3, mode="closed"):
    run, cache, results = dirs
    meta = harness_tree(run, cache, results, mode=mode, ranks=ranks, trials=trials)
    return run, meta


def check(capsys, run) -> tuple[int, list[str], str]:
    rc = main([str(run)])
    out, err = capsys.readouterr()
    return rc, out.splitlines(), err


def fails(lines: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in lines:
        if line.startswith("FAIL"):
            rule = line.split()[1]
            out.setdefault(rule, []).append(line)
    return out


def test_a_closed_run_where_every_rule_holds_passes(dirs, capsys):
    run, _ = closed_run(dirs)
    finish(run, 2, 3)
    rc, lines, err = check(capsys, run)
    assert rc == 0, lines
    assert not fails(lines)
    assert all(line.split()[0] in ("PASS", "SKIP") for line in lines)
    assert "kvcacheClosedSequenceLocks" in "".join(lines) and "rules hold" in err and "failing" not in err


def test_a_missing_rank(dirs, capsys):
    run, _ = closed_run(dirs)
    rank_file(run, 2, 1, 1).unlink()  # rank 1 of Option 2's second trial died: no file
    finish(run, 2, 3)  # the harness's summary: a partial failure
    rc, lines, _ = check(capsys, run)
    f = fails(lines)
    assert rc == 1 and set(f) == {"kvcacheClientDefinition", "kvcacheHeadlineResult"}, lines
    assert "option_2/trial_1/rank_1: no results file" in f["kvcacheClientDefinition"][0]


def test_a_rank_absent_from_every_trial_is_found_by_the_recorded_rank_count(dirs, capsys):
    run, _ = closed_run(dirs, ranks=3)
    for o in (1, 2, 3):
        for t in range(3):
            shutil.rmtree(rank_file(run, o, t, 2).parent)
    finish(run, 3, 3)
    rc, lines, _ = check(capsys, run)
    assert rc == 1 and len(fails(lines)["kvcacheClientDefinition"]) == 9


def test_two_trials_in_closed(dirs, capsys):
    run, meta = closed_run(dirs, trials=2)
    meta["args"]["trials"] = 2
    write_metadata(run, meta)
    finish(run, 2, 2)
    rc, lines, _ = check(capsys, run)
    f = fails(lines)
    assert rc == 1 and set(f) == {"kvcacheClosedSequenceLocks"}, lines
    assert "--trials 2, must be 3" in f["kvcacheClosedSequenceLocks"][0]
    assert sum("2 trials" in line for line in f["kvcacheClosedSequenceLocks"]) == 3  # each Option's directory


def test_a_trial_short_in_one_option_only(dirs, capsys):
    run, _ = closed_run(dirs)
    shutil.rmtree(run / "option_3" / "trial_2")
    finish(run, 2, 3)
    rc, lines, _ = check(capsys, run)
    f = fails(lines)
    assert rc == 1 and "option_3/: 2 trials" in " ".join(f["kvcacheClosedSequenceLocks"])
    assert "kvcacheClientDefinition" not in f  # the trial is gone, not a rank of it
    assert "kvcacheHeadlineResult" in f  # the summary, asked for 3 trials, counts its ranks missing


def test_a_changed_option_parameter(dirs, capsys):
    run, meta = closed_run(dirs)
    for c in meta["command_output_files"]:
        if "_opt1_" in c["stdout"]:
            c["command"] = c["command"].replace("--num-users 200", "--num-users 100")
    write_metadata(run, meta)
    for t in range(3):
        for r in range(2):
            edit_rank(run, 1, t, r, lambda d: d["config"].update(num_users=100))
    finish(run, 2, 3)
    rc, lines, _ = check(capsys, run)
    f = fails(lines)
    assert rc == 1 and set(f) == {"kvcacheFixedWorkloadPerOption"}, lines
    assert any("--num-users 100, must be 200" in line for line in f["kvcacheFixedWorkloadPerOption"])
    assert any("num_users 100, must be 200" in line for line in f["kvcacheFixedWorkloadPerOption"])


@pytest.mark.parametrize(
    "key, value",
    [
        ("cpu_mem_gb", 4.0),
        ("gpu_mem_gb", 16.0),
        ("model", "llama3.1-70b-instruct"),
        ("generation_mode", "fast"),
        ("duration", 30.0),
        ("max_concurrent_allocs", 4),
    ],
)
def test_each_option_parameter_a_rank_recorded_differently(dirs, capsys, key, value):
    run, _ = closed_run(dirs)
    edit_rank(run, 1, 0, 1, lambda d: d["config"].update({key: value}))  # Option 1: cpu 0, gpu 0, 8b, none, 300, 16
    finish(run, 2, 3)
    rc, lines, _ = check(capsys, run)
    f = fails(lines)
    # a rank's own concurrency is also no longer the Option's per-client one (6.3.3.2)
    also = {"kvcacheScaleUpModel"} if key == "max_concurrent_allocs" else set()
    assert rc == 1 and set(f) == {"kvcacheFixedWorkloadPerOption"} | also, lines
    said = f"option_1/trial_0/rank_1/kvcache_results_{RUN_DATETIME}.json: {key} {value}"
    assert said in f["kvcacheFixedWorkloadPerOption"][0]


def test_two_ranks_sharing_a_cache_dir(dirs, capsys):
    run, _ = closed_run(dirs)
    shared = lambda d: d["config"].update(cache_dir=d["config"]["cache_dir"].replace("rank_1", "rank_0"))  # noqa: E731
    edit_rank(run, 3, 2, 1, shared)
    finish(run, 2, 3)
    rc, lines, _ = check(capsys, run)
    f = fails(lines)
    assert rc == 1 and set(f) == {"kvcachePerClientIsolation"}, lines
    text = " ".join(f["kvcachePerClientIsolation"])
    assert "Option 3 trial 2: ranks 0, 1 share cache" in text and "not <cache-dir>/rank_1" in text


def test_two_ranks_sharing_one_results_file(dirs, capsys):
    run, _ = closed_run(dirs)
    target = rank_file(run, 1, 0, 1)
    target.unlink()
    target.symlink_to(rank_file(run, 1, 0, 0))
    rc, lines, _ = check(capsys, run)
    assert rc == 1 and "the results file of 2 ranks" in " ".join(fails(lines)["kvcachePerClientIsolation"])


def test_a_rank_written_outside_its_directory(dirs, capsys):
    run, _ = closed_run(dirs)
    edit_rank(run, 2, 0, 0, lambda d: d["config"].update(output="/elsewhere/out.json"))
    finish(run, 2, 3)
    rc, lines, _ = check(capsys, run)
    assert rc == 1 and "outside its rank_0/" in fails(lines)["kvcachePerClientIsolation"][0]


def all_cpu_tier(run, option=2, ranks=2, trials=3):
    for t in range(trials):
        for r in range(ranks):
            edit_rank(run, option, t, r, lambda d: d["summary"]["cache_stats"].update(storage_entries=0))


def test_all_ranks_cpu_tier(dirs, capsys):
    run, _ = closed_run(dirs)
    all_cpu_tier(run)
    finish(run, 2, 3)
    rc, lines, _ = check(capsys, run)
    f = fails(lines)
    assert rc == 1 and set(f) == {"kvcacheLatencyValidity"}, lines
    assert "Option 2: every rank CPU-tier" in f["kvcacheLatencyValidity"][0]


def test_one_cpu_tier_rank_is_no_failure(dirs, capsys):
    run, _ = closed_run(dirs)
    edit_rank(run, 2, 0, 0, lambda d: d["summary"]["cache_stats"].update(storage_entries=0))
    finish(run, 2, 3)
    rc, lines, _ = check(capsys, run)
    assert rc == 0, lines


def test_all_ranks_cpu_tier_in_open_is_flagged_not_failed(dirs, capsys):
    run, _ = closed_run(dirs, trials=1, mode="open")
    all_cpu_tier(run, trials=1)
    finish(run, 2, 1)
    rc, lines, _ = check(capsys, run)
    assert rc == 0, lines
    assert [line.split()[:2] for line in lines if line.startswith("OPEN")] == [["OPEN", "kvcacheLatencyValidity"]]


def test_an_open_run_may_change_what_closed_locks(dirs, capsys):
    run, meta = closed_run(dirs, trials=1, mode="open")
    meta["args"].update(seed=7, inter_option_delay=0, enable_autoscaling=True)
    for c in meta["command_output_files"]:
        c["command"] = c["command"].replace("--num-users 200", "--num-users 8") + " --rag-num-docs 10"
    write_metadata(run, meta)
    edit_rank(run, 1, 0, 0, lambda d: d["config"].update(num_users=8, seed=7))
    edit_rank(run, 1, 0, 1, lambda d: d["config"].update(num_users=8, seed=8))
    finish(run, 2, 1)
    rc, lines, _ = check(capsys, run)
    assert rc == 0, lines


@pytest.mark.parametrize(
    "change, rule, said",
    [
        (lambda m: m["args"].update(seed=7), "kvcacheClosedSequenceLocks", "--seed 7, must be 42"),
        (lambda m: m["args"].update(inter_option_delay=90), "kvcacheClosedSequenceLocks", "--inter-option-delay 90"),
        (lambda m: m["args"].update(config="/x.yaml"), "kvcacheClosedSequenceLocks", "--config /x.yaml"),
        (lambda m: m["args"].update(enable_autoscaling=True), "kvcacheAutoscalingProhibited", "--enable-autoscaling"),
        (lambda m: m["args"].update(cache_dir=None), "kvcachePosixCacheDir", "must both be set"),
    ],
)
def test_closed_locks_recorded_by_the_harness(dirs, capsys, change, rule, said):
    run, meta = closed_run(dirs)
    change(meta)
    write_metadata(run, meta)
    finish(run, 2, 3)
    rc, lines, _ = check(capsys, run)
    f = fails(lines)
    assert rc == 1 and list(f) == [rule] and said in f[rule][0], lines


def test_a_flag_beyond_the_option_in_closed(dirs, capsys):
    run, meta = closed_run(dirs)
    meta["command_output_files"][4]["command"] += " --seed-base 7 --enable-rag"
    write_metadata(run, meta)
    finish(run, 2, 3)
    rc, lines, _ = check(capsys, run)
    f = fails(lines)
    assert rc == 1 and set(f) == {"kvcacheClosedSequenceLocks", "kvcacheClosedImmutable"}, lines
    assert "--enable-rag set" in f["kvcacheClosedImmutable"][0]


def test_a_rank_seeded_otherwise(dirs, capsys):
    run, _ = closed_run(dirs)
    edit_rank(run, 1, 1, 1, lambda d: d["config"].update(seed=42))  # rank 1 must be 43
    finish(run, 2, 3)
    rc, lines, _ = check(capsys, run)
    assert rc == 1 and "seed 42, must be 43" in fails(lines)["kvcacheClosedSequenceLocks"][0]


def test_a_rank_that_divided_the_load(dirs, capsys):
    run, _ = closed_run(dirs, trials=1, mode="open")
    edit_rank(run, 3, 0, 1, lambda d: d["config"].update(num_users=35))  # half of Option 3's 70 per client
    finish(run, 2, 1)
    rc, lines, _ = check(capsys, run)
    assert rc == 1 and "num_users 35, the Option gives each client 70" in fails(lines)["kvcacheScaleUpModel"][0]


def test_a_summary_not_of_its_rank_files(dirs, capsys):
    run, _ = closed_run(dirs)
    path = finish(run, 2, 3)
    doc = json.loads(path.read_text())
    doc["options"]["2"]["aggregated_read_bandwidth_gbps"] *= 2
    doc["options"]["3"]["aggregated_p95_latency_ms"] = 1.0
    path.write_text(json.dumps(doc))
    rc, lines, _ = check(capsys, run)
    f = fails(lines)
    assert rc == 1 and set(f) == {"kvcacheAggregateBandwidth", "kvcacheAggregateDeviceLatency"}, lines


def test_mlpstorages_summary_without_the_device_p95s_passes_and_shows_them(dirs, capsys):
    run, _ = closed_run(dirs)
    path = finish(run, 2, 3)
    doc = json.loads(path.read_text())
    for entry in doc["options"].values():
        del entry["aggregated_device_read_p95_ms"], entry["aggregated_device_write_p95_ms"]
    path.write_text(json.dumps(doc))
    rc, lines, _ = check(capsys, run)
    assert rc == 0, lines
    line = next(line for line in lines if "kvcacheAggregateDeviceLatency" in line)
    assert "aggregated_device_read_p95_ms 4.0 (computed here" in line


def test_no_summary(dirs, capsys):
    run, _ = closed_run(dirs)
    rc, lines, _ = check(capsys, run)
    f = fails(lines)
    assert rc == 1 and {"kvcacheAggregateBandwidth", "kvcacheHeadlineResult"} <= set(f)
    assert "no kvcache_run_summary_<time>.json" in f["kvcacheHeadlineResult"][0]


def test_two_runs_mixed_in_one_directory(dirs, capsys):
    run, _ = closed_run(dirs)
    second = rank_file(run, 1, 0, 0).with_name("kvcache_results_20260101_130000.json")
    second.write_text(rank_file(run, 1, 0, 0).read_text())
    finish(run, 2, 3)
    rc, lines, _ = check(capsys, run)
    assert rc == 1 and "2 results files (two runs mixed)" in fails(lines)["kvcacheClientDefinition"][0]


def test_an_unreadable_rank_file_and_a_rank_beyond_the_count(dirs, capsys):
    run, _ = closed_run(dirs)
    rank_file(run, 1, 2, 0).write_text("{not json")
    extra = rank_file(run, 1, 2, 2)
    extra.parent.mkdir()
    extra.write_text(rank_file(run, 1, 2, 1).read_text())
    finish(run, 2, 3)
    rc, lines, _ = check(capsys, run)
    text = " ".join(fails(lines)["kvcacheClientDefinition"])
    assert rc == 1 and "unreadable" in text and "rank_2: beyond the run's 2 ranks" in text


def test_cache_and_results_on_one_filesystem(tmp_path, capsys):
    run, cache = tmp_path / "run", tmp_path / "cache"
    cache.mkdir()
    harness_tree(run, cache, tmp_path)
    finish(run, 2, 3)
    rc, lines, _ = check(capsys, run)
    assert rc == 1 and list(fails(lines)) == ["kvcachePosixCacheDir"]
    harness_tree(tmp_path / "open", cache, tmp_path, mode="open", trials=1)
    finish(tmp_path / "open", 2, 1)
    rc, lines, _ = check(capsys, tmp_path / "open")
    assert rc == 0 and any(line.startswith("OPEN  kvcachePosixCacheDir") for line in lines)


def with_metadata(d: Path, text: str) -> None:
    (d / "option_1").mkdir(parents=True)
    (d / "kv_cache_x_metadata.json").write_text(text)


@pytest.mark.parametrize(
    "make, said",
    [
        (lambda p: p.mkdir(), "not a run directory of the kvcache harness"),
        (lambda p: (p / "option_1").mkdir(parents=True), "no record of the run"),
        (lambda p: with_metadata(p, "[1"), "kv_cache_x_metadata.json"),
        (lambda p: with_metadata(p, "{}"), "no args"),
        (lambda p: with_metadata(p, '{"args": {}}') or (p / "kvtier_mlperf_run_x.json").write_text("{}"), "2 records"),
        (
            lambda p: (p / "a" / "option_1" / "trial_0").mkdir(parents=True),
            "run directories below it:",
        ),
    ],
)
def test_what_is_no_run_directory_is_refused(tmp_path, capsys, make, said):
    d = tmp_path / "d"
    make(d)
    rc = main([str(d)])
    out, err = capsys.readouterr()
    assert rc == 2 and not out and len(err.splitlines()) == 1 and said in err, err
    assert err.startswith("kvtier check: ")


def test_a_run_directory_is_checked_alone(dirs, capsys):
    run, _ = closed_run(dirs)
    rc = main([str(run), str(run / "x.json")])
    assert rc == 2 and "checked alone" in capsys.readouterr().err


@pytest.mark.slow
def test_the_cli_names_rule_ids_and_exits_by_verdict(dirs):
    run, _ = closed_run(dirs)
    finish(run, 2, 3)
    ok = subprocess.run([sys.executable, "-m", "replay.cli", "check", str(run)], capture_output=True, text=True)
    rank_file(run, 2, 0, 1).unlink()
    bad = subprocess.run([sys.executable, "-m", "replay.cli", "check", str(run)], capture_output=True, text=True)
    gone = subprocess.run([sys.executable, "-m", "replay.cli", "check", str(run / "x")], capture_output=True, text=True)
    assert ok.returncode == 0 and "Traceback" not in ok.stderr
    assert bad.returncode == 1 and "FAIL  kvcacheClientDefinition (6.3.3.1): option_2/trial_0/rank_1" in bad.stdout
    assert gone.returncode == 2 and gone.stderr.count("\n") == 1 and "Traceback" not in gone.stderr
