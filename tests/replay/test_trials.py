"""`kvtier bench --trials N` and `kvtier check`: real short trials, their medians from the per-trial files, a trial
cut by SIGINT, and the spec's submission checklist over the files they leave."""

import copy
import json
import os
import signal
import statistics
import subprocess
import sys
import time

import pytest
from bench_helpers import write_config
from helpers import wait_for

from replay.synthetic.check import main as check_main
from replay.synthetic.cli import main as bench_main
from replay.synthetic.view import STATUS_ENV

pytestmark = pytest.mark.slow  # real runs: 3 trials of 2 s, and one cut short

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    """`--trials 3 --submission-check` on a short storage-only run: the trials document, the per-trial documents, the
    exit status and what was printed."""
    tmp = tmp_path_factory.mktemp("trials")
    cfg = write_config(tmp, duration=2, num_users=3, cpu_mem_gb=0, generation_mode="none")
    out = tmp / "stress.json"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "replay.cli",
            "bench",
            "--config",
            cfg,
            "--trials",
            "3",
            "--submission-check",
            "--output",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.exists(), (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    doc = json.loads(out.read_text())
    trials = [json.loads((tmp / f"stress-trial{i}.json").read_text()) for i in (1, 2, 3)]
    return {"rc": r.returncode, "stdout": r.stdout, "stderr": r.stderr, "doc": doc, "trials": trials, "dir": tmp}


def test_three_trials_each_with_its_own_file_seed_and_fresh_cache(three):
    doc, trials = three["doc"], three["trials"]
    assert doc["kind"] == "kvtier-bench-trials" and doc["status"] == "completed"
    assert doc["trials_requested"] == doc["trials_completed"] == 3
    assert [t["status"] for t in trials] == ["completed"] * 3
    assert {t["config"]["seed"] for t in trials} == {11}  # the same seed unless --vary-seed
    # Each trial ran in its own cache directory, removed afterwards.
    dirs = {t["environment"]["cache_dir"] for t in trials}
    assert len(dirs) == 3 and not any(os.path.exists(d) for d in dirs)
    assert [p["file"] for p in doc["per_trial"]] == [str(three["dir"] / f"stress-trial{i}.json") for i in (1, 2, 3)]


def test_medians_come_from_the_per_trial_values(three):
    doc, trials = three["doc"], three["trials"]
    for key, path in (
        ("avg_throughput_tokens_per_sec", ("avg_throughput_tokens_per_sec",)),
        ("cache_stats.decode_bytes_read_gb", ("cache_stats", "decode_bytes_read_gb")),
        ("end_to_end_latency_ms.p95", ("end_to_end_latency_ms", "p95")),
    ):
        values = []
        for t in trials:
            v = t["summary"]
            for part in path:
                v = v[part]
            values.append(v)
        a = doc["aggregate"][key]
        assert a["values"] == values
        assert a["median"] == statistics.median(values) and a["min"] == min(values) and a["max"] == max(values)
        assert a["cv"] == pytest.approx(statistics.stdev(values) / statistics.fmean(values), abs=1e-4)
        # The trials document's summary is the medians, in a run summary's shape.
        s = doc["summary"]
        for part in path:
            s = s[part]
        assert s == a["median"]
    assert "median" in three["stdout"] and "decode_bytes_read_gb" in three["stdout"]  # the closing table


def test_submission_check_after_the_trials_names_what_fails(three):
    assert three["rc"] == 1  # the trials ran; the checklist fails on a 2 s, seed 11 run of a small model
    out = three["stdout"]
    assert "FAIL  --seed 42 used" in out and "FAIL  --duration >= 300 s" in out
    assert "PASS  --gpu-mem-gb 0 (storage isolation)" in out
    assert "PASS  --generation-mode none (pure storage)" in out
    assert "PASS  3-5 trials per configuration" in out
    assert "PASS  correct metrics for the cpu_mem setting" in out
    # these trials ran kvtier's request model in GB (the test helpers' settings), not the reference's semantics
    assert "FAIL  the reference's semantics (its request model, sizes in GiB, device I/O)" in out
    assert "--request-model kvtier" in out and "sizes in GB" in out


def _as_submission(doc: dict, model: str) -> dict:
    """A real trial's document as a submission run would write it: seed 42, 300 s, the spec's model, and a drive that
    sysfs describes (this machine's disk is virtio, which has no model or firmware)."""
    d = copy.deepcopy(doc)
    d["config"].update(seed=42, duration=300, model=model, request_model="reference", size_unit="GiB")
    d["model"]["name"] = model
    d["environment"]["drive"] = {"name": "nvme0n1", "model": "Example NVMe", "firmware": "1.0"}
    return d


def test_check_passes_a_complete_submission_and_fails_a_short_one(three, tmp_path, capsys):
    paths = []
    for model in ("llama3.1-8b", "llama3.1-70b-instruct"):
        for i, t in enumerate(three["trials"]):
            p = tmp_path / f"{model}-trial{i}.json"
            p.write_text(json.dumps(_as_submission(t, model)))
            paths.append(str(p))
    assert check_main(paths) == 0
    out = capsys.readouterr().out
    assert out.count("PASS") == 11 and "FAIL" not in out
    # Two trials of the 70B configuration only: the trial count fails, and so does 8B's absence.
    assert check_main(paths[3:5]) == 1
    out = capsys.readouterr().out
    assert "FAIL  3-5 trials per configuration: llama3.1-70b-instruct" in out
    assert "FAIL  both 8B and 70B results included: no llama3.1-8b run" in out
    # The machine's own virtio disk has no model or firmware in sysfs: said, not guessed.
    assert check_main([str(three["dir"] / "stress-trial1.json")]) == 1
    out = capsys.readouterr().out
    assert "FAIL  system info documented" in out and "no drive model" in out


def test_check_refuses_what_is_not_a_result(tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text("{not json")
    assert check_main([str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kvtier check: ") and "not JSON" in err[0]
    assert check_main([str(tmp_path / "missing.json")]) == 2


def test_a_signal_during_a_trial_keeps_the_completed_ones_and_vary_seed_varies(tmp_path):
    cfg = write_config(tmp_path, duration=2, num_users=3, cpu_mem_gb=0)
    status = tmp_path / "live.status"  # each trial's live snapshots (every 0.5 s of its window)
    proc = subprocess.Popen(
        [sys.executable, "-m", "replay.cli", "bench", "--config", cfg, "--trials", "3", "--vary-seed"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, **{STATUS_ENV: str(status)}),
    )
    deadline = time.monotonic() + 60
    seen = ""
    while "trial 2 of 3" not in seen and time.monotonic() < deadline:
        seen += proc.stderr.readline()
    assert "trial 2 of 3" in seen, seen
    status.unlink(missing_ok=True)  # trial 1's last snapshot; trial 1 is over once trial 2 is announced
    wait_for(status.exists, timeout_s=60, what="a live snapshot from trial 2's window")
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode == 130
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["status"] == "interrupted" and doc["trials_completed"] == 1
    assert [t["status"] for t in doc["per_trial"]] == ["completed", "interrupted"]
    assert [t["seed"] for t in doc["per_trial"]] == [11, 12]  # --vary-seed: seed + i - 1
    assert doc["aggregate"]["total_requests"]["n"] == 1  # medians over the completed trial only
    assert json.loads((tmp_path / "out-trial2.json").read_text())["status"] == "interrupted"
    assert not (tmp_path / "out-trial3.json").exists()


def test_trials_zero_is_a_one_line_mistake(tmp_path, capsys):
    cfg = write_config(tmp_path)
    assert bench_main(["--config", cfg, "--trials", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["kvtier bench: --trials 0: give 1 to 1000"]
    assert not (tmp_path / "out.json").exists()


def test_trials_under_mpirun_are_refused_not_ignored(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")  # what mpirun sets for each rank
    assert bench_main(["--config", write_config(tmp_path), "--trials", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kvtier bench: --trials and --submission-check do not run under mpirun")
    assert not (tmp_path / "out.json").exists()


def test_check_counts_a_trial_once_whichever_files_name_it(three, capsys):
    doc = str(three["dir"] / "stress.json")
    check_main([doc, str(three["dir"] / "stress-trial2.json")])
    assert "runs completed: 3 runs" in capsys.readouterr().out
    check_main([str(three["dir"] / f"stress-trial{i}.json") for i in (1, 2, 3)])
    assert "runs completed: 3 runs" in capsys.readouterr().out


def test_the_median_summary_keeps_a_verdict_only_where_every_trial_agrees():
    from replay.synthetic.trials import aggregate, median_summary

    runs = [
        {"total_requests": n, "qos_stats": {"batch": {"latency_p95_ms": p95, "sla_met": met}}, "status": "completed"}
        for n, p95, met in ((1, 3.0, True), (3, 5.0, False), (2, 4.0, True))
    ]
    s = median_summary(runs, aggregate(runs))
    assert s == {
        "total_requests": 2,
        "qos_stats": {"batch": {"latency_p95_ms": 4.0, "sla_met": None}},
        "status": "completed",
    }


def test_the_trials_figure_shows_each_trial_and_the_median(three, tmp_path):
    import matplotlib.image

    from replay.synthetic.trials import TABLE_KEYS, write_trials_plot

    path = write_trials_plot(three["doc"], str(tmp_path / "plots"))
    assert path == str(tmp_path / "plots" / "trials.png")
    img = matplotlib.image.imread(path)
    rows = -(-len([k for k in TABLE_KEYS if k in three["doc"]["aggregate"]]) // 3)
    assert img.shape[0] == pytest.approx(2.6 * rows * 110, abs=2) and img.shape[1] == pytest.approx(11 * 110, abs=2)
    assert not list(tmp_path.glob("plots/*.tmp*"))
