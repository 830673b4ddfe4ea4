"""The servers of a stack as process groups recorded in its state directory.

Each server runs in a new session (its own process group, so a signal to the group reaches the helpers it forks),
stdin from /dev/null, stdout and stderr appended to STATE/NAME.log. STATE/pids gets one `NAME PID` line per start
(the last line of a name wins: a restart appends), STATE/NAME.cmd the command, shell-quoted, so `restart-lmcache`
starts it again as it was. The servers outlive the process that started them; whoever adopts them reaps them.

Standard library only: deploy/run-stack.sh runs this with whatever python3 it finds.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

# Children of this process: polled before a group is probed, so one that exited is reaped (a zombie still answers
# a signal) and the group reads as gone.
_children: dict[int, subprocess.Popen] = {}


class NotHealthy(RuntimeError):
    """A server exited during start-up or did not answer before the deadline (what is printed says which)."""


def start(state: Path, name: str, argv: list[str]) -> int:
    """Run argv as server `name`; its pid, which is also its process group."""
    (state / f"{name}.cmd").write_text(shlex.join(argv))
    with open(state / f"{name}.log", "ab") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    _children[proc.pid] = proc
    with open(state / "pids", "a") as fh:
        fh.write(f"{name} {proc.pid}\n")
    return proc.pid


def recorded(state: Path) -> list[tuple[str, int]]:
    """The (name, pid) lines of STATE/pids in the order they were started; [] when there is none."""
    p = state / "pids"
    if not p.exists():
        return []
    return [(name, int(pid)) for name, pid in (line.split() for line in p.read_text().splitlines() if line.strip())]


def pid_of(state: Path, name: str) -> int | None:
    """The last pid recorded for `name`, None when none is."""
    return dict(recorded(state)).get(name)


def forget(state: Path, name: str) -> None:
    """Drop `name`'s lines from STATE/pids."""
    keep = [f"{n} {p}\n" for n, p in recorded(state) if n != name]
    (state / "pids").write_text("".join(keep))


def group_alive(pgid: int) -> bool:
    proc = _children.get(pgid)
    if proc is not None:
        proc.poll()
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):  # PermissionError: not ours (a reused pid)
        return False


def live_argv(pid: int) -> list[str] | None:
    """The command line of pid if it is alive and not a zombie, else None: what a recorded pid's owner checks before
    signalling it, so a pid the system gave to another process since is never signalled."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    if stat.rpartition(")")[2].split()[0] == "Z":
        return None
    return [a.decode(errors="replace") for a in argv if a]


def stop_groups(grace_s: float, sig: int, pgids: list[int]) -> None:
    """Signal each group, give them grace_s together, SIGKILL what is left, then wait (5 s at most) for it to go."""
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
    deadline = time.monotonic() + grace_s
    for pgid in pgids:
        while group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if group_alive(pgid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
    for pgid in pgids:
        for _ in range(50):
            if not group_alive(pgid):
                break
            time.sleep(0.1)


def answers_200(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except (OSError, ValueError):
        return False


def wait_http(state: Path, name: str, url: str, deadline: float) -> None:
    """Until url answers 200 (deadline on time.monotonic()); raises NotHealthy early when name's group is gone, after
    printing the end of its log to stderr."""
    pid = pid_of(state, name)
    while not answers_200(url):
        if pid is not None and not group_alive(pid):
            log = state / f"{name}.log"
            print(f"run-stack.sh: {name} exited during start-up; last lines of {log}:", file=sys.stderr)
            lines = log.read_text(errors="replace").splitlines()[-25:] if log.exists() else []
            if lines:
                print("\n".join(lines), file=sys.stderr)
            raise NotHealthy(name)
        if time.monotonic() > deadline:
            print(
                f"run-stack.sh: {name} not healthy at {url} after the timeout; log: {state / name}.log", file=sys.stderr
            )
            raise NotHealthy(name)
        time.sleep(0.5)
