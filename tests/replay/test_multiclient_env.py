"""--num-clients: the parent's KVTIER_* settings reach each client through its share of the config, not twice; a new
--cache-dir is made before the block device under it is looked up; the clients merge with `kvtier merge`'s code (the
window is the union of the clients' windows, not the longest client's)."""

import json
import subprocess
import sys

import pytest

from replay.synthetic.merge import union_s


@pytest.mark.slow
def test_env_settings_are_split_not_inherited_and_new_cache_dir_is_measured(tmp_path):
    out = tmp_path / "r.json"
    env = {"KVTIER_NUM_USERS": "4", "PATH": "/usr/bin:/bin"}
    r = subprocess.run(
        [sys.executable, "-m", "replay.cli", "bench", "--num-clients", "2", "--duration", "2", "--no-progress"]
        + ["--cpu-mem-gb", "0.2", "--cache-dir", str(tmp_path / "new" / "cache"), "--output", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    # KVTIER_NUM_USERS=4 split over two clients: 2 each (inherited, it made 4 each).
    assert sorted((c["client"], c["config"]["num_users"]) for c in doc["clients"]) == [(0, 2), (1, 2)]
    assert doc["block_device"] is not None and doc["block_device"]["device"]
    windows = [c["summary"]["window"] for c in doc["clients"]]
    start, end = min(w["start_unix_s"] for w in windows), max(w["end_unix_s"] for w in windows)
    assert (doc["summary"]["window"]["start_unix_s"], doc["summary"]["window"]["end_unix_s"]) == (start, end)
    # The run's time is the union of the clients' windows (the longest client's window was used before): their span
    # when they overlap, less when a client started after another had ended (it happens on a loaded machine).
    union = union_s([(w["start_unix_s"], w["end_unix_s"]) for w in windows])
    assert doc["summary"]["elapsed_time"] == pytest.approx(union, abs=0.01)
