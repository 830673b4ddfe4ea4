"""`python -m deploy.mooncake_store up|down`: the store comes up on the address asked, says kvtier's two keys, refuses
a second `up` on the same state directory, and `down` stops exactly what it recorded."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from deploy import mooncake_store

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(mooncake_store.missing() is not None, reason=str(mooncake_store.missing())),
]
CLI = [sys.executable, "-m", "deploy.mooncake_store"]


def test_up_down(tmp_path):
    state = tmp_path / "mc"
    r = subprocess.run([*CLI, "up", "--state-dir", str(state)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    master, url = r.stdout.split()
    store = mooncake_store.MooncakeStore.load(state)
    try:
        assert (master, url) == (store.master_addr, store.metadata_url) and master.startswith("127.0.0.1:")
        assert all(mooncake_store._is(store.pids[n], n) for n in (mooncake_store.MASTER, mooncake_store.META))
        again = subprocess.run([*CLI, "up", "--state-dir", str(state)], capture_output=True, text=True, timeout=60)
        assert again.returncode == 2 and "run down first" in again.stderr
    finally:
        r = subprocess.run([*CLI, "down", "--state-dir", str(state)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    assert not any(mooncake_store._is(pid, n) for n, pid in store.pids.items())
    assert not (Path(state) / mooncake_store.STATE_FILE).exists()
    r = subprocess.run([*CLI, "down", "--state-dir", str(state)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "no store recorded" in r.stderr
