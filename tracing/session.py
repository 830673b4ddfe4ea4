"""Run the tracer around a piece of work, from Python.

    from tracing.session import TraceSession
    s = TraceSession(pid=os.getpid(), path=cache_dir, out_dir=results / "trace")
    s.start()            # returns once the probes are attached
    ...                  # the benchmark
    result = s.stop()    # {"histograms": ..., "fio_job": ..., "layers_on": [...], ...}

    # a serving stack by name, as on the command line (engine, children, KV server)
    s = TraceSession(names=["vllm"], path="/mnt/nvme", out_dir="trace")

It runs tracing/storage_latency_stack.sh in its own process group and ends
it with SIGINT, as Ctrl-C would. bpftrace needs root; the caller does not:
a caller that is not root runs the wrapper alone through `sudo -n` when
sudo allows it without a password (after `sudo -v`, or a sudoers rule for
the script), and otherwise start() raises TracingUnavailable with one line
saying what to run. Standard library only.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from .distill import write_whole
from .distiller import DistillError, distill
from .fio_job import render_job
from .histparse import parse_trace

__all__ = ["SCRIPT", "TraceSession", "TraceSessionError", "TracingUnavailable"]

SCRIPT = Path(__file__).resolve().parent / "storage_latency_stack.sh"
_READY = "Tracing storage I/O by layer"


class TraceSessionError(RuntimeError):
    """The tracer started but failed, or was used out of order."""


class TracingUnavailable(TraceSessionError):
    """Tracing cannot run here: not root, no bpftrace, or no such process."""


def privilege_prefix() -> list[str]:
    """What runs the wrapper as root: nothing when we are root, else
    `sudo -n` when sudo lets this user run the script without a password.
    TracingUnavailable (one line: what to run) otherwise."""
    if os.geteuid() == 0:
        return []
    sudo = shutil.which("sudo")
    # -l with a command: exit 0 only when that command is allowed, asking nothing (-n)
    if sudo and subprocess.run([sudo, "-n", "-l", str(SCRIPT)], capture_output=True, timeout=30).returncode == 0:
        return [sudo, "-n"]
    if sudo is None:
        raise TracingUnavailable(
            f"the tracer needs root (bpftrace) and sudo is not installed: run this command as root, "
            f"or install sudo and allow this user `{SCRIPT}` without a password"
        )
    raise TracingUnavailable(
        f"the tracer needs root (bpftrace) and `sudo -n {SCRIPT}` is not allowed: run `sudo -v` "
        f"and then this command again (or allow `{SCRIPT}` in sudoers, or run this command as root)"
    )


def check_available() -> list[str]:
    """The command prefix that runs the wrapper as root, or TracingUnavailable with the reason."""
    if shutil.which("bash") is None:
        raise TracingUnavailable("latency tracing needs bash")
    prefix = privilege_prefix()
    if shutil.which("bpftrace") is None and not prefix:
        raise TracingUnavailable("latency tracing needs bpftrace (apt-get install bpftrace)")
    return prefix


class TraceSession:
    """pid: a process to trace (all its threads); names: process names as
    the wrapper takes them (vllm: the engine, its children, its KV server);
    children: the pid's child processes too; path: a file or folder on the
    device to trace (its disk, partitions resolved), None for all devices;
    out_dir: where the raw trace, layers.txt, matched.tsv and job.fio go."""

    def __init__(
        self,
        *,
        pid: int | None = None,
        path: str | os.PathLike | None,
        names: list[str] | tuple[str, ...] = (),
        children: bool = False,
        out_dir: str | os.PathLike,
        json_output: bool = False,
        attach_timeout_s: float = 60.0,
        job_name: str = "kvtier",
    ):
        if pid is None and not names:
            raise TraceSessionError("TraceSession needs a pid or names")
        self.pid = None if pid is None else int(pid)
        self.names = list(names)
        self.children = children
        self.path = None if path is None else str(path)
        self.out_dir = Path(out_dir)
        self.json_output = json_output
        self.attach_timeout_s = attach_timeout_s
        self.job_name = job_name
        self._proc: subprocess.Popen | None = None
        self._sudo = False
        self._log = None

    @property
    def trace_path(self) -> Path:
        return self.out_dir / ("trace.json" if self.json_output else "trace.txt")

    def start(self) -> None:
        if self._proc is not None:
            raise TraceSessionError("TraceSession already started")
        if self.pid is not None and not Path(f"/proc/{self.pid}").exists():
            raise TracingUnavailable(f"no process with pid {self.pid}")
        prefix = check_available()
        self._sudo = bool(prefix)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        # through sudo the script runs by its path (what a sudoers rule names)
        cmd = [*prefix, str(SCRIPT)] if prefix else ["bash", str(SCRIPT)]
        cmd += [*self.names, "--out", str(self.out_dir)]
        if self.pid is not None:
            cmd += ["--pid", str(self.pid)]
        if self.children:
            cmd.append("--children")
        if self.path is not None:
            cmd += ["--dev", self.path]
        if self.json_output:
            cmd.append("--json")
        self._log = open(self.out_dir / "tracer.log", "w")
        self._proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent()
        )
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
            os.killpg(self._proc.pid, signal.SIGINT)  # through sudo: sudo relays it to the wrapper
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
            "matched": self._matched(),
            "histograms": tr.to_json()["maps"],
            "fio_job": None,
            "fio_error": None,
        }
        try:
            d = distill(tr, process=self.job_name)
            result["fio_job"] = render_job(d, source=str(self.trace_path), tr=tr)
            write_whole(self.out_dir / "job.fio", result["fio_job"])
        except DistillError as exc:
            result["fio_error"] = str(exc)
        return result

    def _matched(self) -> list[dict]:
        """The processes traced (matched.tsv): pid, instance, task name, why."""
        rows = []
        p = self.out_dir / "matched.tsv"
        if p.exists():
            for line in p.read_text(errors="replace").splitlines():
                f = line.split("\t")
                if len(f) >= 4 and f[0].isdigit():
                    rows.append({"pid": int(f[0]), "instance": f[1], "comm": f[2], "why": f[3]})
        return rows

    def _kill(self) -> None:
        if self._proc is not None:
            if self._sudo:
                # sudo cannot pass SIGKILL on: SIGTERM reaches the wrapper,
                # which detaches bpftrace; SIGKILL only after a grace period
                try:
                    os.killpg(self._proc.pid, signal.SIGTERM)
                    self._proc.wait(timeout=20)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    pass
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


def _die_with_parent():
    """Popen preexec_fn: the wrapper gets SIGTERM when this process dies, however it dies (prctl PR_SET_PDEATHSIG),
    and stops bpftrace as on Ctrl-C; in its own session, nothing else would stop it. (tracing/ stands alone, so this
    is its own copy of replay.common.leftovers.die_with_parent; through sudo, a setuid program, the kernel drops the
    request.)
    """
    parent = os.getpid()
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def preexec() -> None:
        prctl(1, int(signal.SIGTERM), 0, 0, 0)  # 1: PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before the request: the wrapper's parent is already another
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec
