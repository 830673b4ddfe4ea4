"""Start and stop a throttlefs mount from Python (tests, benchmarks, `kvtier sweep`): the same command users run."""

from __future__ import annotations

import re
import selectors
import signal
import subprocess
import sys
import tempfile
import time

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
    ):
        """`launcher`: the command before the mountpoint (default: this Python, -m deploy.throttle)."""
        self.mountpoint = mountpoint
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
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=self._err, text=True, cwd=self.cwd)
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
