"""`kvtier bench --enable-latency-tracing` run by a user who is not root (uid 65534, nobody): the benchmark runs as
that user and only the tracer as root, through `sudo -n` where sudo allows it; where it does not, one line says what
to run and nothing is measured.

The interpreter of this checkout may live under /root (mode 700, pyenv), which nobody cannot reach: the user keeps
CAP_DAC_READ_SEARCH (read and search any file) and nothing else, so it can start Python but cannot load BPF
programs, which is what is under test (os.geteuid() != 0, no CAP_BPF/CAP_SYS_ADMIN)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from trace_helpers import REPO, TRACING, disk_tmp_dir, needs_bpftrace, needs_root

SCRIPT = TRACING / "storage_latency_stack.sh"
NOBODY = 65534

pytestmark = [
    pytest.mark.slow,
    needs_root,
    needs_bpftrace,
    pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux) not installed"),
]


def as_nobody(args: list[str], home: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    cmd = [
        "setpriv",
        f"--reuid={NOBODY}",
        f"--regid={NOBODY}",
        "--clear-groups",
        "--inh-caps=+dac_read_search",
        "--ambient-caps=+dac_read_search",
        "env",
        f"HOME={home}",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)


@pytest.fixture
def home():
    d = Path(disk_tmp_dir()) / f"kvtier-nonroot-{os.getpid()}"
    d.mkdir(exist_ok=True)
    os.chown(d, NOBODY, NOBODY)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def bench_args(home: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "replay.cli",
        "bench",
        "--duration",
        "2",
        "--num-users",
        "2",
        "--gpu-mem-gb",
        "0",
        "--cpu-mem-gb",
        "0",
        "--storage-capacity-gb",
        "1",
        "--cache-dir",
        str(home / "cache"),
        "--output",
        str(home / "r.json"),
        "--enable-latency-tracing",
        "--no-progress",
    ]


def test_without_sudo_rights_one_line_says_what_to_run(home):
    p = as_nobody(bench_args(home), home)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert lines[0].startswith("kvtier bench: --enable-latency-tracing: the tracer needs root"), lines[0]
    assert "sudo" in lines[0] and str(SCRIPT) in lines[0]
    assert not (home / "r.json").exists()


# serial: while its sudoers rule exists, nobody may run the tracer, and the test above (on the other core) would see it
@pytest.mark.serial
@pytest.mark.skipif(shutil.which("sudo") is None, reason="sudo not installed (apt-get install sudo)")
def test_with_sudo_for_the_script_the_bench_runs_as_the_user_and_is_traced(home):
    # a sudoers rule for the tracer script alone, for this test's user, removed afterwards
    rule = Path(f"/etc/sudoers.d/kvtier-test-{os.getpid()}")
    rule.write_text(f"#{NOBODY} ALL=(root) NOPASSWD: {SCRIPT}\n")
    rule.chmod(0o440)
    try:
        assert subprocess.run(["visudo", "-cf", str(rule)], capture_output=True).returncode == 0
        p = as_nobody(bench_args(home), home)
    finally:
        rule.unlink()
    assert p.returncode == 0, p.stderr
    doc = json.loads((home / "r.json").read_text())
    lt = doc["latency_tracing"]
    assert "error" not in lt, lt
    h = lt["histograms"]
    assert "d2c_write_usecs" in h or "d2c_read_usecs" in h, sorted(h)
    assert [m["pid"] for m in lt["matched"]], lt["matched"]
    # the tracer's files are the user's, the benchmark ran as the user
    trace = Path(lt["trace_path"])
    assert trace.stat().st_uid == NOBODY and (trace.parent / "layers.txt").stat().st_uid == NOBODY
    assert (home / "r.json").stat().st_uid == NOBODY
