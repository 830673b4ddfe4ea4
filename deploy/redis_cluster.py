"""A real Redis Cluster of N masters (no replicas) on 127.0.0.1 (or --bind ADDR), for the Redis tier's tests and for
a stack whose shared tier is a cluster. Each node is a daemonized redis-server with its own port and data directory
under a state directory; the state file there names the ports and pids, and `down` stops those processes only and
removes those files only.

    python -m deploy.redis_cluster up --state-dir D [--masters 3] [--port P] [--bind ADDR]  # prints the redis_url
    python -m deploy.redis_cluster down --state-dir D

--bind ADDR: the nodes listen on ADDR (an address of this host) and announce it to clients (cluster-announce-ip), so
clients in other network namespaces reach every node, redirects included: 127.0.0.1 is each namespace's own loopback.

Nodes keep an append-only file (`appendonly yes`, fsync every second): a node killed and restarted on its port and
data directory rejoins with its slots and its keys (all but about the last second of writes).
`cluster-require-full-coverage no`: with a master down the others keep serving their slots, which is what a cache
wants (the default stops the whole cluster once the dead master is flagged as failed).
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
import time
from dataclasses import dataclass, field
from pathlib import Path

from kvconnector.errors import UserError
from replay.common.ports import all_free, free_port_block

from .processes import live_argv
from .stack import wait_for

HOST = "127.0.0.1"
STATE_FILE = "redis-cluster.json"
BUS_OFFSET = 10000  # Redis Cluster's bus port is the client port + 10000
NODE_TIMEOUT_MS = 3000


class ClusterError(RuntimeError):
    """The cluster could not be started or stopped (one line, for the CLI; exit status 1)."""


class ClusterRefused(UserError, ClusterError):
    """What was asked cannot be done here: too few masters, ports in use, a cluster still up, redis not installed
    (one line, exit status 2)."""


@dataclass
class RedisClusterNodes:
    state_dir: Path
    ports: list[int]
    pids: dict[int, int] = field(default_factory=dict)  # port -> pid of its redis-server
    host: str = HOST  # the address every node binds and announces

    @property
    def startup_nodes(self) -> str:
        return ",".join(f"{self.host}:{p}" for p in self.ports)

    @property
    def url(self) -> str:
        """What kvtier's `redis_url` takes."""
        return f"redis-cluster://{self.startup_nodes}"

    def node_dir(self, port: int) -> Path:
        return self.state_dir / f"redis-{port}"

    def save(self) -> None:
        state = {"ports": self.ports, "pids": {str(p): pid for p, pid in self.pids.items()}, "host": self.host}
        (self.state_dir / STATE_FILE).write_text(json.dumps(state) + "\n")

    @classmethod
    def load(cls, state_dir: Path) -> RedisClusterNodes | None:
        path = Path(state_dir) / STATE_FILE
        if not path.exists():
            return None
        state = json.loads(path.read_text())
        pids = {int(p): pid for p, pid in state["pids"].items()}
        return cls(Path(state_dir), state["ports"], pids, state.get("host", HOST))

    def start_node(self, port: int, timeout_s: float = 20) -> None:
        """Start (or restart) the node on `port` from its data directory: same port, same nodes.conf and AOF."""
        d = self.node_dir(port)
        d.mkdir(parents=True, exist_ok=True)
        conf = d / "redis.conf"
        conf.write_text(
            f"bind {self.host}\ncluster-announce-ip {self.host}\nport {port}\ndir {d}\ndaemonize yes\n"
            f"pidfile {d / 'redis.pid'}\nlogfile {d / 'redis.log'}\n"
            f"cluster-enabled yes\ncluster-config-file nodes.conf\ncluster-node-timeout {NODE_TIMEOUT_MS}\n"
            'cluster-require-full-coverage no\nappendonly yes\nappendfsync everysec\nsave ""\n'
            # Redis refuses clients from other addresses than loopback without a password (protected mode): --bind
            # names an address of this host for namespaces on it, which is the point of binding it.
            + ("" if self.host == HOST else "protected-mode no\n")
        )
        (d / "redis.pid").unlink(missing_ok=True)
        p = subprocess.run([_redis_server(), str(conf)], capture_output=True, text=True, timeout=30)
        if p.returncode != 0:
            raise ClusterError(f"redis-server on port {port} did not start: {(p.stderr or p.stdout).strip()[-300:]}")

        def up() -> int | None:
            try:
                pid = int((d / "redis.pid").read_text())
                socket.create_connection((self.host, port), 0.2).close()
                return pid
            except (OSError, ValueError):
                return None

        pid = wait_for(up, timeout_s, 0.05)
        if not pid:
            raise ClusterError(f"redis-server on port {port} did not accept connections in {timeout_s:g} s: {_log(d)}")
        self.pids[port] = pid
        self.save()

    def send(self, port: int, sig: int) -> int | None:
        """Send `sig` to the node on `port` if it is still the redis-server started there; its pid, else None."""
        pid = self.pids.get(port)
        if pid is None or not _is_node(pid, port):
            return None
        os.kill(pid, sig)
        return pid

    def kill(self, port: int, sig: int = signal.SIGKILL, timeout_s: float = 10) -> None:
        """Send `sig` (SIGKILL, SIGTERM) to the node on `port` and wait for it to end (SIGKILL after timeout_s)."""
        pid = self.send(port, sig)
        if pid is None:
            return
        if not wait_for(lambda: not _is_node(pid, port), timeout_s, 0.02):
            os.kill(pid, signal.SIGKILL)
            wait_for(lambda: not _is_node(pid, port), timeout_s, 0.02)

    def cluster_ok(self, port: int) -> bool:
        info = _cli(port, "cluster", "info", check=False, host=self.host)
        return "cluster_state:ok" in info

    def wait_ok(self, ports: list[int] | None = None, timeout_s: float = 30) -> None:
        ports = self.ports if ports is None else ports
        if not wait_for(lambda: all(self.cluster_ok(p) for p in ports), timeout_s, 0.1):
            raise ClusterError(f"the cluster on {self.startup_nodes} is not cluster_state:ok after {timeout_s:g} s")

    def stop(self) -> None:
        """Stop the nodes this state names and remove their directories and the state file (nothing else)."""
        for port in self.ports:
            self.kill(port, signal.SIGTERM)
            shutil.rmtree(self.node_dir(port), ignore_errors=True)
        (self.state_dir / STATE_FILE).unlink(missing_ok=True)


def start(
    state_dir: Path, masters: int = 3, port: int | None = None, timeout_s: float = 60, host: str = HOST
) -> RedisClusterNodes:
    """A cluster of `masters` masters on host:port..port+masters-1 (a free block if None), slots spread evenly by
    `redis-cli --cluster create`, waited for until every node says cluster_state:ok. On failure, whatever started is
    stopped and ClusterError raised."""
    if masters < 3:
        raise ClusterRefused("--masters: a Redis Cluster needs at least 3 masters (redis-cli --cluster create)")
    state_dir = Path(state_dir)
    old = RedisClusterNodes.load(state_dir)
    if old is not None and any(_is_node(pid, p) for p, pid in old.pids.items()):
        raise ClusterRefused(f"a cluster from {state_dir} is still up ({old.startup_nodes}): run down first")
    if not _bindable(host):
        raise ClusterRefused(f"--bind {host}: not an address of this host")
    base = port if port is not None else free_port_block(masters, host, offsets=(0, BUS_OFFSET))
    ports = list(range(base, base + masters))
    if not (0 < base and ports[-1] + BUS_OFFSET <= 65535):
        raise ClusterRefused(f"--port {base}: ports and their cluster bus ports (+{BUS_OFFSET}) must be below 65536")
    if not all_free([*ports, *(p + BUS_OFFSET for p in ports)], host):
        raise ClusterRefused(f"--port {base}: ports {base}-{ports[-1]} or their bus ports (+{BUS_OFFSET}) are in use")
    state_dir.mkdir(parents=True, exist_ok=True)
    nodes = RedisClusterNodes(state_dir, ports, host=host)
    try:
        for p in nodes.ports:
            nodes.start_node(p)
        _cli(None, "--cluster", "create", *nodes.startup_nodes.split(","), "--cluster-replicas", "0", "--cluster-yes")
        nodes.wait_ok(timeout_s=timeout_s)
    except BaseException:
        nodes.stop()
        raise
    return nodes


def stop(state_dir: Path) -> bool:
    """Stop the cluster `start` recorded in state_dir; False when there is none."""
    nodes = RedisClusterNodes.load(Path(state_dir))
    if nodes is None:
        return False
    nodes.stop()
    return True


def _redis_server() -> str:
    exe = shutil.which("redis-server")
    if exe is None:
        raise ClusterRefused("redis-server is not installed (deploy/install-system-deps.sh)")
    return exe


def _cli(port: int | None, *args: str, check: bool = True, host: str = HOST) -> str:
    exe = shutil.which("redis-cli")
    if exe is None:
        raise ClusterRefused("redis-cli is not installed (deploy/install-system-deps.sh)")
    where = ["-h", host, "-p", str(port)] if port is not None else []
    p = subprocess.run([exe, *where, *args], capture_output=True, text=True, timeout=60)
    if check and p.returncode != 0:
        raise ClusterError(f"redis-cli {' '.join(args[:2])} failed: {(p.stderr or p.stdout).strip()[-300:]}")
    return p.stdout


def _bindable(host: str) -> bool:
    """Whether host is an IPv4 address of this host (in this network namespace)."""
    try:
        with socket.socket() as s:
            s.bind((host, 0))
        return True
    except OSError:
        return False


def _is_node(pid: int, port: int) -> bool:
    """Whether pid is a live (not zombie) redis-server serving `port`: a recorded pid the system gave to another
    process since is never signalled."""
    title = " ".join(live_argv(pid) or [])
    return "redis-server" in title and f":{port}" in title


def _log(d: Path) -> str:
    p = d / "redis.log"
    return " | ".join(p.read_text(errors="replace").strip().splitlines()[-3:]) if p.exists() else "(no log)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m deploy.redis_cluster", description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=["up", "down"])
    ap.add_argument("--state-dir", required=True, type=Path, help="where the nodes' data directories and pids live")
    ap.add_argument("--masters", type=int, default=3, help="number of masters (at least 3) [3]")
    ap.add_argument("--port", type=int, help="first node's port; the others follow it (default: a free block)")
    ap.add_argument("--bind", default=HOST, metavar="ADDR", help="address the nodes listen on and announce [127.0.0.1]")
    args = ap.parse_args(argv)
    try:
        if args.action == "up":
            t0 = time.monotonic()
            nodes = start(args.state_dir, args.masters, args.port, host=args.bind)
            print(nodes.url)
            print(f"{args.masters} masters up in {time.monotonic() - t0:.1f} s", file=sys.stderr)
        elif not stop(args.state_dir):
            print(f"no cluster recorded in {args.state_dir}", file=sys.stderr)
    except ClusterError as exc:
        print(f"deploy.redis_cluster: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, UserError) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
