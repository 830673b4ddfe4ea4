"""`python -m deploy.redis_cluster up|down`: a real three-master cluster on 127.0.0.1, its URL on stdout, and a `down`
that stops only the processes it started and removes only its own files."""

import json
import shutil
import subprocess
import sys

import pytest
import redis

from deploy.redis_cluster import STATE_FILE, _is_node

pytestmark = pytest.mark.skipif(
    shutil.which("redis-server") is None or shutil.which("redis-cli") is None,
    reason="redis-server is not installed (apt-get install redis-server; deploy/install-system-deps.sh)",
)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "deploy.redis_cluster", *args], capture_output=True, text=True, timeout=120
    )


@pytest.mark.slow
def test_up_prints_the_url_and_down_removes_only_its_own(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / "mine.txt").write_text("not the cluster's")
    up = cli("up", "--state-dir", str(state), "--masters", "3")
    assert up.returncode == 0, up.stderr
    url = up.stdout.strip()
    assert url.startswith("redis-cluster://127.0.0.1:") and len(url.split(",")) == 3
    recorded = json.loads((state / STATE_FILE).read_text())
    pids = {int(p): pid for p, pid in recorded["pids"].items()}
    for port, pid in pids.items():
        assert _is_node(pid, port)
        info = redis.Redis("127.0.0.1", port).execute_command("CLUSTER", "INFO").decode()
        assert "cluster_state:ok" in info and "cluster_known_nodes:3" in info
    again = cli("up", "--state-dir", str(state))
    assert again.returncode == 2 and "still up" in again.stderr and "Traceback" not in again.stderr

    down = cli("down", "--state-dir", str(state))
    assert down.returncode == 0, down.stderr
    assert not any(_is_node(pid, port) for port, pid in pids.items())
    assert sorted(p.name for p in state.iterdir()) == ["mine.txt"]


def test_mistakes_are_one_line():
    few = cli("up", "--state-dir", "/nonexistent/never-made", "--masters", "2")
    assert few.returncode == 2 and few.stderr.strip().count("\n") == 0 and "at least 3 masters" in few.stderr
    high = cli("up", "--state-dir", "/nonexistent/never-made", "--port", "60000")
    assert high.returncode == 2 and "below 65536" in high.stderr
