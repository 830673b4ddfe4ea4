"""Parser and distiller on recorded captures (tests/tracing/fixtures/)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st
from trace_helpers import FIXTURES, REPO, needs_fio

from tracing.distill import distill, main, render_job, size_split, validate_job
from tracing.histparse import Bucket, Stats, TraceParseError, parse_text, parse_trace, parse_value


def load(name):
    return parse_trace((FIXTURES / name).read_text())


def test_every_bucket_form():
    tr = load("bucket_forms.txt")
    b = tr.hist("bs_read_bytes").buckets
    assert b[0] == Bucket(0, 1, 1)  # [0]
    assert b[1] == Bucket(1, 2, 2)  # [1]
    assert b[3] == Bucket(512, 1024, 80)  # [512, 1K): mixed units
    assert b[5] == Bucket(4096, 8192, 10)
    assert b[6] == Bucket(1 << 20, 2 << 20, 7)
    w = tr.hist("bs_write_bytes").buckets
    assert w[1] == Bucket(1 << 20, None, 10)  # [1M, ...)
    n = tr.hist("neg_usecs").buckets
    assert n[0] == Bucket(None, 0, 4)  # (..., 0)
    assert n[1] == Bucket(-4, -2, 1)
    assert n[2] == Bucket(-2, 0, 2)  # closed [-2, -1]
    assert n[3] == Bucket(0, 1, 3)
    assert tr.hist("qdepth_read").buckets[-1] == Bucket(256, None, 1)  # lhist [256, ...)
    assert tr.hist("empty_map").buckets == []
    assert tr.get("q2c_stats_read_usecs") == Stats(100, 57000, 5700000)
    assert tr.number("io_pair", "read,4096") == 3
    assert tr.window_ns == 2_000_000_000 and not tr.truncated
    assert tr.meta["layers_off"].startswith("io_uring")


@pytest.mark.parametrize(
    "text,value", [("0", 0), ("1K", 1024), ("512", 512), ("-4", -4), ("2M", 2 << 20), ("1G", 1 << 30)]
)
def test_parse_value(text, value):
    assert parse_value(text) == value


@given(st.integers(min_value=0, max_value=1 << 40))
def test_log2_bucket_text_roundtrip(v):
    # bpftrace prints a log2 bucket's edges with the largest exact suffix
    def fmt(x):
        for s, m in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
            if x and x % m == 0:
                return f"{x // m}{s}"
        return str(x)

    lo = 1 << v.bit_length() - 1 if v > 1 else v
    line = f"[{fmt(lo)}, {fmt(lo * 2)})   7 |@@@|" if v > 1 else f"[{v}]   7 |@|"
    tr = parse_text(f"@h:\n{line}\n\ncapture_window_ns: 1\n")
    b = tr.hist("h").buckets[0]
    assert b.lo <= v < b.hi and b.count == 7


def test_text_and_json_of_the_same_kind_agree():
    t, j = load("python_pwrite_fsync_pread.txt"), load("python_pwrite_fsync_pread.json")
    for tr in (t, j):
        assert not tr.truncated and tr.window_ns > 0
        assert tr.hist("sys_pwrite64_usecs").total > 0
        assert tr.hist("fdatasync_usecs").total > 0
        assert tr.hist("write_fsync_gap_usecs").total > 0
        assert tr.hist("fadvise_read_gap_usecs").total > 0
        assert "syscalls" in tr.meta["layers_on"]
    assert j.meta["missed_events"].isdigit()


def test_truncated_text_keeps_what_it_has():
    tr = load("truncated.txt")
    assert tr.truncated
    assert tr.hist("bs_read_bytes").total == 50
    assert tr.hist("bs_write_bytes").total == 25  # the cut line is dropped, reported
    assert any("cut bucket line" in p for p in tr.problems)


def test_truncated_json_keeps_what_it_has():
    tr = load("truncated.json")
    assert tr.truncated and any("cut JSON" in p for p in tr.problems)


def test_not_a_trace():
    with pytest.raises(TraceParseError):
        parse_trace("hello\nworld\n")


def test_bssplit_uses_every_bucket_form():
    # the peer dropped [512, 1K), [0] and [1]; here [0] and [1] round up to one
    # sector and [512, 1K) is kept as 512
    tr = load("bucket_forms.txt")
    split, _notes = size_split(tr, "read")
    sizes = dict(split)
    assert sizes[512] >= 80 * 100 // 100 - 3
    assert 4096 in sizes and (1 << 20) in sizes
    assert sum(sizes.values()) == 100
    wsplit, _ = size_split(tr, "write")
    assert dict(wsplit) == {128 << 10: 75, 1 << 20: 25}


def test_distill_figures_from_fixture():
    tr = load("bucket_forms.txt")
    d = distill(tr, process="vllm", size="1g")
    assert d.rwmixread == round(100 * 100 / 140)
    assert d.rw == "randrw" and d.percentage_random == (5, 95)  # reads sequential, writes random
    assert d.iodepth == 4 and d.figures["iodepth_little"] == pytest.approx(4.0, abs=0.01)
    # when the racy sampled counter and Little's law disagree, Little's law wins
    tr.maps["q2c_stats_read_usecs"][""] = Stats(100, 1000, 100000)
    tr.maps["q2c_stats_write_usecs"][""] = Stats(40, 1000, 40000)
    d = distill(tr, size="1g")
    assert d.iodepth == 1 and any("Little's law" in n for n in d.notes)
    assert distill(tr, process="vllm").job_name == "vllm-distilled"


def test_distill_fio_fixture_matches_known_pattern():
    # recorded: fio randrw rwmixread=70 bs=128k libaio iodepth=8 direct=1
    d = distill(load("fio_randrw70_128k_qd8.txt"))
    assert abs(d.rwmixread - 70) <= 3
    assert d.bssplit_read == [(128 << 10, 100)] and d.bssplit_write == [(128 << 10, 100)]
    # fio reaps and refills: depths 1..8 about evenly at dispatch (median 5,
    # Little's law 4.7); the level it fills up to is 8
    assert d.iodepth == 8
    assert d.rw == "randrw" and d.ioengine == "libaio" and d.thinktime_us is None


@needs_fio
@pytest.mark.parametrize(
    "name",
    [
        "bucket_forms.txt",
        "fio_randrw70_128k_qd8.txt",
        "python_pwrite_fsync_pread.txt",
        "python_pwrite_fsync_pread.json",
    ],
)
@pytest.mark.slow
def test_every_generated_job_passes_fio_parse_only(name):
    tr = load(name)
    job = render_job(distill(tr, process="x"), source=name, tr=tr)
    assert "filename=${TARGET}" in job and "direct=1" in job
    assert validate_job(job) is None


def test_main_writes_job_and_json(tmp_path):
    out, js = tmp_path / "job.fio", tmp_path / "h.json"
    rc = main(
        [
            "-i",
            str(FIXTURES / "fio_randrw70_128k_qd8.txt"),
            "-o",
            str(out),
            "--dump-json",
            str(js),
            "--process",
            "fio",
            "--runtime-s",
            "3",
            "--size",
            "64m",
        ]
    )
    assert rc == 0
    text = out.read_text()
    assert "[fio-distilled]" in text and "runtime=3" in text and "size=64m" in text
    assert "bssplit=128k/100,128k/100" in text
    assert json.loads(js.read_text())["maps"]["completed_read"][""] > 0


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["-i", "/nonexistent/trace.txt"], "cannot read"),
        (["-i", str(FIXTURES / "truncated.json")], "truncated"),
        (["-i", str(FIXTURES / "truncated.json"), "--allow-truncated"], "no capture window"),
        (["-i", "x", "--bogus"], "unrecognized"),
        ([], "required"),
    ],
)
def test_main_user_errors_are_one_line_exit_2(argv, msg, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and msg in err[0] and err[0].startswith("kvtier distill: ")


def test_truncated_trace_with_window_given(tmp_path):
    out = tmp_path / "j.fio"
    assert (
        main(
            [
                "-i",
                str(FIXTURES / "truncated.txt"),
                "--window-s",
                "2",
                "-o",
                str(out),
                "--size",
                "64m",
                "--allow-truncated",
            ]
        )
        == 0
    )
    text = out.read_text()
    assert "truncated" in text and "rwmixread=50" in text


def test_empty_trace_is_a_user_error(tmp_path):
    p = tmp_path / "t.txt"
    p.write_text("Attaching 3 probes...\ncapture_window_ns: 1000000000\n@issued_read: 0\n")
    assert main(["-i", str(p)]) == 2


def test_module_entry_point_runs_without_warnings():
    p = subprocess.run(
        [
            sys.executable,
            "-W",
            "error",
            "-m",
            "tracing.distill",
            "-i",
            str(FIXTURES / "fio_randrw70_128k_qd8.txt"),
            "--no-validate",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("; traced-distilled")


def test_tracing_imports_nothing_from_other_packages():
    code = (
        "import sys, tracing, tracing.distill, tracing.session, tracing.histparse; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('kvconnector', 'replay', 'matplotlib', 'numpy')]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stdout + p.stderr


def test_report_table_names_every_layer(capsys):
    from tracing.report import main as report_main

    assert report_main([str(FIXTURES / "python_pwrite_fsync_pread.txt")]) == 0
    out = capsys.readouterr().out
    for what in (
        "read family",
        "write family",
        "Q2D read",
        "D2C write",
        "fdatasync",
        "write -> fsync",
        "fadvise -> read",
    ):
        assert what in out
    assert report_main([str(FIXTURES / "fio_randrw70_128k_qd8.txt")]) == 0
    assert "NOT traced:" in capsys.readouterr().out  # layers left out are said


@pytest.mark.slow
def test_report_plots(tmp_path):
    pytest.importorskip("matplotlib")
    from tracing.report import main as report_main

    assert report_main([str(FIXTURES / "python_pwrite_fsync_pread.txt"), "--plots", str(tmp_path)]) == 0
    names = {p.name for p in tmp_path.glob("*.png")}
    assert {"latency_by_layer.png", "request_sizes.png", "queue_depth.png"} <= names
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in tmp_path.glob("*.png"))


def test_report_user_error(capsys):
    from tracing.report import main as report_main

    assert report_main(["/nonexistent"]) == 2
    assert capsys.readouterr().err.startswith("report: cannot read")


@pytest.mark.slow
def test_report_plots_replace_whole_or_not_at_all(tmp_path, monkeypatch, capsys):
    """A plot that fails half-way leaves the user's earlier plot byte for byte and no temp file; a --plots path under a
    file is one line and exit 2."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from tracing.report import main as report_main

    earlier = tmp_path / "latency_by_layer.png"
    earlier.write_bytes(b"the user's earlier plot")
    real_savefig = Figure.savefig

    def half_then_fail(self, fname, **kw):
        real_savefig(self, fname, **kw)
        with open(fname, "r+b") as f:
            f.truncate(100)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", half_then_fail)
    trace = str(FIXTURES / "python_pwrite_fsync_pread.txt")
    assert report_main([trace, "--plots", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("report: cannot write") and "No space left" in err and err.count("\n") == 1
    assert earlier.read_bytes() == b"the user's earlier plot"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latency_by_layer.png"]

    monkeypatch.setattr(Figure, "savefig", real_savefig)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert report_main([trace, "--plots", str(blocker / "plots")]) == 2
    assert capsys.readouterr().err == f"report: cannot write plots to {blocker / 'plots'}: Not a directory\n"
