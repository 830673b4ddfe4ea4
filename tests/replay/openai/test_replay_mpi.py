"""`mpirun -n 2 kvtier replay` with real Open MPI against one fake server: the ranks together send what one process
sends, each request once, a session's turns from one rank; rank 0 writes one merged result; a mistake on the command
line or on one rank's host is one line and a non-zero exit of the whole job; a signal to one rank or to mpirun saves
the merged partial result."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter

import psutil
import pytest
from helpers import wait_for

from replay.openai.cli import main
from replay.openai.fake_server import FakeServer, FakeServerConfig

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed (apt-get install openmpi-bin)"),
    pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None, reason="mpi4py not installed (pip install mpi4py)"),
]

# --oversubscribe: two ranks on a 2-core machine; --allow-run-as-root: CI runs as root.
MPIRUN = ["mpirun", "-n", "2", "--oversubscribe", "--allow-run-as-root"]
KVTIER = [sys.executable, "-m", "replay.cli", "replay"]
# Multi-turn sessions (12 of 3 turns), so that a session split between ranks would show.
TRACE = ["--source", "synthetic", "--turns", "3", "--num-requests", "36", "--input-len", "16", "--output-len", "4"]
TRACE += ["--request-rate", "40", "--seed", "5", "--max-concurrency", "4", "--quiet"]


def _env() -> dict:
    # Ranks inherit the test's environment; a KVTIER_* left in it would change every rank's config.
    return {k: v for k, v in os.environ.items() if not k.startswith("KVTIER_")}


def _mpirun(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*MPIRUN, *KVTIER, *args], capture_output=True, text=True, timeout=timeout, env=_env())


def _sent(srv: FakeServer) -> Counter:
    """Each request the server received, told apart by its session and its turn's text."""
    return Counter(
        (h.get("X-Session-ID"), b["messages"][-1]["content"]) for h, b in zip(srv.recent_headers, srv.recent_bodies)
    )


def test_two_ranks_send_what_one_process_sends_once_each_and_rank_0_merges(tmp_path):
    cfg = FakeServerConfig(ttft_ms=15, itl_ms=2, default_max_tokens=4)
    with FakeServer(cfg) as alone:
        assert main(["--base-url", alone.base_url, "--model", "f", "--output", str(tmp_path / "one.json"), *TRACE]) == 0
        sent_alone = _sent(alone)
    with FakeServer(cfg) as srv:
        out, detail = tmp_path / "job.json", tmp_path / "job.jsonl"
        p = _mpirun("--base-url", srv.base_url, "--model", "f", "--output", str(out), "--detail", str(detail), *TRACE)
        assert p.returncode == 0, p.stderr[-3000:]
        sent = _sent(srv)
    one, job = json.loads((tmp_path / "one.json").read_text()), json.loads(out.read_text())
    ranks = job["ranks"]
    # The same requests as one process, each reaching the server once.
    assert job["completed"] == one["completed"] == 36 and job["failed"] == 0
    assert sum(sent.values()) == 36 and set(sent.values()) == {1} and sent == sent_alone
    assert [r["rank"] for r in ranks] == [0, 1] and [r["completed"] for r in ranks] == [18, 18]
    assert job["total_output_tokens"] == sum(r["total_output_tokens"] for r in ranks) == one["total_output_tokens"]
    # A session's turns all came from one rank; both ranks sent sessions.
    rows = [json.loads(line) for line in detail.read_text().splitlines()]
    by_session: dict[str, set] = {}
    for row in rows:
        by_session.setdefault(row["session_id"], set()).add(row["rank"])
    assert len(rows) == 36 and len(by_session) == 12 and all(len(r) == 1 for r in by_session.values())
    assert {r for rs in by_session.values() for r in rs} == {0, 1} and [r["sessions"] for r in ranks] == [6, 6]
    # Percentiles of the pooled samples lie between the ranks' own; the window is the union of theirs.
    for p in ("p50", "p90"):
        own = [r["ttft_ms"][p] for r in ranks]
        assert min(own) <= job["ttft_ms"][p] <= max(own), (p, own, job["ttft_ms"])
    assert job["ttft_ms"]["count"] == 36
    starts = [r["window"]["start_unix_s"] for r in ranks]
    assert abs(starts[0] - starts[1]) < 1.0  # the windows started together
    assert job["duration_s"] == pytest.approx(max(r["window"]["end_unix_s"] for r in ranks) - min(starts), abs=0.01)
    assert job["request_throughput"] == pytest.approx(36 / job["duration_s"], rel=0.01)


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--max-concurrency", "1"], "--max-concurrency 1 is the job's total, divided among 2 ranks"),
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["--source", "sharegpt", "--dataset-path", "/nonexistent/sg.json"], "no rank ran"),
        (["--output", "{tmp}/a-file/out.json"], "--output: {tmp}/a-file is not a directory"),
    ],
)
def test_a_mistake_is_one_line_and_a_non_zero_exit_of_every_rank(tmp_path, flags, says):
    (tmp_path / "a-file").write_text("a file, not a directory\n")
    flags, says = [f.format(tmp=tmp_path) for f in flags], says.format(tmp=tmp_path)
    with FakeServer(FakeServerConfig()) as srv:
        args = ["--base-url", srv.base_url, "--model", "f", "--output", str(tmp_path / "o.json"), "--quiet"]
        t0 = time.monotonic()
        p = _mpirun(*args, "--num-requests", "4", *flags, timeout=90)
        assert srv.requests_seen == 0
    assert p.returncode == 2, p.stderr[-3000:]
    assert time.monotonic() - t0 < 60
    lines = [line for line in p.stderr.splitlines() if line.startswith("kvtier replay:")]
    assert len(lines) == 1 and says in lines[0] and "rank 0" not in lines[0], p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "o.json").exists()


def _rank_pid(mpirun_pid: int, rank: int) -> int:
    """One rank's process among mpirun's descendants, found by the rank Open MPI put in its environment."""
    for proc in psutil.Process(mpirun_pid).children(recursive=True):
        try:
            if proc.environ().get("OMPI_COMM_WORLD_RANK") == str(rank):
                return proc.pid
        except psutil.Error:
            continue
    raise LookupError(f"rank {rank} not found")


def _long_run(srv: FakeServer, out) -> subprocess.Popen:
    args = ["--base-url", srv.base_url, "--model", "f", "--output", str(out), "--quiet", "--source", "synthetic"]
    args += ["--num-requests", "400", "--request-rate", "8", "--input-len", "16", "--output-len", "4"]
    return subprocess.Popen(
        [*MPIRUN, "--mca", "odls_base_sigkill_timeout", "10", *KVTIER, *args, "--duration", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )


def _stop(p: subprocess.Popen, pid: int, sig: int, srv: FakeServer) -> str:
    try:
        wait_for(lambda: srv.requests_seen >= 6, timeout_s=60, interval_s=0.2, what="the ranks' first requests")
        os.kill(pid() if callable(pid) else pid, sig)
        return p.communicate(timeout=60)[1]
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_sigint_to_one_rank_stops_the_other_and_the_partial_results_are_merged(tmp_path):
    with FakeServer(FakeServerConfig(ttft_ms=20, default_max_tokens=4)) as srv:
        p = _long_run(srv, tmp_path / "o.json")
        stderr = _stop(p, lambda: _rank_pid(p.pid, 1), signal.SIGINT, srv)
        seen = srv.requests_seen
    assert p.returncode == 130, stderr[-3000:]
    job = json.loads((tmp_path / "o.json").read_text())
    r0, r1 = job["ranks"]
    assert job["aborted"].startswith("rank 1: interrupted (SIGINT)") and "Traceback" not in stderr
    assert r0["stopped_by"].startswith("rank 1 interrupted") and r1["stopped_by"] is None
    assert job["duration_s"] < 40  # the 60 s window was cut short on both ranks
    assert 0 < job["completed"] == r0["completed"] + r1["completed"] <= seen


def test_ctrl_c_on_mpirun_saves_the_merged_partial_results(tmp_path):
    """Open MPI turns mpirun's SIGINT into a SIGTERM to every rank (SIGKILL after odls_base_sigkill_timeout)."""
    with FakeServer(FakeServerConfig(ttft_ms=20, default_max_tokens=4)) as srv:
        p = _long_run(srv, tmp_path / "o.json")
        stderr = _stop(p, p.pid, signal.SIGINT, srv)
    assert p.returncode != 0, stderr[-3000:]  # mpirun's own status for a job it stopped (Open MPI 4: 1)
    assert "run ended early: rank" in stderr and "Traceback" not in stderr
    job = json.loads((tmp_path / "o.json").read_text())
    assert "interrupted (SIGTERM)" in job["aborted"] and job["duration_s"] < 40
    assert job["completed"] == sum(r["completed"] for r in job["ranks"]) > 0
