"""benchmarks/mlperf_reference_vs_kvtier.py without running either benchmark (it needs the reference's checkout and
minutes of disk time, so it is not run in CI): its --help, the one-line answers to a user's mistakes, and how it pairs
rounds into ratios and splits a run's I/O around the window."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import benchmarks.mlperf_reference_vs_kvtier as m

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "mlperf_reference_vs_kvtier.py"


def _run(*args, cwd=None):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60, cwd=cwd)


@pytest.fixture
def fake_reference(tmp_path):
    """The layout of a checkout (kv_cache_benchmark/kv-cache.py, kv_cache/, config.yaml): enough for validation."""
    bench = tmp_path / "storage" / "kv_cache_benchmark"
    (bench / "kv_cache").mkdir(parents=True)
    (bench / "kv-cache.py").write_text("")
    (bench / "config.yaml").write_text("{}\n")
    return tmp_path / "storage"


@pytest.mark.slow
def test_help_has_examples_and_the_clone_command():
    r = _run("--help")
    assert r.returncode == 0
    assert "examples:" in r.stdout and m.CLONE in r.stdout and "--request-model reference" in r.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, says",
    [
        ([], f"--reference DIR: no kv_cache_benchmark/kv-cache.py there; get it with: {m.CLONE} DIR"),
        (["--reference", "/nonexistent/storage"], f"get it with: {m.CLONE} /nonexistent/storage"),
        (["--duration", "ten"], "argument --duration: invalid int value: 'ten'"),
    ],
)
def test_mistakes_without_a_checkout_are_one_line_exit_2(args, says):
    r = _run(*args)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("mlperf_reference_vs_kvtier: ") and says in r.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, says",
    [
        (["--sides", "kvtier"], "--sides kvtier: the reference side is what the ratios divide by"),
        (["--sides", "reference,fio"], "choose from reference, kvtier, kvtier-refmodel"),
        (["--rounds", "0"], "--rounds 0: must be at least 1"),
        (["--storage-capacity-gb", "0"], "must be above 0"),
        (["--storage-capacity-gb", "1e9"], "GiB free, the runs need"),
        (["--config", "/nonexistent.yaml"], "--config /nonexistent.yaml: no such file"),
    ],
)
def test_mistakes_with_a_checkout_are_one_line_exit_2(fake_reference, tmp_path, args, says):
    r = _run("--reference", str(fake_reference), "--dir", str(tmp_path / "d"), *args)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and says in r.stderr, r.stderr


@pytest.mark.slow
def test_an_existing_results_file_is_never_overwritten(fake_reference, tmp_path):
    out = tmp_path / "mine.json"
    out.write_text('{"keep": 1}\n')
    r = _run("--reference", str(fake_reference), "--dir", str(tmp_path / "d"), "--json", str(out))
    assert r.returncode == 2 and "exists" in r.stderr
    assert json.loads(out.read_text()) == {"keep": 1}
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "x.log").write_text("mine")
    r = _run("--reference", str(fake_reference), "--dir", str(tmp_path / "d"), "--json", str(tmp_path / "new.json"),
             "--logs", str(logs))  # fmt: skip
    assert r.returncode == 2 and "not empty" in r.stderr and (logs / "x.log").read_text() == "mine"


def _rec(side, rnd, model="tiny-1b", status="ok", **kw):
    base = {"model": model, "side": side, "round": rnd, "status": status, "device_gbps": 1.0, "cpu_s_per_gib": 1.0}
    return {**base, **kw}


def test_ratios_pair_runs_of_the_same_round_and_skip_failed_ones():
    runs = [
        _rec("reference", 1, cpu_s_per_gib=0.9),
        _rec("kvtier", 1, cpu_s_per_gib=0.3),
        _rec("reference", 2, cpu_s_per_gib=0.5),
        _rec("kvtier", 2, cpu_s_per_gib=0.4),
        _rec("reference", 3, status="stopped: RSS", cpu_s_per_gib=0.1),
        _rec("kvtier", 3, cpu_s_per_gib=0.4),
    ]
    row = next(r for r in m.ratios(runs) if r["side"] == "kvtier" and r["figure"] == "cpu_s_per_gib")
    assert row["per_round"] == [0.333, 0.8] and row["rounds"] == 2 and row["median"] == pytest.approx(0.567, abs=1e-3)
    assert next(r for r in m.ratios(runs) if r["side"] == "kvtier-refmodel")["rounds"] == 0


def test_io_is_split_around_the_window():
    # 2 s of set-up with 1 GB of I/O, a 10 s window with 5 GB, then 4 GB more before the process ends.
    r = {"process_read_bytes": 7e9, "process_write_bytes": 3e9, "cpu_s": 2.0, "wall_s": 20.0, "window_s": 10.0}
    r.update(setup_s=2.0, io_span_s=17.0, reported_read_bytes=7e9, reported_write_bytes=6e9)
    r["io_samples"] = [(0.0, 0, 0), (1.5, 0.5e9, 0.5e9), (6.0, 2e9, 2e9), (11.5, 3e9, 3e9), (17.0, 7e9, 3e9)]
    m.derive(r)
    assert r["io_before_window_bytes"] == 1e9 and r["io_after_window_bytes"] == 4e9
    assert r["device_gbps"] == 0.5 and r["after_window_s"] == 8.0 and r["wall_over_window"] == 2.0
    assert r["device_over_reported_read"] == 1.0 and r["device_over_reported_write"] == 0.5
    assert r["cpu_s_per_gib"] == pytest.approx(2.0 / (10e9 / 2**30), abs=1e-3)


def test_plan_reverses_the_side_order_every_round():
    a = type("A", (), {"rounds": 2, "models": ["tiny-1b", "llama3.1-8b"], "sides": list(m.SIDES)})
    order = m.plan(a)
    assert order[:3] == [("tiny-1b", 1, s) for s in m.SIDES]
    assert order[6:9] == [("tiny-1b", 2, s) for s in reversed(m.SIDES)] and len(order) == 12


def test_a_clean_exit_without_a_summary_is_not_ok(tmp_path):
    # What the reference writes when no request completed in its window: no summary, exit 0.
    out = tmp_path / "ref.json"
    out.write_text(json.dumps({"requests_completed": 0, "end_to_end_latencies": []}))
    rec = {"status": "ok", **m.reported("reference", str(out))}
    assert rec["requests"] == 0 and m.judge(rec) == "no summary (no request completed)"
    assert m.judge({"status": "ok", **m.reported("kvtier", str(tmp_path / "absent.json"))}) == "no results file"
    assert m.judge({"status": "exit 1", "reported": True, "window_s": 20.0}) == "exit 1"


def test_both_tools_get_the_same_flags_and_the_same_tier_bytes(fake_reference, tmp_path):
    a = m.parse_args(["--reference", str(fake_reference), "--dir", str(tmp_path / "d"), "--storage-capacity-gb", "20"])
    assert m.validate(a) is None
    bdir = m.bench_dir(a.reference)
    ref, _ = m.command("reference", a, "tiny-1b", "/c", "/o.json", "py", bdir)
    kv, _ = m.command("kvtier-refmodel", a, "tiny-1b", "/c", "/o.json", "py", bdir)
    ours, _ = m.command("kvtier", a, "tiny-1b", "/c", "/o.json", "py", bdir)

    def flags(argv):
        return dict(zip(argv[::2], argv[1::2], strict=False))

    ref_f, kv_f = flags(ref[2:]), flags(kv[4:])
    assert ref[1] == "kv-cache.py" and kv[2:4] == ["replay.cli", "bench"]
    # The same number in the same unit: the reference reads GiB, kvtier is told GiB (its default) explicitly.
    assert ref_f["--storage-capacity-gb"] == kv_f["--storage-capacity-gb"] == "20" and kv_f.pop("--size-unit") == "GiB"
    assert kv_f.pop("--request-model") == "reference" and ref_f == kv_f
    assert flags(ours[4:])["--request-model"] == "kvtier"  # kvtier's own model, named (it is not the default)
    assert ref_f["--config"].endswith("kv_cache_benchmark/config.yaml") and ref_f["--gpu-mem-gb"] == "0"
