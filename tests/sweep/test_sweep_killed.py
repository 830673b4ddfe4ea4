"""A killed `kvtier sweep` leaves nothing behind: no throttlefs server, no FUSE mount (live or dead), no mount or
backing directory, no driver run. Real sweeps over a real FUSE mount, killed for real: the sweep alone (SIGKILL,
SIGTERM) or its whole process group (SIGKILL, which kills the server too and leaves a dead mount to the watchdog)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deploy.throttle.cli import check_fuse

pytestmark = [pytest.mark.slow, pytest.mark.skipif(check_fuse() is not None, reason=f"FUSE: {check_fuse()}")]

BACKING_PREFIX = "kvtier-sweep-kv-"


def mounts() -> set[str]:
    with open("/proc/self/mountinfo") as f:
        return {line.split()[4].encode().decode("unicode_escape") for line in f}


def descendants(pid: int) -> set[int]:
    parents = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                parents[int(p)] = int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                pass
    out, todo = set(), [pid]
    while todo:
        cur = todo.pop()
        kids = {c for c, pp in parents.items() if pp == cur}
        out |= kids
        todo.extend(kids)
    return out


def own_backing(pid: int) -> list[Path]:
    """The backing directory named on the command line of one of this sweep's processes (its throttlefs server):
    never another's, as a glob of the machine-wide temp directory would be beside another sweep."""
    found = []
    for p in descendants(pid):
        try:
            args = Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        found += [Path(a) for a in args if Path(a).name.startswith(BACKING_PREFIX)]
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_for(pred, what: str, timeout_s: float = 90):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        got = pred()
        if got:
            return got
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


@pytest.mark.parametrize("kill", ["SIGKILL", "SIGKILL-group", "SIGTERM", "SIGINT-group"])
def test_a_killed_sweep_leaves_no_server_mount_or_directory(tmp_path, kill):
    cmd = [sys.executable, "-m", "deploy.sweep", "--bw", "none,25MB/s", "--lat-ms", "0", "--driver", "bench"]
    cmd += ["--output", str(tmp_path / "s.json"), "--", "--num-users", "2", "--duration", "120"]
    cmd += ["--cpu-mem-gb", "0", "--gpu-mem-gb", "0", "--storage-capacity-gb", "0.2", "--max-context-tokens", "256"]
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    sweep = subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        mnt = wait_for(lambda: [m for m in mounts() if m.startswith(f"{tmp_path}/kvtier-sweep-mnt-")], "the mount")[0]
        backing = wait_for(lambda: own_backing(sweep.pid), "the backing directory")[0]
        # A driver run is under way: its cache directory on the mount holds entries.
        wait_for(lambda: any(f.endswith(".kv") for _, _, fs in os.walk(backing) for f in fs), "the first run")
        procs = descendants(sweep.pid)
        assert len(procs) >= 2  # the server and the run (and the watchdog, in a session of its own)
    finally:
        sig = getattr(signal, kill.split("-")[0])
        if kill.endswith("-group"):
            os.killpg(sweep.pid, sig)
        else:
            sweep.send_signal(sig)
        sweep.wait(120)
        sweep.stderr.close()
    wait_for(lambda: mnt not in mounts(), "the mount to go")
    wait_for(lambda: not any(alive(p) for p in procs), "the server and the run to end")
    wait_for(lambda: not os.path.lexists(mnt) and not backing.exists(), "the mount and backing directories to go")
