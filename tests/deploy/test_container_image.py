"""`kvtier bench` inside kvtier's image (`make image`, docs/containers.md) with its cache and results in a folder
mounted from the host. Building the image takes minutes, so the suite does not: set KVTIER_TEST_IMAGE to a built
image (e.g. localhost/kvtier:0.1.0-abc1234), and CONTAINERS_CONF where podman's defaults cannot start a container."""

import json
import os
import shutil
import subprocess

import pytest

IMAGE = os.environ.get("KVTIER_TEST_IMAGE")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not IMAGE, reason="KVTIER_TEST_IMAGE names no built image (make image)"),
    pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed"),
]


def test_bench_in_the_image_writes_results_and_cache_to_the_mounted_folder(tmp_path):
    host = tmp_path / "mounted"
    host.mkdir()
    run = subprocess.run(
        ["podman", "run", "--rm", "--network=none", "-v", f"{host}:/data", IMAGE,
         "kvtier", "bench", "--duration", "2", "--num-users", "2", "--cpu-mem-gb", "0", "--gpu-mem-gb", "0",
         "--cache-dir", "/data/cache", "--keep-cache", "--output", "/data/results.json", "--seed", "1"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    results = json.loads((host / "results.json").read_text())
    assert results  # a results document came out through the mount
    cached = [p for p in (host / "cache").rglob("*") if p.is_file()]
    assert cached, "the disk tier wrote nothing into the mounted cache folder"
