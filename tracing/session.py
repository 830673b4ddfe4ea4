"""Run the tracer around a piece of work, from Python.

    from tracing.session import TraceSession
    s = TraceSession(pid=os.getpid(), path=cache_dir, out_dir=results / "trace")
    s.start()            # returns once the probes are attached
    ...                  # the benchmark
    result = s.stop()    # {"histograms": ..., "fio_job": ..., "layers_on": [...], ...}

It runs tracing/storage_latency_stack.sh (which must run as root) in its
own process group and ends it with SIGINT, as Ctrl-C would. Standard
library only.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from .distill import DistillError, distill, render_job
from .histparse import parse_trace

__all__ = ["SCRIPT", "TraceSession", "TraceSessionError", "TracingUnavailable"]

SCRIPT = Path(__file__).resolve().parent / "storage_latency_stack.sh"
_READY = "Tracing storage I/O by layer"


class TraceSessionError(RuntimeError):
    """The tracer started but failed, or was used out of order."""


class TracingUnavailable(TraceSessionError):
    """Tracing cannot run here: not root, no bpftrace, or no such process."""


def check_available() -> None:
    """Raise TracingUnavailable with the reason, or return if tracing can run."""
    if os.geteuid() != 0:
        raise TracingUnavailable("latency tracing needs root (bpftrace attaches kernel tracepoints)")
    if shutil.which("bpftrace") is None:
        raise TracingUnavailable("latency tracing needs bpftrace (apt-get install bpftrace)")
    if shutil.which("bash") is None:
        raise TracingUnavailable("latency tracing needs bash")


class TraceSession:
    """pid: the process to trace (all its threads); path: a file or folder on
    the device to trace (its disk, partitions resolved), None for all devices;
    out_dir: where the raw trace, layers.txt and job.fio go."""

    def __init__(
        self,
        *,
        pid: int,
        path: str | os.PathLike | None,
        out_dir: str | os.PathLike,
        json_output: bool = False,
        attach_timeout_s: float = 60.0,
        job_name: str = "kvtier",
    ):
        self.pid = int(pid)
        self.path = None if path is None else str(path)
        self.out_dir = Path(out_dir)
        self.json_output = json_output
        self.attach_timeout_s = attach_timeout_s
        self.job_name = job_name
        self._proc: subprocess.Popen | None = None
        self._log = None

    @property
    def trace_path(self) -> Path:
        return self.out_dir / ("trace.json" if self.json_output else "trace.txt")

    def start(self) -> None:
        if self._proc is not None:
            raise TraceSessionError("TraceSession already started")
        check_available()
        if not Path(f"/proc/{self.pid}").exists():
            raise TracingUnavailable(f"no process with pid {self.pid}")
        self.out_dir.mkdir(parents=True, exist_ok=True)
        cmd = ["bash", str(SCRIPT), str(self.pid), "--out", str(self.out_dir)]
        if self.path is not None:
            cmd += ["--dev", self.path]
        if self.json_output:
            cmd.append("--json")
        self._log = open(self.out_dir / "tracer.log", "w")
        self._proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + self.attach_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                self._close_log()
                msg = (self.out_dir / "tracer.log").read_text().strip().splitlines()
                raise TraceSessionError("tracer exited before attaching: " + (msg[-1] if msg else "no output"))
            try:
                if _READY in self.trace_path.read_text(errors="replace"):
                    return
            except FileNotFoundError:
                pass
            time.sleep(0.05)
        self._kill()
        raise TraceSessionError(f"tracer did not attach within {self.attach_timeout_s:.0f} s")

    def stop(self, timeout_s: float = 60.0) -> dict:
        """End the capture; returns histograms, the fio job text (None when the
        trace has no block I/O, with the reason in "fio_error") and the layers."""
        if self._proc is None:
            raise TraceSessionError("TraceSession.stop() before start()")
        try:
            os.killpg(self._proc.pid, signal.SIGINT)
        except ProcessLookupError:
            pass
        try:
            rc = self._proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._kill()
            raise TraceSessionError(f"tracer did not finish within {timeout_s:.0f} s of SIGINT") from None
        finally:
            self._close_log()
        self._proc = None
        if rc not in (0, 130):
            tail = (self.out_dir / "tracer.log").read_text().strip().splitlines()[-3:]
            raise TraceSessionError(f"tracer failed (exit {rc}): " + " | ".join(tail))
        tr = parse_trace(self.trace_path.read_text(errors="replace"))
        layers = {}
        lp = self.out_dir / "layers.txt"
        if lp.exists():
            for line in lp.read_text().splitlines():
                k, _, v = line.partition(":")
                layers[k.strip()] = v.strip()
        result = {
            "trace_path": str(self.trace_path),
            "window_ns": tr.window_ns,
            "truncated": tr.truncated,
            "layers_on": layers.get("layers_on", "").split(),
            "layers_off": layers.get("layers_off", ""),
            "histograms": tr.to_json()["maps"],
            "fio_job": None,
            "fio_error": None,
        }
        try:
            d = distill(tr, process=self.job_name)
            result["fio_job"] = render_job(d, source=str(self.trace_path), tr=tr)
            (self.out_dir / "job.fio").write_text(result["fio_job"])
        except DistillError as exc:
            result["fio_error"] = str(exc)
        return result

    def _kill(self) -> None:
        if self._proc is not None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._proc.wait()
            self._proc = None
        self._close_log()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> TraceSession:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._proc is not None:
            if exc[0] is None:
                self.result = self.stop()
            else:
                self._kill()
