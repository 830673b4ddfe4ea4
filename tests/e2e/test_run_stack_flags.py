"""deploy/run-stack.sh's flags of the long-session experiment (benchmarks/collapse.py), of nodes (--nodes, --shared,
--shared-bw, --gpus-per-instance) and of Prometheus (--prometheus*): each wrong value is one line on stderr and exit 2
before anything starts (no state directory holds a pid, no namespace is made). No server is started here: the stacks
these flags build are run by benchmarks/collapse.py, tests/e2e/test_nodes_stack.py and test_prometheus_stack.py."""

from __future__ import annotations

import json
import shlex
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
        (["--nodes", "0"], "--nodes must be a positive integer"),
        (["--nodes", "2", "--instances", "2"], "--nodes and --instances are exclusive"),
        (["--nodes", "2", "--shared-dir", "/tmp/x"], "not --shared-dir"),
        (["--nodes", "2", "--mode", "inprocess"], "--nodes needs --mode mp"),
        (["--nodes", "2", "--shared", "nfs"], "--shared is one of glusterfs, redis-cluster, s3, cephfs, mooncake"),
        (["--shared", "s3"], "--shared s3 needs --nodes N"),
        (["--nodes", "2", "--shared", "cephfs", "--l2", "none"], "--shared needs --l2 kvtier"),
        (["--shared", "glusterfs"], "--shared glusterfs needs --nodes N"),
        (["--nodes", "2", "--shared", "redis-cluster", "--l2", "none"], "--shared needs --l2 kvtier"),
        (
            ["--nodes", "2", "--shared", "redis-cluster", "--shared-bw", "100mbps"],
            "--shared-bw needs --shared glusterfs",
        ),
        (["--nodes", "2", "--disk-gb", "0"], "--disk-gb 0 leaves kvtier no tier"),
        (["--gpus-per-instance", "1"], "--gpus-per-instance needs --device cuda"),
        (["--gpus-per-instance", "-1"], "--gpus-per-instance must be a positive integer"),
        (["--prometheus-port", "9090"], "--prometheus-port and --prometheus-interval need --prometheus"),
        (["--prometheus-interval", "1"], "--prometheus-port and --prometheus-interval need --prometheus"),
        (["--prometheus", "--prometheus-port", "x"], "--prometheus-port must be a port number"),
        (["--prometheus", "--prometheus-interval", "0.01"], "--prometheus-interval must be a number of seconds"),
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


@pytest.mark.slow  # network namespaces made and removed
def test_failed_nodes_up_leaves_no_namespace(tmp_path):
    """An `up --nodes` that fails after its namespaces exist (its servers' interpreter exits at once, as a vLLM that
    cannot start would, without the half minute of CPU two LMCache servers and two vLLMs spend importing) removes
    them."""
    import os

    if os.geteuid() != 0:
        pytest.skip("--nodes needs root")
    (tmp_path / "model").mkdir()
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\necho 'no interpreter here' >&2\nexit 1\n")
    python.chmod(0o755)
    before = node_namespaces()
    cmd = [str(RUN_STACK), "up", "--device", "cpu", "--model", str(tmp_path / "model"), "--nodes", "2"]
    cmd += ["--vllm-port", "31900", "--lmcache-port", "31910", "--lmcache-http-port", "31920", "--timeout", "60"]
    cmd += ["--kv-dir", str(tmp_path / "kv"), "--state-dir", str(tmp_path / "state"), "--python", str(python)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode != 0 and "start-up failed" in res.stderr and "nodes removed" in res.stderr, res.stderr
    assert node_namespaces() == before
    # endpoints.json was written before the servers were waited for: each node its namespace, address and endpoints
    ep = json.loads((tmp_path / "state" / "endpoints.json").read_text())
    addresses = [n["address"] for n in ep["nodes"]]
    assert len(set(addresses)) == 2 and len({n["netns"] for n in ep["nodes"]}) == 2
    assert [n["endpoints"] for n in ep["nodes"]] == ep["instances"]
    assert all(inst["vllm"] == f"http://{a}:31900" for inst, a in zip(ep["instances"], addresses))
    assert ep["vllm"] == "http://127.0.0.1:31900" and ep["shared"] is None
    assert not (tmp_path / "state" / "nodes.state").exists() and not (tmp_path / "state" / "pids").exists()


def node_namespaces() -> set[str]:
    """The network namespaces of run-stack.sh's nodes on this host (other tools' namespaces come and go meanwhile)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.startswith("kvn-")}


def test_gpus_per_instance_gives_each_instance_its_own_gpus(tmp_path):
    """--gpus-per-instance 2 with 2 instances: instance i's vLLM and LMCache commands carry CUDA_VISIBLE_DEVICES
    2i,2i+1. No GPU here: an interpreter that refuses `-m` stands in for the servers, so the start fails at once and
    leaves the recorded commands."""
    import shutil
    import sys

    if shutil.which("nvidia-smi"):
        pytest.skip("a GPU host: this check stands the servers in with a fake interpreter")
    (tmp_path / "model").mkdir()
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/bash\n[[ $1 == -m ]] && exit 3\nexec {sys.executable} "$@"\n')
    fake.chmod(0o755)
    state = tmp_path / "state"
    cmd = [str(RUN_STACK), "up", "--device", "cuda", "--model", str(tmp_path / "model"), "--instances", "2"]
    cmd += ["--vllm-port", "31800", "--lmcache-port", "31810", "--lmcache-http-port", "31820", "--timeout", "30"]
    cmd += ["--kv-dir", str(tmp_path / "kv"), "--state-dir", str(state), "--python", str(fake)]
    res = subprocess.run([*cmd, "--gpus-per-instance", "2"], capture_output=True, text=True, timeout=120)
    assert res.returncode != 0 and "start-up failed" in res.stderr, res.stderr
    for i, gpus in enumerate(["0,1", "2,3"]):
        for name in (f"vllm{i}", f"lmcache{i}"):
            words = shlex.split((state / f"{name}.cmd").read_text())  # the command as run-stack.sh ran it
            assert f"CUDA_VISIBLE_DEVICES={gpus}" in words[: words.index(str(fake))], name
