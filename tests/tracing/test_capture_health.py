"""What a capture does not show is said: block requests whose completion the
trace lacks (from a recorded capture with completions taken out), and file
bytes the syscalls moved that the block layer never saw (a real buffered,
cached read traced by bpftrace)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from trace_helpers import FIXTURES, TRACING, disk_tmp_dir, needs_bpftrace, needs_root, wait_attached

from tracing.histparse import parse_trace
from tracing.report import health_lines, main

SH = TRACING / "storage_latency_stack.sh"
HERE = Path(__file__).resolve().parent


def _without_completions(share: float) -> str:
    """The QD 8 capture with this share of its completions taken out."""
    text = (FIXTURES / "fio_randrw70_512k_qd8_lost_dropped.txt").read_text()
    for key in ("completed_read", "completed_write"):
        m = re.search(rf"^@{key}: (\d+)$", text, re.M)
        text = text.replace(m.group(0), f"@{key}: {int(int(m.group(1)) * (1 - share))}")
    return text


def test_whole_capture_says_nothing():
    assert health_lines(parse_trace((FIXTURES / "fio_randrw70_512k_qd8_lost_dropped.txt").read_text())) == []


def test_lost_completions_over_2_percent_are_one_line(tmp_path, capsys):
    assert health_lines(parse_trace(_without_completions(0.01))) == []
    src = tmp_path / "trace.txt"
    src.write_text(_without_completions(0.05))
    assert main([str(src), "--health"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith("WARNING: ") and "have no completion" in out[0], out
    assert re.search(r"\(5\.\d%\)", out[0]), out


def test_page_cache_line_from_byte_sums():
    text = (FIXTURES / "fio_randrw70_512k_qd8_lost_dropped.txt").read_text()
    tr = parse_trace(text)
    block_read = sum(int(k) * v for k, v in tr.maps["io_read_bytes"].items())
    # the syscalls read 8x what the block layer did: 88% from the page cache
    lines = health_lines(parse_trace(text + f"@file_read_bytes: {8 * block_read}\n"))
    assert len(lines) == 1 and lines[0].endswith("88% served from the page cache"), lines
    # as much as the block layer (O_DIRECT): nothing to say
    assert health_lines(parse_trace(text + f"@file_read_bytes: {block_read}\n")) == []


@pytest.mark.slow
@pytest.mark.timeout(180)  # a workload that hangs fails the test, not the run
@needs_root
@needs_bpftrace
def test_cached_buffered_reads_are_said_to_come_from_the_page_cache(tmp_path):
    work = Path(disk_tmp_dir()) / f"kvtier-cached-{os.getpid()}"
    work.mkdir(exist_ok=True)
    data = work / "cached.dat"
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "cached_read_workload.py"), str(data), "32", "3", "16"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    tracer = None
    try:
        assert proc.stdout.readline().strip() == "ready"  # written and fsync'd: in the page cache
        out = tmp_path / "trace"
        tracer = subprocess.Popen(
            ["bash", str(SH), str(proc.pid), "--dev", str(work), "--out", str(out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        wait_attached(out, tracer, timeout_s=60)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "done"
        os.killpg(tracer.pid, 2)  # Ctrl-C
        _, err = tracer.communicate(timeout=60)
        assert tracer.returncode == 0, err
        tr = parse_trace((out / "trace.txt").read_text())
        # 3 x 32 MiB from the file, exactly; the 16 MiB through the socket pair are not file bytes
        assert tr.number("file_read_bytes") == 3 * 32 << 20, tr.number("file_read_bytes")
        line = [ln for ln in health_lines(tr) if "served from the page cache" in ln]
        assert len(line) == 1 and "of the 96.0 MiB the syscalls read" in line[0], health_lines(tr)
        assert int(re.search(r"(\d+)% served", line[0]).group(1)) >= 90, line
        # and the wrapper said it at the end of the capture, one line
        assert sum("served from the page cache" in ln for ln in err.splitlines()) == 1, err
    finally:
        if proc.poll() is None:
            proc.kill()
        if tracer is not None and tracer.poll() is None:
            os.killpg(tracer.pid, 9)
        data.unlink(missing_ok=True)
        work.rmdir()
