"""`kvtier merge`: result files of several runs become one the way a run of all of them would report it (sums,
merged histograms, the union of the windows, a device counted once per host and overlapping window), merged files
merge again to the same figures, and files that cannot be merged are refused with one line naming why."""

import copy
import json
import subprocess
import sys

import pytest
from bench_helpers import run

from kvconnector.histogram import LatencyHistogram
from replay.synthetic.merge import main, merge_results, union_s

MERGE = [sys.executable, "-m", "replay.synthetic.merge"]  # `kvtier merge` once in replay/cli.py SUBCOMMANDS


def test_union_counts_overlapping_time_once():
    assert union_s([(0, 10), (5, 12)]) == 12  # overlapping ranks: the span
    assert union_s([(0, 10), (20, 25)]) == 15  # trials one after another: their sum
    assert union_s([(0, 10), (2, 3), (9, 14), (30, 31)]) == 15


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two real short runs one after another (seeds 11 and 12), written as files."""
    paths = []
    for seed in (11, 12):
        tmp = tmp_path_factory.mktemp(f"run-{seed}")
        doc = run(tmp, seed=seed, duration=1.5)
        assert doc.pop("_rc") == 0
        paths.append(tmp / "out.json")
    return paths


def _merge(tmp_path, *args):
    return subprocess.run(MERGE + [str(a) for a in args], capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_merged_file_sums_counts_merges_histograms_and_takes_the_union_of_windows(runs, tmp_path):
    out = tmp_path / "all.json"
    p = _merge(tmp_path, *runs, "-o", out)
    assert p.returncode == 0, p.stderr
    doc = json.loads(out.read_text())
    parts = [json.loads(r.read_text()) for r in runs]
    s = doc["summary"]
    assert s["total_requests"] == sum(d["summary"]["total_requests"] for d in parts) > 0
    assert doc["config"]["num_users"] == 8 and s["num_clients"] == 2
    for op in ("read", "write"):
        assert doc["tiers"]["disk"][op]["bytes"] == sum(d["tiers"]["disk"][op]["bytes"] for d in parts)
    assert doc["storage_stats"]["total_write_bytes"] == doc["tiers"]["disk"]["write"]["bytes"]
    # Percentiles from the pooled histogram, not from the files' percentiles.
    pooled = LatencyHistogram()
    for d in parts:
        pooled.merge(LatencyHistogram.decode(d["request_histograms"]["end_to_end"]))
    assert s["end_to_end_latency_ms"]["p99"] == pytest.approx(pooled.percentile_ms(99), abs=1e-3)
    # Runs one after another: the window is the sum of theirs (the longest alone would double the rates).
    elapsed = [d["summary"]["elapsed_time"] for d in parts]
    assert s["elapsed_time"] == pytest.approx(sum(elapsed), abs=0.01) and doc["duration_seconds"] == s["elapsed_time"]
    span = parts[1]["summary"]["window"]["end_unix_s"] - parts[0]["summary"]["window"]["start_unix_s"]
    assert span > sum(elapsed)
    assert s["window"]["end_unix_s"] - s["window"]["start_unix_s"] == pytest.approx(span, abs=0.01)
    # Each file's own results are kept, named by its path.
    assert [c["source"] for c in doc["clients"]] == [str(r) for r in runs]
    assert [c["summary"]["total_requests"] for c in doc["clients"]] == [d["summary"]["total_requests"] for d in parts]


@pytest.mark.slow
def test_merging_a_merged_file_again_gives_the_flat_merge(runs, tmp_path):
    parts = [json.loads(r.read_text()) for r in runs]
    third = copy.deepcopy(parts[1])  # a third run: the second, moved 100 s later on another host
    third["environment"]["hostname"] = "other-host"
    for k in ("start_unix_s", "end_unix_s"):
        third["summary"]["window"][k] += 100
    flat = merge_results([*parts, third], ["a", "b", "c"])
    nested = merge_results([merge_results(parts, ["a", "b"]), third], ["ab", "c"])
    for path in (("summary", "total_requests"), ("summary", "elapsed_time"), ("block_device", "read_bytes")):
        assert nested[path[0]][path[1]] == pytest.approx(flat[path[0]][path[1]])
    assert nested["summary"]["end_to_end_latency_ms"] == flat["summary"]["end_to_end_latency_ms"]


@pytest.mark.slow
def test_a_device_counts_once_per_host_and_overlapping_window(runs):
    a, b = (json.loads(r.read_text()) for r in runs)
    # b moved to overlap a in time on the same host: both saw the same device I/O, counted once (the longer window).
    for k in ("start_unix_s", "end_unix_s"):
        b["summary"]["window"][k] += a["summary"]["window"]["start_unix_s"] - b["summary"]["window"]["start_unix_s"]
    longer = max((a, b), key=lambda d: d["summary"]["elapsed_time"])
    same_host = merge_results([a, b], ["a", "b"])
    assert same_host["block_device"]["read_bytes"] == longer["block_device"]["read_bytes"]
    # The same on two hosts: two devices, both counted.
    b["environment"]["hostname"] = "other-host"
    two_hosts = merge_results([a, b], ["a", "b"])
    assert two_hosts["block_device"]["read_bytes"] == a["block_device"]["read_bytes"] + b["block_device"]["read_bytes"]
    assert "other-host:" in two_hosts["block_device"]["device"]


@pytest.mark.slow
def test_files_that_cannot_be_merged_are_refused_with_one_line(runs, tmp_path, capsys):
    a, b = runs
    other = json.loads(b.read_text())
    other["config"]["io_mode"] = "buffered"
    (tmp_path / "buffered.json").write_text(json.dumps(other))
    (tmp_path / "replay.json").write_text(json.dumps({"request_throughput": 1.0, "ttft_ms": {}}))
    (tmp_path / "exists.json").write_text("{}\n")
    trials = {"kind": "kvtier-bench-trials", "summary": {"elapsed_time": 3.0}, "per_trial": []}
    (tmp_path / "trials.json").write_text(json.dumps(trials))
    out = tmp_path / "x.json"
    cases = [
        ((a, tmp_path / "buffered.json", "-o", out), "config key io_mode is 'buffered'"),
        ((a, a, "-o", out), "given twice"),
        ((a, b, tmp_path / "replay.json", "-o", out), "a `kvtier replay` summary"),
        ((a, b, "-o", a), "--output " + str(a) + ": is also an input"),
        ((a, b, "-o", tmp_path / "exists.json"), "exists; pass --force"),
        ((a, tmp_path / "missing.json", "-o", out), "no such file"),
        ((a, tmp_path / "trials.json", "-o", out), "merge its per-trial files"),
    ]
    # The same run under another name (a copy) would count twice as well.
    (tmp_path / "copy.json").write_text(a.read_text())
    cases.append(((a, b, tmp_path / "copy.json", "-o", out), "hold the same run"))
    for args, needle in cases:
        rc = main([str(x) for x in args])
        err = capsys.readouterr().err
        assert rc == 2 and needle in err, (args, err)
        assert len(err.strip().splitlines()) == 1 and err.startswith("kvtier merge: ")
        assert not out.exists()
    assert (tmp_path / "exists.json").read_text() == "{}\n"
    # --force replaces an existing output.
    assert main([str(a), str(b), "-o", str(tmp_path / "exists.json"), "--force"]) == 0
    assert json.loads((tmp_path / "exists.json").read_text())["summary"]["num_clients"] == 2
