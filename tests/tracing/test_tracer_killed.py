"""A process killed while it traces leaves no tracer behind: the wrapper (in a session of its own, so a Ctrl-C of
the terminal does not cut the capture short) gets SIGTERM when its parent dies, and stops bpftrace. Real bpftrace,
real SIGKILL (and SIGTERM, which a process may also die of without stopping its session)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("bpftrace"), reason="needs root and bpftrace"),
]

TRACER = textwrap.dedent(
    """
    import sys, time
    from tracing.session import TraceSession
    s = TraceSession(pid=int(sys.argv[2]), path=None, out_dir=sys.argv[1])
    s.start()
    print("attached", flush=True)
    time.sleep(600)
    """
)


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


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_killed_tracer_owner_leaves_no_bpftrace(tmp_path, sig):
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    owner = subprocess.Popen(
        [sys.executable, "-c", TRACER, str(tmp_path / "t"), str(target.pid)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert owner.stdout.readline().strip() == "attached"
        procs = descendants(owner.pid)
        assert "bpftrace" in {comm(p) for p in procs}
        owner.send_signal(sig)
        owner.wait(30)
        end = time.monotonic() + 90
        while any(alive(p) for p in procs) and time.monotonic() < end:
            time.sleep(0.2)
        assert not [comm(p) for p in procs if alive(p)]
    finally:
        for p in (owner, target):
            p.kill()
            p.wait()
        owner.stdout.close()
