"""deploy/gpu_check.py, the check a GPU host runs in kvtier's GPU image. Its measuring part (deploy.stack.l2_hit) runs
on the CPU stack in tests/e2e/test_lmcache_stack.py; here, what it refuses and what it reports."""

from __future__ import annotations

import subprocess
import sys

import pytest

from deploy import gpu_check
from deploy.stack import L2Hit


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "deploy.gpu_check", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.slow  # imports torch twice: about 10 s
def test_without_a_gpu_it_refuses_in_one_line_before_starting_anything(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    p = run("--work", str(tmp_path))
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip().count("\n") == 0 and "no CUDA device" in p.stderr
    assert list(tmp_path.iterdir()) == []  # no model built, no stack started


def test_a_work_dir_holding_a_running_stack_is_refused(tmp_path):
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "pids").write_text("vllm0 12345\n")
    assert "holds a running stack" in gpu_check.refusal("cpu", tmp_path)
    assert gpu_check.refusal("cpu", tmp_path / "elsewhere") is None


def test_each_shortfall_is_named():
    good = L2Hit("disk", 0, 5, 1280, 1280, 5, True, 0, 0)
    assert good.problems(5) == []
    bad = L2Hit("disk", 256, 3, 1280, 0, 0, False, 2, 1)
    said = bad.problems(5)
    assert len(said) == 7 and said[0] == "the first request already hit 256 tokens"
    assert "kvtier's disk tier served 0 chunks" in said
