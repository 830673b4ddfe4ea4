"""benchmarks/gpu_check_vllm_tier.sh where there is no GPU: its syntax, its argument checks, and its --cpu-only half
(the tiny model, and the exact --kv-transfer-config it would give vLLM, checked through vLLM's own factories)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm.v1.kv_offload.tiering.spec", reason="vLLM with tiered offloading is not installed")
pytestmark = pytest.mark.slow  # importing vLLM alone takes seconds (conftest.py)

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "benchmarks" / "gpu_check_vllm_tier.sh"
# The script calls python3: make it this interpreter (the one with vLLM), as on a GPU machine's environment.
ENV = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])}


def run(*args, timeout=300):
    return subprocess.run(
        ["bash", str(SCRIPT), *args], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout
    )


def test_syntax_and_user_mistakes(tmp_path):
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0
    r = run("--help")
    assert r.returncode == 0 and "--cpu-only" in r.stdout and "reset_external" in r.stdout
    r = run(str(tmp_path / "out"), "not-a-port")
    assert r.returncode == 2 and "PORT must be a number" in r.stderr
    assert run("--bogus").returncode == 2


def test_cpu_only_builds_the_model_and_vllm_loads_the_tier_from_the_config(tmp_path):
    r = run("--cpu-only", str(tmp_path / "out"))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "preflight: vLLM" in r.stdout and "loaded ['KvtierTier']" in r.stdout and "not starting vLLM" in r.stdout
    cfg = json.loads((tmp_path / "out" / "kv-transfer-config.json").read_text())
    extra = cfg["kv_connector_extra_config"]
    assert cfg["kv_connector"] == "OffloadingConnector" and extra["spec_name"] == "TieringOffloadingSpec"
    assert extra["secondary_tiers"][0]["module_path"] == "kvconnector.vllm.tier"
    assert (tmp_path / "out" / "tiny" / "config.json").exists()
