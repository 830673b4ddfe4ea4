"""A real Mooncake Store for the tests: the wheel's HTTP metadata server and `mooncake_master`, each in its own
process group on 127.0.0.1 (free ports), logs in a directory the caller gives. The master can be killed and started
again on the same port (the fault tests); `stop` ends both and waits for them, so nothing is left behind."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys

import pytest
from helpers import wait_for

from replay.common.ports import free_port


def _exe(name: str) -> str:
    # The console scripts beside this Python (a venv's bin), else on PATH.
    here = os.path.join(os.path.dirname(sys.executable), name)
    return here if os.access(here, os.X_OK) else (shutil.which(name) or "")


class MooncakeServer:
    def __init__(self, log_dir) -> None:
        self.master_exe = _exe("mooncake_master")
        self.meta_exe = _exe("mooncake_http_metadata_server")
        if not (self.master_exe and self.meta_exe):
            pytest.skip("Mooncake is not installed (pip install 'kvtier[mooncake]')")
        self.log_dir = str(log_dir)
        self.master_port, self.meta_port, self.metrics_port = free_port(), free_port(), free_port()
        self.master_addr = f"127.0.0.1:{self.master_port}"
        self.metadata_url = f"http://127.0.0.1:{self.meta_port}/metadata"
        self.meta: subprocess.Popen | None = None
        self.master: subprocess.Popen | None = None
        self.master_starts = 0

    def _spawn(self, argv: list[str], log: str) -> subprocess.Popen:
        with open(os.path.join(self.log_dir, log), "ab") as out:
            return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def _accepting(self, proc: subprocess.Popen, port: int, what: str) -> None:
        def up() -> bool:
            assert proc.poll() is None, f"{what} exited with {proc.returncode} (log in {self.log_dir})"
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                return True
            except OSError:
                return False

        wait_for(up, timeout_s=20, what=f"{what} to accept connections on port {port}")

    def start(self) -> MooncakeServer:
        self.meta = self._spawn(
            [self.meta_exe, "--host", "127.0.0.1", "--port", str(self.meta_port), "--log-level", "WARNING"], "meta.log"
        )
        self._accepting(self.meta, self.meta_port, "mooncake_http_metadata_server")
        self.start_master()
        return self

    def start_master(self) -> None:
        self.master_starts += 1
        self.master = self._spawn(
            [
                self.master_exe,
                "--rpc_address=127.0.0.1",
                f"--rpc_port={self.master_port}",
                "--metrics_host=127.0.0.1",
                f"--metrics_port={self.metrics_port}",
                "--enable_metric_reporting=false",
            ],
            f"master{self.master_starts}.log",
        )
        self._accepting(self.master, self.master_port, "mooncake_master")

    def kill_master(self, sig: int = signal.SIGKILL) -> None:
        _end(self.master, sig)

    def stop(self) -> None:
        _end(self.master, signal.SIGTERM)
        _end(self.meta, signal.SIGTERM)


def _end(proc: subprocess.Popen | None, sig: int) -> None:
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
        proc.wait(5)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
    except ProcessLookupError:
        proc.wait(5)
