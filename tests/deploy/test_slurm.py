"""Slurm on network-namespace nodes (deploy/slurm.py, `python -m deploy.slurm up`): real munged, slurmctld and slurmd
(Debian's Slurm 22.05); `kvtier bench` and kvtier's MLPerf harness run across the nodes by the sbatch scripts users
run (deploy/sbatch/), their ranks merged as under mpirun; `down` leaves no daemon, namespace, socket or key."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import wait_for

from deploy import processes, slurm

pytestmark = [
    pytest.mark.slow,
    pytest.mark.root(reason="network namespaces"),
    pytest.mark.skipif(slurm.missing() is not None, reason=f"Slurm: {slurm.missing()}"),
    pytest.mark.timeout(600),
]

ROOT = Path(__file__).resolve().parents[2]
KVTIER = str(Path(sys.executable).parent / "kvtier")


def deploy_slurm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "deploy.slurm", *args], cwd=ROOT, capture_output=True, text=True, timeout=180
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    state = tmp_path_factory.mktemp("slurm") / "state"
    p = deploy_slurm("up", "--state-dir", str(state), "--nodes", "2")
    assert p.returncode == 0, p.stderr
    try:
        yield state
    finally:
        deploy_slurm("down", "--state-dir", str(state))


def sbatch(state: Path, out: Path, script: str, *args: str, nodes: int = 2) -> str:
    """Submit one of deploy/sbatch/'s scripts and wait for the job to end (squeue polled: `sbatch --wait` polls at
    growing intervals and took 42 s for a 10 s job); its final state, as `COMPLETED 0:0`."""
    env = {**slurm.env(state), "KVTIER": KVTIER}
    cmd = ["sbatch", "--parsable", f"-N{nodes}", "-o", str(out), str(ROOT / "deploy" / "sbatch" / script), *args]
    job = subprocess.run(cmd, env=env, cwd=out.parent, capture_output=True, text=True, timeout=60, check=True)
    job_id = job.stdout.strip().split(";")[0]

    def ended() -> str | None:
        shown = subprocess.run(["scontrol", "-o", "show", "job", job_id], env=env, capture_output=True, text=True)
        fields = dict(f.split("=", 1) for f in shown.stdout.split() if "=" in f)
        done = fields.get("JobState") not in (None, "PENDING", "RUNNING", "CONFIGURING", "COMPLETING")
        return f"{fields['JobState']} {fields['ExitCode']}" if done else None

    return wait_for(ended, timeout_s=240, interval_s=0.5, what=f"Slurm job {job_id} to end")


def test_every_node_is_idle_and_a_task_runs_in_its_own_namespace(cluster):
    assert slurm.idle_nodes(cluster) == 2
    p = slurm.srun(cluster, "-N2", "-n2", *slurm.WHERE)
    assert p.returncode == 0, p.stderr
    seen = {line.split()[0]: line for line in p.stdout.splitlines()}
    addrs = [n["address"] for n in json.loads((cluster / "slurm" / "cluster.json").read_text())["nodes"]]
    for rank in ("0", "1"):  # task r on node r, at node r's address: as on separate hosts
        assert f" node{rank} " in seen[rank] and f" {addrs[int(rank)]}/24 " in seen[rank], p.stdout


def test_a_two_rank_bench_through_sbatch_and_srun_merges_into_one_result(cluster, tmp_path):
    out = tmp_path / "bench.json"
    p = sbatch(
        cluster,
        tmp_path / "job.out",
        "kvtier-bench.sbatch",
        *("--duration", "3", "--num-users", "2", "--cpu-mem-gb", "0.5", "--gpu-mem-gb", "0"),
        *("--cache-dir", str(tmp_path / "cache"), "--keep-cache", "--output", str(out)),
    )
    said = (tmp_path / "job.out").read_text()
    assert p == "COMPLETED 0:0", said[-3000:]
    doc = json.loads(out.read_text())
    assert doc["status"] == "completed" and doc["environment"]["hostname"] == "node0, node1"
    assert "merged from 2 sources (rank-0, rank-1)" in said
    assert sorted(d.name for d in (tmp_path / "cache").iterdir()) == ["rank-0", "rank-1"]


def test_srun_without_pmix_is_refused_in_one_line_before_mpi_starts(cluster, tmp_path):
    p = slurm.srun(
        cluster, "--mpi=none", "-N2", "-n2", KVTIER, "bench", "--duration", "2", "--output", str(tmp_path / "x.json")
    )
    assert p.returncode == 2, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("kvtier bench:")]
    assert len(lines) == 1 and "without a PMI plugin: run srun --mpi=pmix" in lines[0], p.stderr  # said by rank 0
    assert "MPI_Init" not in p.stderr
    assert not (tmp_path / "x.json").exists()


def test_the_mlperf_harness_through_sbatch_runs_a_rank_on_each_node(cluster, tmp_path):
    results = tmp_path / "results"
    p = sbatch(
        cluster,
        tmp_path / "job.out",
        "kvtier-mlperf.sbatch",
        *("--mode", "open", "--results-dir", str(results), "--cache-dir", str(tmp_path / "cache")),
        *("--options", "1", "--trials", "1", "--duration", "2", "--num-users", "2"),
        *("--inter-option-delay", "0", "--start-delay", "0", "--end-delay", "0"),
    )
    assert p == "COMPLETED 0:0", (tmp_path / "job.out").read_text()[-3000:]
    (summary,) = results.glob("open/kv_cache/run/*/kvcache_run_summary_*.json")
    rank_files = sorted(summary.parent.glob("option_1/trial_0/rank_*/kvcache_results_*.json"))
    assert [f.parent.name for f in rank_files] == ["rank_0", "rank_1"]
    hosts = [json.loads(f.read_text())["environment"]["hostname"] for f in rank_files]
    assert hosts == ["node0", "node1"]
    assert json.loads(summary.read_text()).get("partial_failure") in (None, False, [])


def test_down_leaves_no_daemon_namespace_socket_or_key(tmp_path):
    state = tmp_path / "state"
    assert deploy_slurm("up", "--state-dir", str(state), "--nodes", "2").returncode == 0
    pids = [pid for _, pid in processes.recorded(state)]
    namespaces = json.loads((state / "slurm" / "cluster.json").read_text())["nodes"]
    assert len(pids) == 4 and all(processes.live_argv(p) for p in pids)  # munged, slurmctld, two slurmd
    p = deploy_slurm("down", "--state-dir", str(state))
    assert p.returncode == 0, p.stderr
    assert not [p for p in pids if processes.live_argv(p)]
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not [n for n in namespaces if n["netns"] in listed]
    left = {p.relative_to(state / "slurm").as_posix() for p in (state / "slurm").rglob("*")}
    assert not [f for f in left if f.startswith("munge") or f.endswith(".socket")], left
    assert "slurm.conf" in left and "slurmctld.log" in left  # what the cluster was and said stays, as logs do


def test_mistakes_are_one_line_and_exit_2(cluster, tmp_path):
    p = deploy_slurm("up", "--state-dir", str(cluster), "--nodes", "2")  # that state dir runs a cluster
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "holds a running stack" in p.stderr
    p = deploy_slurm("up", "--state-dir", str(tmp_path / "s"), "--nodes", "0")
    assert p.returncode == 2 and "--nodes is 1 to 64" in p.stderr
    assert os.listdir(tmp_path) == []  # nothing made for a refused start
