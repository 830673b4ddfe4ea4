"""`kvtier mlperf run --hosts` over network-namespace nodes (deploy/nodes.py, as `run-stack.sh up --nodes` makes them):
mpirun reaches each node through deploy/netns-rsh, every rank runs inside its own namespace, and the run completes
with the shared-results-dir probe (Rules.md 6.3.3.4) passing, though every node has this machine's host name."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from deploy import nodes

ROOT = Path(__file__).resolve().parents[2]
AGENT = ROOT / "deploy" / "netns-rsh"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.root(reason="network namespaces"),
    pytest.mark.skipif(shutil.which("mpirun") is None, reason="no mpirun (apt-get install openmpi-bin)"),
]


@pytest.fixture
def two_nodes(tmp_path):
    state = tmp_path / "nodes"
    state.mkdir()
    try:
        nodes.up(state, 2)
        addrs = [nodes.recorded(state, f"addr{i}")[0] for i in range(2)]
        yield addrs, addrs[0].rsplit(".", 1)[0] + ".0/24"
    finally:
        nodes.remove(state, sys.executable, dict(os.environ), out=open(os.devnull, "w"))


def mpi_params(net: str) -> list[str]:
    return ["--mca", "plm_rsh_agent", str(AGENT), "--mca", "oob_tcp_if_include", net]


def test_each_rank_runs_inside_the_node_it_was_placed_on(two_nodes):
    addrs, net = two_nodes
    show = "echo $OMPI_COMM_WORLD_RANK $(ip -4 -o addr show | grep -o 'inet [0-9.]*' | cut -d' ' -f2 | grep -v ^127)"
    cmd = ["mpirun", "--allow-run-as-root", "-n", "2", "-host", ",".join(f"{a}:1" for a in addrs), *mpi_params(net)]
    p = subprocess.run([*cmd, "sh", "-c", show], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.split("\n")[:2]) == [f"0 {addrs[0]}", f"1 {addrs[1]}"]  # its node's address, no other
    # an address no namespace has: the agent says so and the launch fails
    bad = subprocess.run([str(AGENT), "192.0.2.1", "true"], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 255 and "no network namespace has the address 192.0.2.1" in bad.stderr


def test_an_open_run_over_two_nodes_completes_with_a_rank_on_each(two_nodes, tmp_path):
    addrs, net = two_nodes
    results, cache = tmp_path / "results", Path("/dev/shm") / f"kvtier-nodes-{os.getpid()}"
    argv = ["--mode", "open", "--results-dir", str(results), "--cache-dir", str(cache), "--hosts", *addrs]
    argv += ["--mpi-params=" + " ".join(mpi_params(net)), "--options", "1", "--trials", "1", "--duration", "2"]
    argv += ["--num-users", "2", "--inter-option-delay", "0", "--start-delay", "0", "--end-delay", "0"]
    argv += ["--gpu-mem-gb", "0", "--cpu-mem-gb", "0", "--no-progress"]
    try:
        p = subprocess.run(
            [sys.executable, "-m", "replay.cli", "mlperf", "run", *argv], capture_output=True, text=True, timeout=300
        )
    finally:
        subprocess.run(["rm", "-rf", str(cache)], check=False)
    assert p.returncode == 0, (p.stdout, p.stderr)
    (run,) = (results / "open" / "kv_cache" / "run").iterdir()
    (summary,) = run.glob("kvcache_run_summary_*.json")
    doc = json.loads(summary.read_text())
    assert doc["total_ranks"] == 2 and not doc["partial_failure"]
    for rank in (0, 1):
        assert list((run / "option_1" / "trial_0" / f"rank_{rank}").glob("kvcache_results_*.json"))
