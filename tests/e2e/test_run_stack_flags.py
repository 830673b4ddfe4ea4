"""deploy/run-stack.sh's flags of the long-session experiment (benchmarks/collapse.py): each wrong value is one line on
stderr and exit 2 before anything starts (no state directory holds a pid). No server is started here: the stacks these
flags build are run by benchmarks/collapse.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from deploy import RUN_STACK

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--l2", "bogus"], "--l2 is kvtier, lmcache-fs or none"),
        (["--l2", "none", "--shared-dir", "/tmp/x"], "--l2 none needs --mode mp and no --shared-dir"),
        (["--prefix-caching", "maybe"], "--prefix-caching is on or off"),
        (["--max-model-len", "0"], "--max-model-len must be a positive integer"),
        (["--max-num-seqs", "four"], "--max-num-seqs must be a positive integer"),
        (["--block-size", "x"], "--block-size must be a positive integer"),
        (["--l1-gb", "0"], "--l1-gb must be a number of GB > 0"),
        (["--kv-space", "1.5"], "--kv-space on cpu is whole GiB"),
    ],
)
def test_bad_flag_is_one_line_and_exit_2(tmp_path, flags, message):
    (tmp_path / "model").mkdir()
    cmd = [str(RUN_STACK), "up", "--device", "cpu", "--model", str(tmp_path / "model")]
    cmd += ["--vllm-port", "1", "--lmcache-port", "2", "--lmcache-http-port", "3", "--kv-dir", str(tmp_path / "kv")]
    cmd += ["--state-dir", str(tmp_path / "state"), *flags]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and message in res.stderr, res.stderr
    assert not (tmp_path / "state" / "pids").exists()
