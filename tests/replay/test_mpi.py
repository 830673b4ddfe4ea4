"""`mpirun -n 2 kvtier bench` with real Open MPI on this machine: one client per rank, merged by rank 0; a rank
whose disk fills, or that gets a SIGINT, stops the other and the partial results are merged; a rank that cannot set
up stops the job before any window starts."""

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from bench_helpers import write_config
from helpers import wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed (apt-get install openmpi-bin)"),
    pytest.mark.skipif(
        importlib.util.find_spec("mpi4py") is None, reason="mpi4py not installed (pip install 'kvtier[mpi]')"
    ),
]

# --oversubscribe: two ranks on a 2-core machine; --allow-run-as-root: CI runs as root.
MPIRUN = ["mpirun", "-n", "2", "--oversubscribe", "--allow-run-as-root"]
KVTIER = [sys.executable, "-m", "replay.cli", "bench"]


def _env() -> dict:
    # Ranks inherit the test's environment; a KVTIER_* left in it would change every rank's config.
    return {k: v for k, v in os.environ.items() if not k.startswith("KVTIER_")}


def test_two_ranks_split_the_users_and_rank_0_merges(tmp_path):
    cfg = write_config(tmp_path, duration=2, num_users=5, storage_capacity_gb=0.4, io_op_log=str(tmp_path / "ops.csv"))
    p = subprocess.run(MPIRUN + KVTIER + ["--config", cfg], capture_output=True, text=True, timeout=240, env=_env())
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads((tmp_path / "out.json").read_text())
    ranks = doc["clients"]
    assert [(c["rank"], c["source"], c["config"]["num_users"], c["config"]["seed"]) for c in ranks] == [
        (0, "rank-0", 3, 11),
        (1, "rank-1", 2, 12),
    ]
    assert doc["config"]["num_users"] == 5 and doc["summary"]["num_clients"] == 2
    # Each rank ran in its own subdirectory, with its host's share of the disk tier.
    assert [c["config"]["cache_dir"] for c in ranks] == [str(tmp_path / "cache" / f"rank-{r}") for r in (0, 1)]
    assert [c["tiers"]["disk"]["capacity_bytes"] for c in ranks] == [ranks[0]["tiers"]["disk"]["capacity_bytes"]] * 2
    # Bytes and requests add up to the ranks' sections; the spec's aggregation keys too.
    for op, key in (("read", "total_read_bytes"), ("write", "total_write_bytes")):
        per_rank = [c["tiers"]["disk"][op]["bytes"] for c in ranks]
        assert doc["tiers"]["disk"][op]["bytes"] == sum(per_rank) == doc["storage_stats"][key]
    assert sum(c["tiers"]["disk"]["write"]["bytes"] for c in ranks) > 0
    assert doc["summary"]["total_requests"] == sum(c["summary"]["total_requests"] for c in ranks) > 0
    # The windows started together (a barrier after set-up) and the merged window is their union.
    starts = [c["summary"]["window"]["start_unix_s"] for c in ranks]
    assert abs(starts[0] - starts[1]) < 1.0
    ends = [c["summary"]["window"]["end_unix_s"] for c in ranks]
    assert doc["summary"]["window"]["start_unix_s"] == min(starts) and doc["summary"]["window"]["end_unix_s"] == max(
        ends
    )
    assert doc["summary"]["elapsed_time"] == pytest.approx(max(ends) - min(starts), abs=0.01)
    # Each rank logged its own storage operations.
    for r in (0, 1):
        assert len((tmp_path / f"ops.csv.rank-{r}").read_text().splitlines()) > 1
    # Nothing is left behind: the ranks' cache directories, which the run made, are gone.
    assert not (tmp_path / "cache").exists()


def test_a_rank_that_cannot_set_up_stops_the_job_before_any_window(tmp_path):
    """rank 1's cache subdirectory is a file: it fails to set up, so rank 0 never starts its 60 s window."""
    cfg = write_config(tmp_path, duration=60)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "rank-1").write_text("not a directory\n")
    t0 = time.monotonic()
    p = subprocess.run(MPIRUN + KVTIER + ["--config", cfg], capture_output=True, text=True, timeout=240, env=_env())
    assert p.returncode == 2, p.stderr[-3000:]
    assert time.monotonic() - t0 < 50  # rank 0 did not run its window
    lines = [line for line in p.stderr.splitlines() if line.startswith("kvtier bench:")]
    assert len(lines) == 1 and "rank 1: --cache-dir" in lines[0] and "no rank ran" in lines[0], p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "out.json").exists()
    assert sorted(os.listdir(tmp_path / "cache")) == ["rank-1"]  # rank 0's run directory is gone


def _fill(directory) -> None:
    """Write a file until the filesystem under `directory` is full (someone else filling the disk)."""
    block = b"\0" * (1 << 20)
    with open(os.path.join(directory, "filler"), "wb") as f:
        try:
            while True:
                f.write(block)
                f.flush()
        except OSError:
            pass


@pytest.mark.root(reason="mounting a small tmpfs")
def test_a_rank_whose_disk_fills_stops_the_other_and_partial_results_are_merged(tmp_path):
    cfg = write_config(tmp_path, duration=60, storage_capacity_gb=0)  # each disk tier: its filesystem's free space
    small = tmp_path / "cache" / "rank-1"
    small.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(small)], check=True)
    p = None
    try:
        t0 = time.monotonic()
        p = subprocess.Popen(
            MPIRUN + KVTIER + ["--config", cfg], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env()
        )
        wait_for(lambda: window_began(p, small), timeout_s=120, interval_s=0.2, what="rank 1's first entry")
        _fill(small)
        _, stderr = p.communicate(timeout=120)
        assert p.returncode == 1, stderr[-3000:]
        assert time.monotonic() - t0 < 55  # the 60 s window was cut short on both ranks
        assert "run failed" in stderr and "partial results" in stderr and "Traceback" not in stderr
        doc = json.loads((tmp_path / "out.json").read_text())
        r0, r1 = doc["clients"]
        assert doc["status"] == "failed" and r1["status"] == "failed" and "rank-1" in doc["error"]
        assert "no space left" in r1["error"]  # the disk really filled
        assert r0["status"] == "interrupted" and r0["stop_signal"] is None
        assert any("stopped early: rank 1 failed" in n for n in r0["notes"])
        assert r0["summary"]["elapsed_time"] < 50
        assert doc["summary"]["total_requests"] == r0["summary"]["total_requests"] + r1["summary"]["total_requests"]
        assert doc["tiers"]["disk"]["write"]["bytes"] == sum(c["tiers"]["disk"]["write"]["bytes"] for c in (r0, r1))
    finally:
        if p is not None and p.poll() is None:
            p.kill()
            p.wait()
        subprocess.run(["umount", "-l", str(small)])


def window_began(p: subprocess.Popen, cache) -> bool:
    """Rank 1's run window has begun: its disk tier holds an entry (set-up writes none here); fails if mpirun ended."""
    assert p.poll() is None, p.communicate()[1][-3000:]
    return any(f.endswith(".kv") for _, _, files in os.walk(cache) for f in files)


def _rank_pid(mpirun_pid: int, rank: int) -> int | None:
    """The pid of one rank among mpirun's descendants, found by the rank Open MPI put in its environment."""
    todo, want = [mpirun_pid], f"OMPI_COMM_WORLD_RANK={rank}".encode()
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                todo += [int(c) for c in f.read().split()]
            with open(f"/proc/{pid}/environ", "rb") as f:
                if want in f.read().split(b"\0"):
                    return pid
        except OSError:
            continue
    return None


def test_sigint_to_one_rank_stops_the_other_and_partial_results_are_merged(tmp_path):
    cfg = write_config(tmp_path, duration=60)
    p = subprocess.Popen(
        MPIRUN + KVTIER + ["--config", cfg], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env()
    )
    try:
        cache1 = tmp_path / "cache" / "rank-1"
        wait_for(lambda: window_began(p, cache1), timeout_s=120, interval_s=0.2, what="rank 1's first entry")
        os.kill(_rank_pid(p.pid, 1), signal.SIGINT)
        _, stderr = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130, stderr[-3000:]
    doc = json.loads((tmp_path / "out.json").read_text())
    r0, r1 = doc["clients"]
    assert doc["status"] == "interrupted" and r1["stop_signal"] == "SIGINT" and r0["stop_signal"] is None
    assert any("stopped early: rank 1 interrupted" in n for n in r0["notes"])
    assert max(r0["summary"]["elapsed_time"], r1["summary"]["elapsed_time"]) < 50
    assert doc["summary"]["total_requests"] == r0["summary"]["total_requests"] + r1["summary"]["total_requests"]
