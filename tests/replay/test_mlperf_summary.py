"""`kvtier mlperf summary`: the MLPerf Storage KV cache harness's aggregation of rank files (replay/mlperf/summary.py)
on hand-made run trees, each expected figure worked out by hand from Rules.md section 6.3.4 (at hazemawadalla/storage
2f65ef1) in the test beside it:
- 6.3.4.1/6.3.4.2: within a trial the ranks' bandwidths and throughputs are summed; the Option's figure is the
  mean of the trials' sums;
- 6.3.4.3: the p95s are the maximum over every rank of every trial (mlpstorage's code scores
  summary.storage_io_latency_ms.p95; the rule names the device p95s, which kvtier adds);
- 6.3.4.4: a CPU-tier rank (storage_entries == 0) counts 0.0 where it has no storage figures and is listed;
- a rank without a results file, or with one that cannot be read, makes the Option a partial failure, the path
  listed. mlpstorage's own code on the same trees: test_mlperf_vs_mlpstorage.py."""

from __future__ import annotations

import json
import os

import pytest
from mlperf_helpers import full_tree, put, rank_doc

from replay.mlperf.cli import main
from replay.mlperf.summary import EXTRA_OPTION_KEYS, aggregate_option, discover, summarize, write_summary


def test_sums_over_ranks_then_the_mean_over_trials(tmp_path):
    full_tree(tmp_path)
    r = aggregate_option(1, [str(tmp_path / "option_1" / f"trial_{t}") for t in range(3)], 2)
    # read: trial sums 1.0+2.0=3.0, 1.5+2.5=4.0, 0.5+1.5=2.0; mean 9.0/3 = 3.0
    assert r["aggregated_read_bandwidth_gbps"] == pytest.approx(3.0)
    # write: 0.5, 0.8, 0.2; mean 0.5
    assert r["aggregated_write_bandwidth_gbps"] == pytest.approx(0.5)
    # tokens/s: 300, 300, 210; mean 270
    assert r["aggregated_avg_throughput_tokens_per_sec"] == pytest.approx(270)
    # storage tokens/s: 30, 15, 60; mean 35
    assert r["aggregated_storage_throughput_tokens_per_sec"] == pytest.approx(35)
    # p95: the maximum over every rank of every trial: max(5, 7, 12, 3, 4, 9) = 12, never a mean (trials 7, 12, 9)
    assert r["aggregated_p95_latency_ms"] == 12
    assert r["aggregated_device_read_p95_ms"] == 8  # max(2, 3, 8, 1, 4, 4)
    assert r["aggregated_device_write_p95_ms"] == 6  # max(1, 6, 2, 2, 3, 5)
    assert (r["rank_count"], r["trial_count"], r["partial_failure"]) == (2, 3, False)
    assert r["missing_files"] == r["cpu_tier_ranks"] == r["several_results_files"] == []


def test_a_missing_rank_an_unreadable_file_and_a_cpu_tier_rank(tmp_path):
    put(tmp_path, 2, 0, 0, rank_doc(2.0, 1.0, 100, 50, 5, 6, 7))
    (tmp_path / "option_2" / "trial_0" / "rank_1").mkdir()  # the rank ran, wrote nothing
    cpu = put(
        tmp_path, 2, 1, 0, {"summary": {"avg_throughput_tokens_per_sec": 80, "cache_stats": {"storage_entries": 0}}}
    )
    bad = put(tmp_path, 2, 1, 1, "{not json")
    r = aggregate_option(2, [str(tmp_path / "option_2" / f"trial_{t}") for t in range(2)], 2)
    # read: trial 0 = 2.0 (rank 1 missing), trial 1 = 0.0 (the CPU-tier rank has no storage figures: 0.0); mean 1.0
    assert r["aggregated_read_bandwidth_gbps"] == pytest.approx(1.0)
    assert r["aggregated_write_bandwidth_gbps"] == pytest.approx(0.5)  # (1.0 + 0.0) / 2
    assert r["aggregated_avg_throughput_tokens_per_sec"] == pytest.approx(90)  # (100 + 80) / 2
    assert r["aggregated_storage_throughput_tokens_per_sec"] == pytest.approx(25)  # (50 + 0) / 2
    assert r["aggregated_p95_latency_ms"] == 5  # max(5, 0.0)
    assert r["partial_failure"] is True
    assert r["missing_files"] == [str(tmp_path / "option_2" / "trial_0" / "rank_1"), str(bad)]
    assert r["cpu_tier_ranks"] == [str(cpu)]


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        "[1, 2]",  # JSON, but no object
        '{"summary": [1]}',
        '{"summary": {"cache_stats": null}}',
        '{"summary": {"storage_io_latency_ms": 5}}',
        '{"summary": {"avg_throughput_tokens_per_sec": "fast"}}',
        '{"summary": {"cache_stats": {"tier_storage_read_bandwidth_gbps": true}}}',
        '{"summary": {"avg_throughput_tokens_per_sec": NaN}}',
        "",
        "\xff\xfe",
    ],
)
def test_a_file_that_is_no_results_file_is_listed_and_counts_nothing(tmp_path, text):
    put(tmp_path, 1, 0, 0, rank_doc(1.0, 1.0, 10, 10, 3, 3, 3))
    bad = put(tmp_path, 1, 0, 1, text)
    r = aggregate_option(1, [str(tmp_path / "option_1" / "trial_0")], 2)
    assert r["missing_files"] == [str(bad)] and r["partial_failure"] is True
    assert r["aggregated_read_bandwidth_gbps"] == 1.0 and r["aggregated_p95_latency_ms"] == 3


def test_a_directory_or_a_fifo_of_the_results_name_is_unreadable(tmp_path):
    d = tmp_path / "option_1" / "trial_0" / "rank_0" / "kvcache_results_x.json"
    d.mkdir(parents=True)
    fifo = tmp_path / "option_1" / "trial_0" / "rank_1" / "kvcache_results_y.json"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    r = aggregate_option(1, [str(tmp_path / "option_1" / "trial_0")], 2)  # a FIFO is never opened to wait on
    assert r["missing_files"] == [str(d), str(fifo)]


def test_a_failed_ranks_file_set_aside_is_no_result(tmp_path):
    """The shim renames a run that did not complete to kvtier_failed_<name>: the glob of kvcache_results_*.json (the
    harness's) does not take it, so the rank is missing, never counted with its partial figures."""
    rank_dir = put(tmp_path, 1, 0, 0, rank_doc(9.0, 9.0, 9, 9, 9, 9, 9), "kvtier_failed_kvcache_results_1.json").parent
    put(tmp_path, 1, 0, 0, rank_doc(9.0, 9.0, 9, 9, 9, 9, 9), "kvtier_inflight_kvcache_results_2.json")
    r = aggregate_option(1, [str(tmp_path / "option_1" / "trial_0")], 1)
    assert r["missing_files"] == [str(rank_dir)] and r["aggregated_read_bandwidth_gbps"] == 0.0


def test_several_results_files_in_one_rank_dir_are_named(tmp_path):
    put(tmp_path, 1, 0, 0, rank_doc(1.0, 0, 0, 0, 1, 1, 1), "kvcache_results_20260101_120000.json")
    put(tmp_path, 1, 0, 0, rank_doc(5.0, 0, 0, 0, 1, 1, 1), "kvcache_results_20260102_120000.json")
    r = aggregate_option(1, [str(tmp_path / "option_1" / "trial_0")], 1)
    assert r["several_results_files"] == [str(tmp_path / "option_1" / "trial_0" / "rank_0")]
    assert r["aggregated_read_bandwidth_gbps"] == 1.0  # the first by name, whatever order the directory lists


def test_no_trial_gives_zeros_and_a_null_p95():
    r = aggregate_option(3, [], 4)
    assert r["aggregated_read_bandwidth_gbps"] == 0.0 and r["aggregated_p95_latency_ms"] is None
    assert (r["trial_count"], r["partial_failure"]) == (0, False)


def test_discover_reads_the_layout_and_the_asked_for_counts_find_what_is_absent(tmp_path):
    full_tree(tmp_path)
    put(tmp_path, 3, 0, 0, rank_doc(1, 1, 1, 1, 1, 1, 1))
    (tmp_path / "option_3" / "trial_x").mkdir()  # not a trial directory
    (tmp_path / "option_9").mkdir()  # not one of the three Options
    layout = discover(str(tmp_path))
    assert (layout.rank_count, layout.trials) == (2, 3)
    assert sorted(layout.trial_dirs) == [1, 3] and len(layout.trial_dirs[3]) == 3
    doc = summarize(str(tmp_path), run_datetime="20260101_120000")
    # Option 3 ran one rank of one trial out of 2 x 3: five rank directories missing
    assert len(doc["options"][3]["missing_files"]) == 5 and doc["partial_failure"] is True
    assert doc["options"][1]["partial_failure"] is False
    assert (doc["total_ranks"], doc["trials_per_option"], doc["npernode"], doc["host_count"]) == (2, 3, 2, 1)
    asked = summarize(str(tmp_path), ranks=3, trials=3, host_count=3, run_datetime="x")
    assert len(asked["options"][1]["missing_files"]) == 3 and asked["npernode"] == 1  # rank_2 of each trial


def test_the_summary_has_mlpstorages_fields_and_the_listed_extras(tmp_path):
    full_tree(tmp_path)
    doc = summarize(str(tmp_path), run_datetime="20260101_120000")
    assert set(doc) == {
        "schema_version", "run_datetime", "npernode", "host_count", "total_ranks", "trials_per_option", "options",
        "partial_failure",
    }  # fmt: skip
    mlpstorage_keys = {
        "option", "aggregated_read_bandwidth_gbps", "aggregated_write_bandwidth_gbps",
        "aggregated_avg_throughput_tokens_per_sec", "aggregated_storage_throughput_tokens_per_sec",
        "aggregated_p95_latency_ms", "rank_count", "trial_count", "partial_failure", "missing_files", "cpu_tier_ranks",
    }  # fmt: skip
    assert set(doc["options"][1]) == mlpstorage_keys | set(EXTRA_OPTION_KEYS)


def test_a_summary_is_written_whole_and_never_over_another(tmp_path):
    full_tree(tmp_path)
    doc = summarize(str(tmp_path), run_datetime="20260101_120000")
    path = write_summary(str(tmp_path), doc)
    assert path.name == "kvcache_run_summary_20260101_120000.json"
    back = json.loads(path.read_text())
    assert back["options"]["1"]["aggregated_p95_latency_ms"] == 12  # JSON keys: the Options as strings, as there
    with pytest.raises(Exception, match="exists"):
        write_summary(str(tmp_path), doc)
    assert json.loads(path.read_text()) == back


# ---- the command line -----------------------------------------------------------------------------------------------
def run_cli(capsys, *argv):
    try:
        rc = main(list(argv))
    except SystemExit as exc:
        rc = exc.code
    out = capsys.readouterr()
    return rc, out.out, out.err.strip().splitlines()


def test_summary_exit_0_when_whole_1_with_a_partial_failure(capsys, tmp_path):
    full_tree(tmp_path)
    rc, out, err = run_cli(capsys, "summary", str(tmp_path), "-o", str(tmp_path / "s.json"))
    assert rc == 0 and err == [] and "summary: " + str(tmp_path / "s.json") in out
    assert json.loads((tmp_path / "s.json").read_text())["options"]["1"]["aggregated_read_bandwidth_gbps"] == 3.0
    rc, out, err = run_cli(capsys, "summary", str(tmp_path), "--ranks", "3", "-o", str(tmp_path / "t.json"))
    assert rc == 1 and json.loads((tmp_path / "t.json").read_text())["partial_failure"] is True


@pytest.mark.parametrize(
    "argv, said",
    [
        (["summary", "{tmp}/nope"], "nope: not a directory"),
        (["summary", "{tmp}/empty"], "no option_1/, option_2/ or option_3/"),
        (["summary", "{tmp}/run", "--ranks", "-1"], "--ranks -1: must be at least 0"),
        (["summary", "{tmp}/run", "--hosts", "0"], "--hosts 0: must be at least 1"),
        (["summary", "{tmp}/run", "--npernode", "0"], "--npernode 0: must be at least 1"),
        (["summary", "{tmp}/run", "--trials", "x"], "invalid int value"),
        (["summary", "{tmp}/run", "-o", "{tmp}/taken.json"], "taken.json: exists"),
        (["summary", "{tmp}/run", "-o", "{tmp}/file/s.json"], "s.json: cannot write"),
        (["shim", "{tmp}/file"], "cannot make the directory"),
        (["shim", "{tmp}/reference"], "kv-cache.py: exists and is no kvtier shim's"),
        (["shim", "{tmp}/d", "--start-delay", "-1"], "seconds, at least 0"),
        (["mystery"], "invalid choice"),
        ([], "required"),
    ],
)
def test_refusals_are_one_line_exit_2(capsys, tmp_path, argv, said):
    full_tree(tmp_path / "run")
    (tmp_path / "empty").mkdir()
    (tmp_path / "taken.json").write_text("{}")
    (tmp_path / "file").write_text("")
    (tmp_path / "reference").mkdir()
    (tmp_path / "reference" / "kv-cache.py").write_text("# the reference's\n")
    rc, _out, err = run_cli(capsys, *[a.format(tmp=tmp_path) for a in argv])
    assert rc == 2 and len(err) == 1 and err[0].startswith("kvtier mlperf") and said in err[0], err
    assert (tmp_path / "reference" / "kv-cache.py").read_text() == "# the reference's\n"
    assert (tmp_path / "taken.json").read_text() == "{}"
    assert not list((tmp_path / "run").glob("kvcache_run_summary_*"))


def test_help_has_examples(capsys):
    for argv in (["--help"], ["shim", "--help"], ["summary", "--help"]):
        rc, out, _ = run_cli(capsys, *argv)
        assert rc == 0 and "examples:" in out
    assert "storage_io_latency_ms.p95" in run_cli(capsys, "--help")[1]
