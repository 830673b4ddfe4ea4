"""Nodes of a stack (`run-stack.sh up --nodes N`, root): network namespaces on a bridge, and their shared tier.

Node i is the namespace kvn-<tag>-<i> (<tag>: the first 8 hex digits of the state directory's SHA-1) joined to the
bridge kvn<tag>b in the root namespace by a veth pair; the bridge is 10.253.X.1/24 and node i 10.253.X.(10+i), X from
the state directory's POSIX cksum, skipping a /24 that an address or route here already uses.

Invariant: everything made is appended to STATE/nodes.state (one KEY=VALUE line: bridge, host_addr, ns, veth, addrI,
shared, and python: the interpreter the Redis Cluster's helper ran on) the moment it exists, so `remove` undoes
exactly that, also after a failed `up` or a killed one, and a second `remove` finds nothing to do.

Standard library only (see deploy/processes.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TextIO

from . import SCRIPTS

STATE_FILE = "nodes.state"


class NoFreeNet(RuntimeError):
    pass


def record(state: Path, key: str, value: str, file: str = STATE_FILE) -> None:
    """Note a thing made (a key=value line in state/file) the moment it exists: `down` removes what is noted."""
    with open(state / file, "a") as fh:
        fh.write(f"{key}={value}\n")


def recorded(state: Path, key: str, file: str = STATE_FILE) -> list[str]:
    p = state / file
    if not p.exists():
        return []
    return [v for k, _, v in (line.partition("=") for line in p.read_text().splitlines()) if k == key]


def cksum(data: bytes) -> int:
    """POSIX cksum(1)'s CRC (kept so a state directory gets the subnet it got when this was shell)."""
    crc = 0

    def feed(byte: int) -> None:
        nonlocal crc
        crc ^= byte << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7 if crc & 0x80000000 else crc << 1) & 0xFFFFFFFF

    for b in data:
        feed(b)
    n = len(data)
    while n:
        feed(n & 0xFF)
        n >>= 8
    return ~crc & 0xFFFFFFFF


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True)


def free_net(state: Path) -> str:
    """A 10.253.X (a /24) that no address or route here falls in."""
    h = cksum(str(state).encode())
    used = "".join(
        subprocess.run(cmd, capture_output=True, text=True).stdout
        for cmd in (["ip", "-4", "-o", "addr", "show"], ["ip", "-4", "route", "show", "table", "all"])
    )
    for i in range(254):
        x = (h + i * 7) % 254 + 1
        if not re.search(rf"(^|[^0-9])10\.253\.{x}\.|10\.253\.0\.0/16|10\.0\.0\.0/8", used, re.M):
            return f"10.253.{x}"
    raise NoFreeNet("no free 10.253.x.0/24 found")


def up(state: Path, n: int) -> None:
    """The bridge and n namespaces, each recorded the moment it exists."""
    tag = hashlib.sha1(str(state).encode()).hexdigest()[:8]
    net = free_net(state)
    br = f"kvn{tag}b"
    _ip("link", "add", br, "type", "bridge")
    record(state, "bridge", br)
    _ip("addr", "add", f"{net}.1/24", "dev", br)
    _ip("link", "set", br, "up")
    record(state, "host_addr", f"{net}.1")
    for i in range(n):
        ns, vh, vn = f"kvn-{tag}-{i}", f"kvn{tag}{i}h", f"kvn{tag}{i}n"
        _ip("netns", "add", ns)
        record(state, "ns", ns)
        _ip("link", "add", vh, "type", "veth", "peer", "name", vn)
        record(state, "veth", vh)
        _ip("link", "set", vn, "netns", ns)
        _ip("link", "set", vh, "master", br)
        _ip("link", "set", vh, "up")
        _ip("netns", "exec", ns, "ip", "addr", "add", f"{net}.{10 + i}/24", "dev", vn)
        _ip("netns", "exec", ns, "ip", "link", "set", vn, "up")
        # LMCache's ZMQ socket and vLLM's own helpers use the node's loopback
        _ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
        # a default route (the root namespace forwards nothing): vLLM asks the kernel for its outgoing address
        _ip("netns", "exec", ns, "ip", "route", "add", "default", "via", f"{net}.1")
        record(state, f"addr{i}", f"{net}.{10 + i}")


def gluster_up(state: Path, n: int, bw: str) -> None:
    record(state, "shared", "glusterfs")
    cmd = ["bash", str(SCRIPTS / "glusterfs.sh"), "up", "--state-dir", str(state / "gluster"), "--mounts", str(n)]
    subprocess.run(cmd + (["--bw", bw] if bw else []), check=True)
    (state / "gluster" / "mnt" / "kv").mkdir(parents=True, exist_ok=True)


def gluster_mount(state: Path, i: int) -> Path:
    """Node i's own FUSE client's mount of the volume."""
    return state / "gluster" / ("mnt" if i == 0 else f"mnt{i + 1}")


def redis_up(state: Path, python: str, env: dict[str, str]) -> str:
    """A Redis Cluster bound to the bridge's address (every node reaches it); its redis_url."""
    record(state, "python", python)  # `down` stops it with the interpreter that has its modules, whatever its --python
    record(state, "shared", "redis-cluster")
    cmd = [python, "-m", "deploy.redis_cluster", "up", "--state-dir", str(state / "redis")]
    with open(state / "redis.log", "a") as log:
        out = subprocess.run(cmd + ["--bind", recorded(state, "host_addr")[0]], stdout=subprocess.PIPE, stderr=log,
                             text=True, env=env, check=True).stdout  # fmt: skip
    return out.rstrip("\n")


# The shared tiers that are services of this package: their module (python -m M down --state-dir STATE/SUB) and SUB.
SERVICES = {
    "redis-cluster": ("deploy.redis_cluster", "redis"),
    "s3": ("deploy.ceph", "ceph"),
    "cephfs": ("deploy.ceph", "ceph"),
    "mooncake": ("deploy.mooncake_store", "mooncake"),
}
CEPH_HOST = 250  # the Ceph cluster's address on the nodes' bridge: NET.250 (nodes are NET.10 and up)
S3_BUCKET = "kvtier"  # --shared s3: the nodes' bucket, made before they start (two making it at once may collide)


def ceph_up(state: Path, python: str, env: dict[str, str], kind: str, n: int) -> dict:
    """A Ceph cluster on the nodes' bridge (deploy/ceph.py): radosgw for `s3`, or CephFS mounted once per node for
    `cephfs`. Its s3.json (endpoint and keys); the keys also in STATE/ceph/aws-credentials."""
    record(state, "python", python)
    record(state, "shared", kind)
    br, net = recorded(state, "bridge")[0], recorded(state, "host_addr")[0].rsplit(".", 1)[0]
    cmd = [python, "-m", "deploy.ceph", "up", "--state-dir", str(state / "ceph"), "--bridge", br]
    cmd += ["--addr", f"{net}.{CEPH_HOST}/24"] + (["--cephfs", "--mounts", str(n)] if kind == "cephfs" else [])
    with open(state / "ceph.log", "a") as log:
        subprocess.run(cmd, stdout=log, stderr=log, env=env, check=True)
    s3 = json.loads((state / "ceph" / "s3.json").read_text())
    if kind == "s3":
        from kvconnector.s3_tier import S3Tier  # kvtier's own S3 client makes the bucket when it is missing

        keys = {"endpoint": s3["endpoint"], "access_key": s3["access_key"], "secret_key": s3["secret_key"]}
        S3Tier(S3_BUCKET, 1, create_bucket=True, **keys).close()
    return s3


def mooncake_up(state: Path, python: str, env: dict[str, str]) -> tuple[str, str]:
    """A Mooncake Store (master and metadata server) bound to the bridge's address; kvtier's mooncake_master and
    mooncake_metadata_url. The objects live in the segments the nodes' kvtier instances lend."""
    record(state, "python", python)
    record(state, "shared", "mooncake")
    cmd = [python, "-m", "deploy.mooncake_store", "up", "--state-dir", str(state / "mooncake")]
    with open(state / "mooncake.log", "a") as log:
        out = subprocess.run(cmd + ["--bind", recorded(state, "host_addr")[0]], stdout=subprocess.PIPE, stderr=log,
                             text=True, env=env, check=True).stdout  # fmt: skip
    master, url = out.split()
    return master, url


def ceph_mount(state: Path, i: int) -> Path:
    """Node i's own ceph-fuse client's mount of CephFS."""
    return state / "ceph" / ("cephfs" if i == 0 else f"cephfs{i}")


def _netns_pids(ns: str) -> list[int] | None:
    p = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
    return [int(x) for x in p.stdout.split()] if p.returncode == 0 else None


def _kill(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def remove(state: Path, python: str, env: dict[str, str], out: TextIO = sys.stdout) -> None:
    """Processes left in our namespaces, the shared tier, the namespaces, the bridge: what nodes.state names."""
    if not (state / STATE_FILE).exists():
        return
    for ns in recorded(state, "ns"):
        pids = _netns_pids(ns)
        if pids is None:
            continue
        _kill(pids, signal.SIGTERM)  # every process in it is ours
        for _ in range(50):
            if not _netns_pids(ns):
                break
            time.sleep(0.2)
        _kill(_netns_pids(ns) or [], signal.SIGKILL)
    out.flush()
    for kind in recorded(state, "shared"):
        if kind == "glusterfs":
            cmd = ["bash", str(SCRIPTS / "glusterfs.sh"), "down", "--state-dir", str(state / "gluster")]
            subprocess.run(cmd, stdout=subprocess.DEVNULL)
        elif kind in SERVICES:
            py = (recorded(state, "python") or [python])[-1]
            module, sub = SERVICES[kind]
            cmd = [py, "-m", module, "down", "--state-dir", str(state / sub)]
            subprocess.run(cmd, stdout=out, env=env)
    for ns in recorded(state, "ns"):
        subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL)
    for link in recorded(state, "veth") + recorded(state, "bridge"):  # a veth is gone with its peer's namespace
        subprocess.run(["ip", "link", "del", link], stderr=subprocess.DEVNULL)
    (state / STATE_FILE).unlink(missing_ok=True)
    print("nodes removed", file=out, flush=True)
