"""A real Mooncake Store on 127.0.0.1 (or --bind ADDR): the `mooncake_master` and the HTTP metadata server that the
`mooncake-transfer-engine-non-cuda` wheel installs (`pip install 'kvtier[mooncake]'`), for the Mooncake tier's tests
and for a stack whose shared tier is the store. The master keeps the objects' metadata and hands out room in the
segments its clients lend (each kvtier instance lends memory: `mooncake_segment_gb`); the metadata server is where
the clients' transfer engines find each other's segments. Each runs in a session of its own, its output in a log in
the state directory; the state file there names their pids and ports, and `down` stops those processes only.

    python -m deploy.mooncake_store up --state-dir D [--bind ADDR]   # prints kvtier's mooncake_master, then
                                                                       # mooncake_metadata_url
    python -m deploy.mooncake_store down --state-dir D

--bind ADDR: both listen on ADDR (an address of this host) so that clients in other network namespaces reach them;
each client then names its own address (`mooncake_local_hostname`), where the others fetch from its segment.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from kvconnector.errors import UserError
from replay.common.ports import free_port

from .processes import live_argv
from .stack import wait_for

HOST = "127.0.0.1"
STATE_FILE = "mooncake-store.json"
MASTER, META = "mooncake_master", "mooncake_http_metadata_server"


class StoreError(RuntimeError):
    """The store could not be started (one line, for the CLI; exit status 1)."""


class StoreRefused(UserError, StoreError):
    """What was asked cannot be done here: Mooncake not installed, a store still up (one line, exit status 2)."""


def exe(name: str) -> str:
    """The console script beside this Python (a venv's bin), else on PATH; "" when neither has it."""
    here = os.path.join(os.path.dirname(sys.executable), name)
    return here if os.access(here, os.X_OK) else (shutil.which(name) or "")


def missing() -> str | None:
    """Why the store cannot run here, or None."""
    absent = [n for n in (MASTER, META) if not exe(n)]
    if not absent:
        return None
    return f"Mooncake is not installed ({', '.join(absent)} missing; pip install 'kvtier[mooncake]')"


@dataclass
class MooncakeStore:
    state_dir: Path
    host: str = HOST
    master_port: int = 0
    meta_port: int = 0
    metrics_port: int = 0
    pids: dict[str, int] = field(default_factory=dict)  # MASTER / META -> pid
    master_starts: int = 0

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir)

    @property
    def master_addr(self) -> str:
        """What kvtier's `mooncake_master` takes."""
        return f"{self.host}:{self.master_port}"

    @property
    def metadata_url(self) -> str:
        """What kvtier's `mooncake_metadata_url` takes."""
        return f"http://{self.host}:{self.meta_port}/metadata"

    def save(self) -> None:
        state = {k: getattr(self, k) for k in ("host", "master_port", "meta_port", "metrics_port", "master_starts")}
        (self.state_dir / STATE_FILE).write_text(json.dumps({**state, "pids": self.pids}) + "\n")

    @classmethod
    def load(cls, state_dir: Path) -> MooncakeStore | None:
        path = Path(state_dir) / STATE_FILE
        if not path.exists():
            return None
        return cls(Path(state_dir), **json.loads(path.read_text()))

    def _spawn(self, name: str, argv: list[str], log: str) -> None:
        with open(self.state_dir / log, "ab") as out:  # the child keeps its own descriptor
            p = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.pids[name] = p.pid
        self.save()  # recorded before anything else happens
        self._accepting(p, name, self.master_port if name == MASTER else self.meta_port, log)

    def _accepting(self, proc: subprocess.Popen, name: str, port: int, log: str) -> None:
        def up() -> bool:
            if proc.poll() is not None:
                raise StoreError(f"{name} exited with {proc.returncode}: {_tail(self.state_dir / log)}")
            try:
                socket.create_connection((self.host, port), 0.2).close()
                return True
            except OSError:
                return False

        if not wait_for(up, 20, 0.05):
            raise StoreError(f"{name} did not accept connections on {self.host}:{port} in 20 s")

    def start(self) -> MooncakeStore:
        self.meta_port = self.meta_port or free_port(self.host)
        self.master_port = self.master_port or free_port(self.host)
        self.metrics_port = self.metrics_port or free_port(self.host)
        meta = [exe(META), "--host", self.host, "--port", str(self.meta_port), "--log-level", "WARNING"]
        self._spawn(META, meta, "meta.log")
        self.start_master()
        return self

    def start_master(self) -> None:
        """Start the master (again, after a kill: on the same port; the objects it knew are gone with it)."""
        self.master_starts += 1
        argv = [exe(MASTER), f"--rpc_address={self.host}", f"--rpc_port={self.master_port}"]
        argv += [f"--metrics_host={self.host}", f"--metrics_port={self.metrics_port}"]
        argv.append("--enable_metric_reporting=false")
        self._spawn(MASTER, argv, f"master{self.master_starts}.log")

    def send(self, name: str, sig: int) -> bool:
        """Send sig to MASTER or META if that recorded pid is still that program; whether it was."""
        pid = self.pids.get(name)
        if pid is None or not _is(pid, name):
            return False
        os.kill(pid, sig)
        return True

    def kill_master(self, sig: int = signal.SIGKILL) -> None:
        self.send(MASTER, sig)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            wait_for(lambda: not _is(self.pids[MASTER], MASTER), 10, 0.05)

    def stop(self, timeout_s: float = 10) -> None:
        for name in (MASTER, META):
            pid = self.pids.get(name)
            if pid is None or not _is(pid, name):
                continue
            os.kill(pid, signal.SIGCONT)  # a stopped one cannot act on SIGTERM
            os.kill(pid, signal.SIGTERM)
            if not wait_for(lambda pid=pid, name=name: not _is(pid, name), timeout_s, 0.05):
                os.kill(pid, signal.SIGKILL)
                wait_for(lambda pid=pid, name=name: not _is(pid, name), timeout_s, 0.05)
        (self.state_dir / STATE_FILE).unlink(missing_ok=True)


def up(state_dir: Path, host: str = HOST) -> MooncakeStore:
    """Start the store; on failure what was started is stopped and StoreError raised."""
    why = missing()
    if why:
        raise StoreRefused(why)
    state_dir = Path(state_dir).resolve()
    if (state_dir / STATE_FILE).exists():
        raise StoreRefused(f"a store of {state_dir} is recorded ({STATE_FILE}): run down first")
    state_dir.mkdir(parents=True, exist_ok=True)
    store = MooncakeStore(state_dir, host)
    try:
        return store.start()
    except BaseException:
        store.stop()
        raise


def down(state_dir: Path) -> bool:
    """Stop what `up` recorded in state_dir; False when nothing was."""
    store = MooncakeStore.load(state_dir)
    if store is None:
        return False
    store.stop()
    return True


def _is(pid: int, name: str) -> bool:
    """Whether pid is alive (not a zombie) and runs `name` (the master's binary, or the Python script of the
    metadata server): a recorded pid given since to another program is never signalled."""
    return name in {os.path.basename(a) for a in (live_argv(pid) or [])[:2]}


def _tail(path: Path) -> str:
    lines = path.read_text(errors="replace").strip().splitlines() if path.exists() else []
    return " | ".join(lines[-3:]) or "(nothing in its log)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m deploy.mooncake_store", description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=["up", "down"])
    ap.add_argument("--state-dir", required=True, type=Path, help="where the store's logs and its record live")
    ap.add_argument("--bind", default=HOST, help=f"the address both listen on [{HOST}]")
    args = ap.parse_args(argv)
    try:
        if args.action == "up":
            store = up(args.state_dir, args.bind)
            print(store.master_addr)
            print(store.metadata_url)
        elif not down(args.state_dir):
            print(f"no store recorded in {args.state_dir}", file=sys.stderr)
    except StoreError as exc:
        print(f"deploy.mooncake_store: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, UserError) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
