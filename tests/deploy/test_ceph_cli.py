"""`python -m deploy.ceph up|down`: the refusals (one line, exit 2) and a `down` with nothing recorded, without
starting a cluster. The cluster itself is started and removed by tests/kvconnector/test_s3_tier.py's fixture, which
also checks that `down` left nothing behind."""

import subprocess
import sys

from deploy import ceph


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "deploy.ceph", *args], capture_output=True, text=True, timeout=60)


def test_down_with_nothing_recorded_touches_nothing(tmp_path):
    (tmp_path / "mine.txt").write_text("not the cluster's")
    for _ in range(2):
        p = cli("down", "--state-dir", str(tmp_path))
        assert p.returncode == 0 and "no cluster recorded" in p.stderr
    assert [f.name for f in tmp_path.iterdir()] == ["mine.txt"]
    assert ceph.down(tmp_path) is False


def test_refusals_are_one_line_and_exit_2(tmp_path):
    p = cli("up", "--state-dir", str(tmp_path), "--osds", "0")
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("deploy.ceph: "), p.stderr
    assert "--osds 0" in lines[0] or ceph.missing() in lines[0]
    (tmp_path / ceph.STATE_FILE).write_text("ns=kvceph-x\n")  # a cluster recorded here: up first asks for down
    p = cli("up", "--state-dir", str(tmp_path))
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    assert "run down first" in lines[0] or ceph.missing() in lines[0]
