"""The distilled iodepth against the depth fio really kept.

Recorded captures (tests/tracing/fixtures/fio_randrw70_512k_qd*.txt: fio
randrw 70% reads, 512 KiB, direct, libaio, traced block-only on this
project's 2-CPU VM, vda) check the estimator; the *_lost_dropped ones come
from the tracer that drops a request whose completion was lost (each lost
some: @lost_reqs), the others from the tracer before it, whose samples
drifted up with every lost completion. The live runs check the whole chain
at QD 1, 4, 8 and 32 (kvtier's targets: 6-10 at QD 8, else within 25%): the old
tracer gave 37-41 for QD 32 in 4 of 5 runs and 2 for QD 1 now and then."""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
from trace_helpers import (
    FIO_READING_BYTES,
    FIXTURES,
    TRACING,
    disk_tmp_dir,
    needs_bpftrace,
    needs_fio,
    needs_root,
    wait_io,
)

from tracing.distill import distill, main
from tracing.histparse import parse_trace

SH = TRACING / "storage_latency_stack.sh"


def trace(name: str):
    return parse_trace((FIXTURES / f"{name}.txt").read_text())


def in_target(iodepth: int, qd: int) -> bool:
    lo, hi = (6, 10) if qd == 8 else (max(1, 0.75 * qd), 1.25 * qd)
    return lo <= iodepth <= hi


@pytest.mark.parametrize(
    "name,qd",
    [
        ("fio_randrw70_512k_qd1_lost_dropped", 1),
        ("fio_randrw70_512k_qd4_lost_dropped", 4),
        ("fio_randrw70_512k_qd8_lost_dropped", 8),
        ("fio_randrw70_512k_qd32_lost_dropped", 32),
        ("fio_randrw70_512k_qd8", 8),
        ("fio_randrw70_512k_qd32", 32),
    ],
)
def test_recorded_captures_distil_to_fios_depth(name, qd):
    d = distill(trace(name))
    assert in_target(d.iodepth, qd), d.figures
    if name.endswith("_lost_dropped"):
        # completions were lost and their requests dropped: the fill level is used, Little's law agrees with the mean
        assert d.figures["lost_reqs"] > 0 and d.iodepth == d.figures["iodepth_sampled_edge"], d.figures


def test_drifted_samples_give_way_to_littles_law():
    # The tracer before the lost-request ring: QD 4, depths 2-6 sampled, then a cluster at 16-19 (about a dozen
    # requests whose completions never reached the probe, counted outstanding from then on). The sampled mean is
    # far over Little's law, so the samples are not trusted and Little's law, rounded up, is the depth.
    d = distill(trace("fio_randrw70_512k_qd4_unseen_completions"))
    little = d.figures["iodepth_little"]
    assert d.figures["iodepth_sampled_mean"] > 1.5 * little + 1
    assert d.iodepth == math.ceil(little - 0.05)
    assert any("above Little's law" in n for n in d.notes), d.notes


def _edit(text: str, **counts: float) -> str:
    """The capture with its completion counts (and their q2c stats) scaled."""
    for key, factor in counts.items():
        m = re.search(rf"^@{key}: (\d+)$", text, re.M)
        text = text.replace(m.group(0), f"@{key}: {int(int(m.group(1)) * factor)}")
        op = key.split("_")[1]
        m = re.search(rf"^@q2c_stats_{op}_usecs: count (\d+), average (\d+), total (\d+)$", text, re.M)
        n, avg = int(int(m.group(1)) * factor), int(m.group(2))
        text = text.replace(m.group(0), f"@q2c_stats_{op}_usecs: count {n}, average {avg}, total {n * avg}")
    return text


def test_littles_law_is_not_lowered_by_unseen_completions():
    text = (FIXTURES / "fio_randrw70_512k_qd8.txt").read_text()
    whole = distill(parse_trace(text)).figures["iodepth_little"]
    holed = distill(parse_trace(_edit(text, completed_read=0.6, completed_write=0.6)))
    # 40% of completions unseen: the rate comes from issues, the mean from the completions seen
    assert holed.figures["iodepth_little"] == pytest.approx(whole, rel=0.02)
    assert holed.figures["lost_completions"] > 2000
    assert any("no completion in the trace" in n for n in holed.notes)


def test_a_capture_mostly_holes_is_refused_unless_allowed(tmp_path, capsys):
    src = tmp_path / "holed.txt"
    src.write_text(_edit((FIXTURES / "fio_randrw70_512k_qd8.txt").read_text(), completed_read=0.3, completed_write=0.3))
    out = tmp_path / "job.fio"
    assert main(["-i", str(src), "-o", str(out), "--no-validate"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("kvtier distill: ") and "--allow-lossy" in err[0], err
    assert not out.exists()
    assert main(["-i", str(src), "-o", str(out), "--no-validate", "--allow-lossy"]) == 0
    assert "no completion in the trace" in out.read_text()


@pytest.mark.slow
@pytest.mark.serial  # the depth fio kept is what the device gave it: another workload beside it changes it
@needs_root
@needs_bpftrace
@needs_fio
@pytest.mark.parametrize("qd", [1, 4, 8, 32])
def test_live_fio_distils_to_its_depth(tmp_path, qd):
    work = Path(disk_tmp_dir()) / f"kvtier-depth-{os.getpid()}"
    work.mkdir(exist_ok=True)
    fio = subprocess.Popen(
        [
            "fio",
            f"--name=qd{qd}",
            f"--filename={work / 'depth.dat'}",
            "--size=256m",
            "--rw=randrw",
            "--rwmixread=70",
            "--bs=512k",
            "--direct=1",
            "--ioengine=libaio",
            f"--iodepth={qd}",
            "--thread",
            "--time_based",
            "--runtime=60",  # stopped once the trace is taken
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_io(fio, read_bytes=FIO_READING_BYTES)  # file laid out, its reads under way
        # A second capture only when the first says it is degraded: the kernel skipped probe runs (BPF recursion guard,
        # seen on a loaded 2-core machine), so some requests' ends were never seen and the depth may be off by one.
        for attempt in range(2):
            out = tmp_path / f"trace{attempt}"
            p = subprocess.run(
                ["bash", str(SH), str(fio.pid), "--dev", str(work), "--duration", "3", "--out", str(out)]
                + ["--no-syscalls"],
                capture_output=True,
                text=True,
                timeout=90,
            )
            assert p.returncode == 0, p.stderr
            trace = parse_trace((out / "trace.txt").read_text())
            d = distill(trace)
            skipped = trace.meta.get("missed_events", "")
            if in_target(d.iodepth, qd) or not (skipped.isdigit() and int(skipped) > 0):
                break
        assert d.figures["issued"] > 500, d.figures  # enough requests to tell a depth
        assert in_target(d.iodepth, qd), (d.figures, d.notes)
    finally:
        fio.send_signal(signal.SIGINT)
        fio.wait(timeout=60)
        for f in work.glob("*.dat"):
            f.unlink()
        work.rmdir()
