"""Start and stop a throttlefs mount from Python (tests, benchmarks, `kvtier sweep`): the same command users run.

Nothing outlives the process that made the mount, even when it is killed: the server gets SIGTERM when its parent
dies (PR_SET_PDEATHSIG; SIGTERM unmounts), and a watchdog in a session of its own (so that a kill of the parent's
process group spares it) waits until both the parent and the server are gone, then unmounts a mount left dead (the
server killed too, by SIGKILL of the group) and removes the directories the caller made for the mount (`remove_after`).
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import tempfile
import time

from replay.common.leftovers import die_with_parent, watchdog

from .control import Client

_READY = re.compile(r"control (http://127\.0\.0\.1:\d+)")


class MountError(RuntimeError):
    pass


class Mount:
    """`with Mount(mnt, backing, ["--bw", "1GB/s"]) as m: m.client.set(lat_ms=1)`; stopped with SIGTERM on exit."""

    def __init__(
        self,
        mountpoint: str,
        backing: str,
        args: list[str] | tuple[str, ...] = (),
        launcher: list[str] | tuple[str, ...] | None = None,
        cwd: str | None = None,
        remove_after: list[str] | tuple[str, ...] = (),
    ):
        """`launcher`: the command before the mountpoint (default: this Python, -m deploy.throttle). `remove_after`:
        directories of the caller's (the mountpoint, the backing) that the watchdog removes once the mount is gone,
        should the caller be killed before it removes them itself."""
        self.mountpoint = mountpoint
        self.remove_after = [os.path.abspath(d) for d in remove_after]
        self._hold = -1  # this process's write end of the watchdog's pipe
        self.backing = backing
        self.cwd = cwd
        launcher = list(launcher) if launcher else [sys.executable, "-m", "deploy.throttle"]
        self.argv = [*launcher, mountpoint, "--backing", backing, *args]
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.client: Client | None = None
        self.returncode: int | None = None
        self.stderr = ""

    def start(self, timeout_s: float = 60.0) -> Mount:
        # stderr to a file, not a pipe: the server writes its summary there at exit and must never block on it.
        self._err = tempfile.TemporaryFile("w+")  # closed in stop()
        self._hold = watchdog(unmount=self.mountpoint, remove=self.remove_after)
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=subprocess.PIPE,
                stderr=self._err,
                text=True,
                cwd=self.cwd,
                pass_fds=(self._hold,),
                preexec_fn=die_with_parent(signal.SIGTERM),
            )
        except BaseException:
            os.close(self._hold)
            self._hold = -1
            self._err.close()
            raise
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                if not sel.select(timeout=0.2):
                    if self.proc.poll() is not None:
                        break
                    continue
                line = self.proc.stdout.readline()
                if not line:
                    break
                m = _READY.search(line)
                if m:
                    self.url = m.group(1)
                    self.client = Client(self.url)
                    return self
        finally:
            sel.close()
        self.stop()
        raise MountError(f"throttlefs did not mount {self.mountpoint}: {self.stderr.strip()[-500:]}")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 60.0) -> int:
        """Stop the server (SIGTERM unmounts); returns its exit code. Its stderr (the summary) is in .stderr."""
        if self.proc is None:
            return -1
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            subprocess.run(["fusermount3", "-u", "-z", self.mountpoint], check=False, capture_output=True, cwd=self.cwd)
        self.returncode = self.proc.returncode
        if self._hold >= 0:  # the server is gone: the watchdog may finish (nothing left for it to do)
            os.close(self._hold)
            self._hold = -1
        self._err.seek(0)
        self.stderr = self._err.read()
        self._err.close()
        if self.proc.stdout:
            self.proc.stdout.close()
        return self.returncode

    def __enter__(self) -> Mount:
        return self.start()

    def __exit__(self, *exc) -> None:
        if self.returncode is None:
            self.stop()
