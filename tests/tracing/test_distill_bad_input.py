"""`kvtier distill` on bad input: truncated traces, files that are not traces,
numbers no capture has, values that would inject fio options, bad flags and
outputs. Each answer is one line on stderr naming the command, exit status 2,
nothing written; every job that is written passes fio --parse-only."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from trace_helpers import FIXTURES, REPO, needs_fio

from tracing.distill import Distilled, DistillError, main, render_job, validate_job
from tracing.histparse import parse_trace

TEXT = FIXTURES / "fio_randrw70_128k_qd8.txt"
TEXT_IDLE = FIXTURES / "python_pwrite_fsync_pread.txt"  # has thinktime, percentage_random, an 8g footprint
JSON = FIXTURES / "python_pwrite_fsync_pread.json"


def run(argv, capsys):
    rc = main([str(a) for a in argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err.splitlines()


def assert_one_line_error(rc, err, *words):
    assert rc == 2, err
    assert len(err) == 1, err
    assert err[0].startswith("kvtier distill: "), err
    assert "Traceback" not in err[0]
    for w in words:
        assert w in err[0], err


def job_lines(text):
    return [ln for ln in text.splitlines() if ln and not ln.startswith(";")]


# --- truncated traces -----------------------------------------------------------


def _cut(src, how):
    """A whole recorded capture, cut one of the ways captures get cut."""
    text = src.read_text()
    lines = text.splitlines(keepends=True)
    if how == "half the lines":
        return "".join(lines[: len(lines) // 2])
    if how == "mid-line":
        return text[: len(text) // 2 + 7]
    if how == "inside a histogram":  # whole bucket lines, but not the blank line ending it
        at = next(i for i, ln in enumerate(lines) if ln.startswith("@qdepth_read"))
        return "".join(lines[: at + 3])
    assert how == "end marker only"
    return "".join(ln for ln in lines if "missed_events" not in ln)


CUTS = [
    (src, how)
    for src in (TEXT_IDLE, JSON)
    for how in ("half the lines", "mid-line", "inside a histogram", "end marker only")
    if not (src is JSON and how == "inside a histogram")
]  # a JSON histogram is one record: mid-line


@pytest.mark.parametrize("src,how", CUTS, ids=[f"{s.suffix[1:]}-{h}" for s, h in CUTS])
def test_truncated_trace_is_refused_unless_allowed(src, how, tmp_path, capsys):
    cut = tmp_path / ("cut" + src.suffix)
    cut.write_text(_cut(src, how))
    out = tmp_path / "job.fio"
    rc, _, err = run(["-i", cut, "-o", out], capsys)
    assert_one_line_error(rc, err, "truncated", "--allow-truncated")
    assert not out.exists()
    # what is there, on request: the job says it is cut, stderr warns once
    rc, _, err = run(["-i", cut, "-o", out, "--allow-truncated", "--window-s", "4", "--no-validate"], capsys)
    if rc == 0:
        assert "TRUNCATED" in out.read_text()
        assert len(err) == 1 and "warning" in err[0] and "truncated" in err[0]
    else:  # cut before any block I/O: said, one line
        assert_one_line_error(rc, err)


@pytest.mark.parametrize("how,why", [("mid-line", "cut mid-line"), ("inside a histogram", "cut off")])
def test_raw_bpftrace_text_cut_is_seen_without_the_wrapper_marker(how, why, tmp_path, capsys):
    # bpftrace run by hand: no "# kvtier" header or end marker; the cut is
    # seen by the line or the histogram it leaves unfinished
    raw = tmp_path / "raw.txt"
    raw.write_text(
        "".join(ln for ln in TEXT_IDLE.read_text().splitlines(keepends=True) if not ln.startswith("# kvtier"))
    )
    whole = run(["-i", raw, "--no-validate"], capsys)
    assert whole[0] == 0, whole[2]
    raw.write_text(_cut(raw, how))
    rc, _, err = run(["-i", raw], capsys)
    assert_one_line_error(rc, err, "truncated", why)
    assert "end marker" not in err[0]


def test_a_whole_trace_with_some_layers_says_what_it_assumed(tmp_path, capsys):
    # not truncated (END line and end marker present), but only counts: every
    # figure the job lacks is named in its comments, the size included
    p = tmp_path / "some.txt"
    p.write_text(
        "# kvtier layers_on: block\nAttaching 3 probes...\ncapture_window_ns: 2000000000\n"
        "@completed_read: 100\n@completed_write: 50\n# kvtier missed_events: 0\n"
    )
    rc, job, err = run(["-i", p], capsys)
    assert rc == 0 and err == [], err
    for said in ("read sizes missing", "iodepth=1 assumed", "random access assumed", "size=1g assumed"):
        assert said in job
    assert "TRUNCATED" not in job and "rwmixread=67" in job


def test_whole_trace_is_not_truncated(tmp_path, capsys):
    for src in (TEXT, TEXT_IDLE, JSON):
        out = tmp_path / "job.fio"
        rc, _, err = run(["-i", src, "-o", out, "--no-validate"], capsys)
        assert rc == 0 and err == [], err
        assert "TRUNCATED" not in out.read_text()


def test_half_a_trace_no_longer_loses_job_fields_silently(tmp_path, capsys):
    # the reported case: the first half of a whole trace gave exit 0 and a job
    # without size, percentage_random and thinktime
    whole = tmp_path / "whole.fio"
    assert run(["-i", TEXT_IDLE, "-o", whole, "--no-validate"], capsys)[0] == 0
    assert "thinktime=" in whole.read_text() and "percentage_random=" in whole.read_text()
    half = tmp_path / "half.txt"
    half.write_text(_cut(TEXT_IDLE, "half the lines"))
    rc, _, err = run(["-i", half], capsys)
    assert_one_line_error(rc, err, "truncated", "end marker")


# --- files that are not traces ---------------------------------------------------

NOT_TRACES = {
    "empty.txt": b"",
    "blank.txt": b"\n\n  \n",
    "garbage.txt": b"hello\nworld\n",
    "binary.bin": bytes(range(256)) * 8,
    "other.json": b'{"a": 1}\n{"b": [1, 2]}\n',
    "list.json": b"[1, 2, 3]\n",
    "csv.csv": b"Timestamp,Request tokens\n1,2\n",
}


@pytest.mark.parametrize("name", sorted(NOT_TRACES))
def test_not_a_trace_says_what_it_is_not(name, tmp_path, capsys):
    p = tmp_path / name
    p.write_bytes(NOT_TRACES[name])
    rc, _, err = run(["-i", p], capsys)
    assert_one_line_error(rc, err, "no bpftrace histograms found", str(p))
    assert "--window-s" not in err[0]  # the old, misleading hint


@pytest.mark.slow
def test_directory_and_fifo_are_refused_without_reading(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, word in ((tmp_path, "directory"), (fifo, "not a regular file")):
        # a subprocess: reading a FIFO would block the test forever
        p = subprocess.run(
            [sys.executable, "-m", "tracing.distill", "-i", str(path)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=30,
        )
        err = p.stderr.splitlines()
        assert p.returncode == 2 and len(err) == 1 and word in err[0], p.stderr


# --- numbers no capture has, and JSON of the wrong shape --------------------------


def _json_with(tmp_path, name, old, new):
    text = JSON.read_text()
    assert old in text
    p = tmp_path / name
    p.write_text(text.replace(old, new, 1))
    return p


def _text_with(tmp_path, name, pattern, repl):
    lines = TEXT_IDLE.read_text().splitlines(keepends=True)
    hit = [i for i, ln in enumerate(lines) if ln.startswith(pattern)]
    assert hit, pattern
    lines[hit[0]] = repl + "\n"
    p = tmp_path / name
    p.write_text("".join(lines))
    return p


BAD_NUMBERS = [
    ("json NaN", "json", '"@completed_read": ', '"@completed_read": NaN, "@x": ', "not an integer"),
    ("json Infinity", "json", '"@completed_read": ', '"@completed_read": Infinity, "@x": ', "not an integer"),
    ("json 1e400", "json", '"@completed_read": ', '"@completed_read": 1e400, "@x": ', "not an integer"),
    ("json fraction", "json", '"@completed_read": ', '"@completed_read": 1.7, "@x": ', "not an integer"),
    ("json string count", "json", '"count": ', '"count": "x", "y": ', "not an integer"),
    ("json negative count", "json", '"@completed_read": ', '"@completed_read": -', "negative"),
    (
        "json hist not a list",
        "json",
        '{"type": "hist", "data": {"@bs_read_bytes": [',
        '{"type": "hist", "data": {"@bs_read_bytes": "abc", "@y": [',
        "not a list",
    ),
    ("json bucket not an object", "json", '"@bs_read_bytes": [{', '"@bs_read_bytes": [7, {', "not an object"),
    (
        "json data not an object",
        "json",
        '{"type": "map", "data": {',
        '{"type": "map", "data": 5, "x": {',
        "not an object",
    ),
    ("text negative count", "text", "@completed_read:", "@completed_read: -711", "negative"),
    ("text count over 64 bits", "text", "@completed_read:", "@completed_read: 99999999999999999999999", "not a count"),
    (
        "text negative stats",
        "text",
        "@q2c_stats_read_usecs:",
        "@q2c_stats_read_usecs: count 711, average -1661, total -1181335",
        "negative",
    ),
    ("text zero window", "text", "capture_window_ns:", "capture_window_ns: 0", "capture_window_ns"),
    (
        "text huge window",
        "text",
        "capture_window_ns:",
        "capture_window_ns: 99999999999999999999999",
        "capture_window_ns",
    ),
    (
        "text huge busy time",
        "text",
        "@q2c_stats_read_usecs:",
        "@q2c_stats_read_usecs: count 711, average 1661, total 99999999999999999999",
        "iodepth=",
    ),
    ("text huge request size", "text", "@io_read_bytes[12288]:", "@io_read_bytes[99999999999999]: 1", "4 GiB"),
    (
        "text huge idle gap",
        "text",
        "@idle_stats_usecs:",
        "@idle_stats_usecs: count 220, average 999999999999, total 282219",
        "thinktime=",
    ),
]


@pytest.mark.parametrize("kind,old,new,word", [b[1:] for b in BAD_NUMBERS], ids=[b[0] for b in BAD_NUMBERS])
def test_numbers_no_capture_has_are_one_line(kind, old, new, word, tmp_path, capsys):
    p = _json_with(tmp_path, "t.json", old, new) if kind == "json" else _text_with(tmp_path, "t.txt", old, new)
    out = tmp_path / "job.fio"
    rc, _, err = run(["-i", p, "-o", out], capsys)
    assert_one_line_error(rc, err, word, str(p))
    assert not out.exists()


@pytest.mark.parametrize("form", ["crlf", "bom"])
def test_crlf_and_bom_give_the_same_job(form, tmp_path, capsys):
    for src in (TEXT_IDLE, JSON):
        raw = src.read_bytes()
        raw = raw.replace(b"\n", b"\r\n") if form == "crlf" else b"\xef\xbb\xbf" + raw
        p = tmp_path / (form + src.suffix)
        p.write_bytes(raw)
        rc, job, err = run(["-i", p, "--no-validate"], capsys)
        assert rc == 0, err
        rc, ref, _ = run(["-i", src, "--no-validate"], capsys)
        assert job_lines(job) == job_lines(ref)
        assert "layers_on" in job  # the wrapper's header line was read, BOM or not


# --- values that reach the job ---------------------------------------------------


@pytest.mark.parametrize(
    "size",
    [
        "1g\nexec_prerun=touch /tmp/kvtier-pwned",
        "1g exec_prerun=x",
        "size=1g",
        "-1",
        "1x",
        "0",
        "200%",
        "",
        "1g;x",
        "99999999999999999999g",
    ],
)
def test_bad_size_is_refused_before_anything(size, tmp_path, capsys):
    out = tmp_path / "job.fio"
    rc, _, err = run(["-i", TEXT, "-o", out, "--size", size], capsys)
    assert_one_line_error(rc, err, "--size", "--help")
    assert not out.exists()


@needs_fio
@pytest.mark.parametrize("size", ["64m", "1.5g", "10%", "1GiB", "4096", "2t"])
@pytest.mark.slow
def test_good_sizes_reach_the_job_and_pass_fio(size, tmp_path, capsys):
    out = tmp_path / "job.fio"
    rc, _, err = run(["-i", TEXT, "-o", out, "--size", size], capsys)
    assert rc == 0, err
    assert f"size={size}" in out.read_text().splitlines()
    assert validate_job(out.read_text()) is None


@needs_fio
@pytest.mark.slow
def test_trace_and_path_text_cannot_add_a_job_option(tmp_path, capsys):
    # a JSON trace's meta and the input's file name reach the job's comments
    meta = _json_with(
        tmp_path, "meta.json", '"dev": "vda (254:0)"', '"dev": "vda\\nexec_prerun=touch /tmp/kvtier-pwned\\r\\n[evil]"'
    )
    named = tmp_path / "a\nexec_prerun=touch x.txt"
    named.write_bytes(TEXT.read_bytes())
    for src, process in ((meta, "ok"), (named, "p\nexec_prerun=y")):
        out = tmp_path / "job.fio"
        rc, _, err = run(["-i", src, "-o", out, "--process", process], capsys)
        assert rc == 0, err
        text = out.read_text()
        options = [ln for ln in text.splitlines() if ln and not ln.startswith(";")]
        assert not any("exec_prerun" in ln or ln == "[evil]" for ln in options), options
        assert sum(ln.startswith("[") for ln in options) == 2  # [global] and the job
        assert validate_job(text) is None


@pytest.mark.parametrize(
    "field,value",
    [
        ("ioengine", "libaio\nexec_prerun=x"),
        ("size", "1g\nexec_prerun=x"),
        ("job_name", "x]\n[evil"),
        ("rw", "randrw ; x"),
    ],
)
def test_every_job_field_goes_through_one_gate(field, value):
    tr = parse_trace(TEXT.read_text())
    d = Distilled(
        job_name="j",
        rw="randrw",
        rwmixread=70,
        bssplit_read=[(4096, 100)],
        bssplit_write=[(4096, 100)],
        iodepth=1,
        ioengine="libaio",
        runtime_s=1,
        size="1g",
        figures={"window_s": 1, "reads": 1, "writes": 1, "issued": 2},
    )
    setattr(d, field, value)
    with pytest.raises(DistillError, match="not a plain fio option"):
        render_job(d, source="x", tr=tr)


# --- flags, outputs, the command's name -------------------------------------------


@pytest.mark.parametrize(
    "argv,word",
    [
        (["--window-s", "nan"], "--window-s"),
        (["--window-s", "inf"], "--window-s"),
        (["--window-s", "-1"], "--window-s"),
        (["--window-s", "abc"], "--window-s"),
        (["--runtime-s", "0"], "--runtime-s"),
        (["--runtime-s", "1e3"], "--runtime-s"),
        (["--runtime-s", "99999999999"], "--runtime-s"),
        (["--bogus"], "unrecognized"),
        (["--size"], "--size"),
    ],
)
def test_bad_flags_are_one_line_with_a_hint(argv, word, capsys):
    rc, _, err = run(["-i", TEXT] + argv, capsys)
    assert_one_line_error(rc, err, word, "(see 'kvtier distill --help')")


def test_outputs_checked_before_anything_is_written(tmp_path, capsys):
    trace = tmp_path / "trace.txt"
    trace.write_bytes(TEXT.read_bytes())
    before = trace.read_bytes()
    for argv, word in (
        (["-o", trace], "input trace"),
        (["--dump-json", trace], "input trace"),
        (["-o", tmp_path], "directory"),
        (["-o", tmp_path / "job.fio", "--dump-json", tmp_path / "no" / "h.json"], "No such"),
        (["-o", tmp_path / "same", "--dump-json", tmp_path / "same"], "same file"),
    ):
        rc, _, err = run(["-i", trace] + argv, capsys)
        assert_one_line_error(rc, err, word)
    assert trace.read_bytes() == before  # the user's trace is never overwritten
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.txt"]


@pytest.mark.slow
def test_a_job_is_written_whole_or_not_at_all(tmp_path, capsys, monkeypatch):
    job = tmp_path / "job.fio"
    rc, _, err = run(["-i", TEXT, "-o", job], capsys)
    assert rc == 0, err
    written = job.read_text()
    umask = os.umask(0)
    os.umask(umask)
    assert job.stat().st_mode & 0o777 == 0o666 & ~umask
    job.write_text("; the user's previous job\n")

    # the rename that would publish the new job fails: the old job stays whole, no temp file is left
    def refuse(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    rc, _, err = run(["-i", TEXT, "-o", job], capsys)
    assert_one_line_error(rc, err, "No space left on device")
    assert job.read_text() == "; the user's previous job\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.fio"]
    monkeypatch.undo()
    assert run(["-i", TEXT, "-o", job], capsys)[0] == 0 and job.read_text() == written


@pytest.mark.slow
def test_the_command_is_named_as_typed():
    kvtier = subprocess.run(
        [sys.executable, "-c", "import sys; from replay.cli import main; sys.exit(main())", "distill", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert kvtier.returncode == 0 and kvtier.stdout.startswith("usage: kvtier distill")
    assert "python -m tracing.distill" not in kvtier.stdout and "kvtier distill -i" in kvtier.stdout
    bad = subprocess.run(
        [sys.executable, "-c", "import sys; from replay.cli import main; sys.exit(main())", "distill", "--bogus"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and bad.stderr.startswith("kvtier distill: ") and len(bad.stderr.splitlines()) == 1
    mod = subprocess.run(
        [sys.executable, "-m", "tracing.distill", "--bogus"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    exe = os.path.basename(sys.executable)
    assert mod.returncode == 2 and mod.stderr.startswith(f"{exe} -m tracing.distill: "), mod.stderr
    assert "--help" in mod.stderr and len(mod.stderr.splitlines()) == 1


def test_dump_json_of_a_truncated_trace_says_so(tmp_path, capsys):
    cut = tmp_path / "cut.txt"
    cut.write_text(_cut(TEXT_IDLE, "half the lines"))
    js = tmp_path / "h.json"
    rc, _, err = run(["-i", cut, "--dump-json", js], capsys)
    assert_one_line_error(rc, err, "truncated")
    assert not js.exists()
    rc, _, err = run(["-i", cut, "--dump-json", js, "--allow-truncated"], capsys)
    assert rc == 0 and "warning" in err[0]
    dumped = json.loads(js.read_text())
    assert dumped["truncated"] and dumped["cuts"]
