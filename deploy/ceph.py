"""A real Ceph cluster (Debian's Pacific packages: ceph-mon, ceph-mgr, ceph-osd, radosgw) in a network namespace of
its own, for the S3 tier's tests and for a testbed that wants an object store: one monitor, one manager, three OSDs
and radosgw (S3), and an S3 user whose keys are written to the state directory. Root only (a namespace, a veth pair).

    python -m deploy.ceph up --state-dir D [--osds 3] [--store memstore|bluestore] [--cephfs [--mounts N]]
                             [--bridge BR --addr A.B.C.D/24]                          # prints the endpoint
    python -m deploy.ceph down --state-dir D

--cephfs: also an MDS and a file system (`kvfs`, pools cephfs_metadata and cephfs_data) mounted with ceph-fuse at
D/cephfs in this namespace (a kernel mount needs the ceph module, which a container may not load), for kvtier's
shared directory tier (`shared_dir`). Measured here (2 cores, 2026-12-07): `up` 13.1-13.8 s, 17.0-18.1 s with
--cephfs, 21.7 s with --store bluestore; `down` 1.0 s, 3.4 s with --cephfs. Resident memory with bluestore: the
manager 300 MB, each OSD 54 MB, the monitor 40 MB, radosgw 47 MB (memstore adds the objects held).

The namespace kvceph-<tag> (<tag>: the first 8 hex digits of the state directory's SHA-1) is joined to this namespace
by a veth pair: 10.253.X.1/24 here, 10.253.X.2 inside (X as deploy/nodes.py picks it, skipping a /24 already in
use). Every daemon binds only 10.253.X.2: the monitor (3300 and 6789), the OSDs, radosgw's HTTP endpoint
(`http://10.253.X.2:7480`, path-style buckets). With `--bridge BR --addr A.B.C.D/24` the namespace joins a bridge
instead (deploy/nodes.py's, for `run-stack.sh up --nodes N --shared s3|cephfs`) and its daemons bind that address,
which every namespace on the bridge reaches. After `up`, D holds:
- `s3.json`: endpoint, access_key, secret_key (mode 0600); `s3.env`: the same as AWS_ENDPOINT_URL,
  AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY lines, for `set -a; . D/s3.env` before boto3 or the AWS CLI;
  `aws-credentials`: the keys as an AWS shared credentials file (AWS_SHARED_CREDENTIALS_FILE=D/aws-credentials: a
  server's recorded command line then names the file, not the keys);
- `ceph/`: ceph.conf (give it to the tools: `ceph -c D/ceph/ceph.conf -s`), the daemons' data, logs and sockets.

Invariant: every thing made is appended to D/ceph.state (KEY=VALUE lines: ns, veth, dir, pid) the moment it exists,
so `down` stops exactly those daemons (a recorded pid is signalled only while it is still that daemon of this
cluster), deletes the namespace, the veth and the recorded directory and files, also after a failed or killed `up`;
a second `down` finds nothing to do.

Choices, with their sources (docs.ceph.com, Pacific):
- Authentication is off (`auth_*_required = none`, "CephX Config Reference"): the cluster is reachable only through
  the veth of this host; S3 requests are still signed with the user's keys (radosgw checks them itself).
- OSDs on `memstore` by default (objects held in each OSD's memory, `memstore_device_bytes` = 1 GiB each): created
  in well under a second, where bluestore on a file (`--store bluestore`: a sparse `block` file, `bluestore_block_size`
  = 4 GiB, `osd_memory_target` = 768 MiB) takes seconds per OSD. Both are Ceph's own object stores; memstore loses
  its objects when the OSD stops (down removes them anyway).
- All OSDs are on one host, so the CRUSH rule picks OSDs, not hosts (`osd_crush_chooseleaf_type = 0`); pools are
  replicated 3 times with `min_size` 1, 8 placement groups each, no autoscaler ("Pool, PG and CRUSH Config
  Reference"), so radosgw's seven pools stay far below `mon_max_pg_per_osd`.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from kvconnector.errors import UserError

from .nodes import free_net, record, recorded
from .processes import live_argv
from .stack import wait_for

STATE_FILE = "ceph.state"
RGW_PORT = 7480
MON_ID = "a"
MGR_ID = "x"
MDS_ID = "a"
CEPHFS_NAME = "kvfs"
RGW_NAME = "client.rgw.kvtier"
S3_USER = "kvtier"
BINARIES = ("ceph", "ceph-mon", "ceph-mgr", "ceph-osd", "radosgw", "radosgw-admin", "monmaptool", "ceph-authtool")
PACKAGES = "ceph-mon ceph-mgr ceph-osd radosgw ceph-common"
CEPHFS_BINARIES = ("ceph-mds", "ceph-fuse")
CEPHFS_PACKAGES = "ceph-mds ceph-fuse"


class CephError(RuntimeError):
    """The cluster did not start or did not answer (one line for the CLI; exit status 1)."""


class CephRefused(UserError, CephError):
    """What was asked cannot be done here: not root, Ceph not installed, a cluster of this state directory still up
    (one line, exit status 2)."""


def missing() -> str | None:
    """Why a cluster cannot be started here (for a test's skip), or None."""
    if os.geteuid() != 0:
        return "needs root (a network namespace and a veth pair)"
    absent = [b for b in BINARIES if shutil.which(b) is None]
    if absent:
        return f"Ceph is not installed ({', '.join(absent)} missing; apt-get install {PACKAGES})"
    return None


def _record(state: Path, key: str, value: str) -> None:
    record(state, key, value, STATE_FILE)


def _recorded(state: Path, key: str) -> list[str]:
    return recorded(state, key, STATE_FILE)


@dataclass
class CephCluster:
    state_dir: Path
    ns: str
    addr: str  # the namespace's address: every daemon binds it
    # pid -> the child started by this process (reaped once it ends; a cluster loaded from its record has none)
    children: dict = field(default_factory=dict)

    @property
    def dir(self) -> Path:
        return self.state_dir / "ceph"

    @property
    def conf(self) -> Path:
        return self.dir / "ceph.conf"

    @property
    def endpoint(self) -> str:
        return f"http://{self.addr}:{RGW_PORT}"

    def s3(self) -> dict:
        """endpoint, access_key, secret_key of the S3 user `up` made."""
        return json.loads((self.state_dir / "s3.json").read_text())

    @classmethod
    def load(cls, state_dir: Path) -> CephCluster | None:
        state_dir = Path(state_dir)
        ns, addr = _recorded(state_dir, "ns"), _recorded(state_dir, "addr")
        return cls(state_dir, ns[-1], addr[-1]) if ns and addr else None

    # ---- daemons ---------------------------------------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str], in_ns: bool = True) -> int:
        """Start a daemon in the foreground (-f) inside the namespace (`in_ns`; `ip netns exec` execs it, so the pid
        is the daemon's) or here. Recorded as pid=<name>:<pid> before anything else happens."""
        where = ["ip", "netns", "exec", self.ns] if in_ns else []
        with open(self.dir / "log" / f"{name}.out", "ab") as log:  # the child keeps its own descriptor
            p = subprocess.Popen(
                [*where, *argv, "-f", "-c", str(self.conf)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        _record(self.state_dir, "pid", f"{name}:{p.pid}")
        self.children[p.pid] = p
        return p.pid

    def _alive(self, pid: int) -> bool:
        child = self.children.get(pid)
        if child is not None and child.poll() is not None:  # reaped: a zombie of ours would look alive to kill()
            del self.children[pid]
        return _is_daemon(pid, self.conf)

    def pids(self) -> dict[str, int]:
        """name -> pid of the daemons recorded (the latest of each name)."""
        out = {}
        for v in _recorded(self.state_dir, "pid"):
            name, _, pid = v.rpartition(":")
            out[name] = int(pid)
        return out

    def is_running(self, name: str) -> bool:
        pid = self.pids().get(name)
        return pid is not None and self._alive(pid)

    def signal(self, name: str, sig: int) -> bool:
        """Send sig to the daemon `name` (mon.a, mgr.x, osd.N, rgw) if it is still that daemon; whether it was."""
        pid = self.pids().get(name)
        if pid is None or not self._alive(pid):
            return False
        os.kill(pid, sig)
        return True

    def stop_daemon(self, name: str, timeout_s: float = 10) -> None:
        pid = self.pids().get(name)
        if pid is None or not self._alive(pid):
            return
        os.kill(pid, signal.SIGCONT)  # a stopped one cannot act on SIGTERM
        os.kill(pid, signal.SIGTERM)
        if not wait_for(lambda: not self._alive(pid), timeout_s, 0.05):
            os.kill(pid, signal.SIGKILL)
            wait_for(lambda: not self._alive(pid), timeout_s, 0.05)

    def stop_all(self, timeout_s: float = 10) -> None:
        """Every recorded daemon, in waves: ceph-fuse (the MDS waits for its client's session otherwise), radosgw
        and the MDS, the OSDs, then the manager and the monitor (a daemon whose monitor is gone waits for it on the
        way out). Each wave gets SIGTERM at once (an OSD takes about a second to end), then SIGKILL for any still
        there after timeout_s."""
        pids = self.pids()
        waves = [
            [n for n in pids if n.startswith("fuse")],
            [n for n in pids if n == "rgw" or n.startswith("mds.")],
            [n for n in pids if n.startswith("osd.")],
        ]
        waves.append([n for n in pids if not any(n in w for w in waves)])
        for i, wave in enumerate(waves):
            # The MDS, its client gone, spends about 10 s ending here (measured): nothing of it is kept, so it gets
            # a short grace before SIGKILL.
            self._stop([pids[n] for n in wave], min(timeout_s, 3.0) if i == 1 else timeout_s)

    def _stop(self, pids: list[int], timeout_s: float) -> None:
        live = [pid for pid in pids if self._alive(pid)]
        for pid in live:
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGTERM)
        if not wait_for(lambda: not any(self._alive(p) for p in live), timeout_s, 0.05):
            for pid in live:
                if self._alive(pid):
                    os.kill(pid, signal.SIGKILL)
            wait_for(lambda: not any(self._alive(p) for p in live), timeout_s, 0.05)

    def ceph(self, *args: str, timeout_s: float = 30) -> str:
        """The `ceph` CLI against this cluster; CephError when it fails."""
        p = subprocess.run(
            ["ceph", "-c", str(self.conf), "--connect-timeout", str(int(timeout_s)), *args],
            capture_output=True,
            text=True,
            timeout=timeout_s + 10,
        )
        if p.returncode != 0:
            raise CephError(f"ceph {' '.join(args)}: {_tail(p.stderr or p.stdout)}")
        return p.stdout

    def start_rgw(self, timeout_s: float = 60) -> None:
        """Start (or restart) radosgw and wait until its HTTP endpoint answers."""
        (self.dir / "rgw").mkdir(exist_ok=True)
        self._spawn("rgw", ["radosgw", "-n", RGW_NAME])
        if not wait_for(lambda: self.is_running("rgw") and _answers(self.addr, RGW_PORT), timeout_s, 0.1):
            raise CephError(f"radosgw did not answer on {self.endpoint} in {timeout_s:g} s: {self._log('rgw')}")

    @property
    def cephfs_mount(self) -> Path:
        return self.cephfs_mounts[0] if self.cephfs_mounts else self.state_dir / "cephfs"

    @property
    def cephfs_mounts(self) -> list[Path]:
        """Every CephFS client's mount point, in the order they were made (state_dir/cephfs, cephfs1, ...)."""
        return [Path(m) for m in _recorded(self.state_dir, "mount")]

    def start_cephfs(self, timeout_s: float = 120, mounts: int = 1) -> None:
        """An MDS, a file system (CEPHFS_NAME, two pools) and `mounts` ceph-fuse clients of it at state_dir/cephfs,
        cephfs1, ..., in this namespace (a mount made inside the cluster's namespace would be seen only there)."""
        (self.dir / f"mds-{MDS_ID}").mkdir(exist_ok=True)
        self._spawn(f"mds.{MDS_ID}", ["ceph-mds", "-i", MDS_ID])
        for pool in ("cephfs_metadata", "cephfs_data"):
            self.ceph("osd", "pool", "create", pool)
        self.ceph("fs", "new", CEPHFS_NAME, "cephfs_metadata", "cephfs_data")

        def active() -> bool:
            try:
                return "up:active" in self.ceph("mds", "stat", timeout_s=10)
            except CephError:
                return False

        if not wait_for(active, timeout_s, 0.2):
            raise CephError(f"no MDS active in {timeout_s:g} s: {self._log(f'mds.{MDS_ID}')}")
        for i in range(mounts):
            self.mount_cephfs(self.state_dir / ("cephfs" if i == 0 else f"cephfs{i}"), timeout_s)

    def mount_cephfs(self, mnt: Path, timeout_s: float = 120) -> None:
        """One more ceph-fuse client of the file system, mounted at `mnt` (made here, recorded)."""
        name = "fuse" if not self.cephfs_mounts else f"fuse{len(self.cephfs_mounts)}"
        mnt.mkdir()
        _record(self.state_dir, "mount", str(mnt))
        # The configuration file says everything (--no-mon-config: no separate session for the monitor's config
        # database, which holds nothing here). ceph-fuse prints little until it has mounted, so its own log, at
        # levels that name each step (monitor session, MDS session, FUSE), is what says where a mount that never
        # came stopped; client_mount_timeout makes it give up and say so before we stop waiting.
        argv = ["ceph-fuse", "--id", "fuse", "--no-mon-config", f"--client_mount_timeout={max(10, timeout_s - 10):g}"]
        argv += ["--debug_monc=10", "--debug_client=10", "--debug_ms=1", str(mnt)]
        child = self.children[self._spawn(name, argv, in_ns=False)]
        wait_for(lambda: os.path.ismount(mnt) or child.poll() is not None, timeout_s, 0.1)
        if not os.path.ismount(mnt):
            state = "still running" if child.poll() is None else f"exit status {child.returncode}"
            raise CephError(
                f"ceph-fuse did not mount {mnt} in {timeout_s:g} s ({state}): {self._log(name)}; "
                f"its log ({self.dir / 'log' / 'client.fuse.log'}): {self._log('client.fuse', '.log', 8)}"
            )

    def _log(self, name: str, suffix: str = ".out", n: int = 3) -> str:
        p = self.dir / "log" / f"{name}{suffix}"
        lines = p.read_text(errors="replace").strip().splitlines() if p.exists() else []
        return " | ".join(lines[-n:]) or "(nothing in its log)"


def up(
    state_dir: Path,
    osds: int = 3,
    store: str = "memstore",
    cephfs: bool = False,
    timeout_s: float = 180,
    bridge: str | None = None,
    addr: str | None = None,
    mounts: int = 1,
) -> CephCluster:
    """Start the cluster (see the module's docstring); on failure whatever was made is removed and CephError raised.
    `bridge` and `addr` (A.B.C.D/24): the namespace joins that bridge at that address instead of its own veth pair
    to this namespace (a testbed's nodes on the bridge reach it). `mounts`: CephFS clients (ceph-fuse) mounted at
    D/cephfs, D/cephfs1, ... (one per node of a testbed)."""
    why = missing()
    if why:
        raise CephRefused(why)
    if cephfs and any(shutil.which(b) is None for b in CEPHFS_BINARIES):
        raise CephRefused(f"--cephfs: ceph-mds and ceph-fuse are not installed (apt-get install {CEPHFS_PACKAGES})")
    if not 1 <= osds <= 8:
        raise CephRefused(f"--osds {osds}: 1 to 8")
    if (bridge is None) != (addr is None) or (addr is not None and not re.fullmatch(r"(\d{1,3}\.){3}\d{1,3}/24", addr)):
        raise CephRefused(f"--bridge and --addr A.B.C.D/24 go together (got {bridge!r}, {addr!r})")
    if not 1 <= mounts <= 16:
        raise CephRefused(f"--mounts {mounts}: 1 to 16")
    state_dir = Path(state_dir).resolve()
    if (state_dir / STATE_FILE).exists():
        raise CephRefused(f"a cluster of {state_dir} is recorded ({STATE_FILE}): run down first")
    state_dir.mkdir(parents=True, exist_ok=True)
    try:
        cluster = _up(state_dir, osds, store, timeout_s, bridge, addr)
        if cephfs:
            cluster.start_cephfs(mounts=mounts)
    except BaseException:
        down(state_dir)
        raise
    return cluster


def _up(
    state: Path, osds: int, store: str, timeout_s: float, bridge: str | None = None, addr: str | None = None
) -> CephCluster:
    deadline = time.monotonic() + timeout_s
    tag = hashlib.sha1(str(state).encode()).hexdigest()[:8]
    ns, vh, vn = f"kvceph-{tag}", f"kvc{tag}h", f"kvc{tag}n"
    if addr is None:  # a veth pair of its own: X.1 here, X.2 inside
        net = free_net(state)
        ip = f"{net}.2"
    else:
        ip, net = addr.split("/")[0], addr.rsplit(".", 1)[0]
    _ip("netns", "add", ns)
    _record(state, "ns", ns)
    _ip("link", "add", vh, "type", "veth", "peer", "name", vn)
    _record(state, "veth", vh)
    _ip("link", "set", vn, "netns", ns)
    if bridge is None:
        _ip("addr", "add", f"{net}.1/24", "dev", vh)
    else:
        _ip("link", "set", vh, "master", bridge)
    _ip("link", "set", vh, "up")
    for cmd in (["addr", "add", f"{ip}/24", "dev", vn], ["link", "set", vn, "up"], ["link", "set", "lo", "up"]):
        _ip("netns", "exec", ns, "ip", *cmd)
    _record(state, "addr", ip)
    c = CephCluster(state, ns, ip)
    if c.dir.exists():
        raise CephRefused(f"{c.dir} exists and is not recorded as this cluster's: remove it or pick another state dir")
    c.dir.mkdir(mode=0o700)
    _record(state, "dir", str(c.dir))
    for sub in ("log", "run", "crash"):
        (c.dir / sub).mkdir()
    fsid = str(uuid.uuid4())
    c.conf.write_text(_conf(c, fsid, f"{net}.0/24", store))

    # monitor: a map naming it, its store made from that map, then the daemon
    _run(["ceph-authtool", "--create-keyring", str(c.dir / "mon.keyring"), "--gen-key", "-n", "mon.", "--cap", "mon",
          "allow *"])  # fmt: skip
    monmap = str(c.dir / "monmap")
    _run(["monmaptool", "--create", "--fsid", fsid, "--addv", MON_ID, f"[v2:{c.addr}:3300,v1:{c.addr}:6789]", monmap])
    _run(["ceph-mon", "-c", str(c.conf), "--mkfs", "-i", MON_ID, "--monmap", monmap, "--keyring",
          str(c.dir / "mon.keyring")])  # fmt: skip
    c._spawn(f"mon.{MON_ID}", ["ceph-mon", "-i", MON_ID])
    c.ceph("status", timeout_s=_left(deadline))
    (c.dir / f"mgr-{MGR_ID}").mkdir()
    c._spawn(f"mgr.{MGR_ID}", ["ceph-mgr", "-i", MGR_ID])

    for _ in range(osds):
        osd_uuid = str(uuid.uuid4())
        osd_id = c.ceph("osd", "new", osd_uuid).strip()
        (c.dir / f"osd-{osd_id}").mkdir()
        _run(["ceph-osd", "-c", str(c.conf), "-i", osd_id, "--mkfs", "--osd-uuid", osd_uuid], timeout_s=_left(deadline))
        c._spawn(f"osd.{osd_id}", ["ceph-osd", "-i", osd_id])

    def osds_up() -> bool:
        try:
            stat = json.loads(c.ceph("osd", "stat", "--format", "json", timeout_s=10))
        except (CephError, ValueError):
            return False
        return stat.get("num_up_osds", 0) == osds

    if not wait_for(osds_up, _left(deadline), 0.2):
        raise CephError(f"{osds} OSDs not up in {timeout_s:g} s: {c._log('osd.0')}")
    c.start_rgw(_left(deadline))

    p = _run(["radosgw-admin", "-c", str(c.conf), "user", "create", f"--uid={S3_USER}", f"--display-name={S3_USER}"],
             timeout_s=_left(deadline))  # fmt: skip
    key = json.loads(p)["keys"][0]
    s3 = {"endpoint": c.endpoint, "access_key": key["access_key"], "secret_key": key["secret_key"]}
    _private_write(state / "s3.json", json.dumps(s3, indent=1) + "\n")
    _record(state, "file", str(state / "s3.json"))
    env = (
        f"AWS_ENDPOINT_URL={s3['endpoint']}\nAWS_ACCESS_KEY_ID={s3['access_key']}\n"
        f"AWS_SECRET_ACCESS_KEY={s3['secret_key']}\n"
    )
    _private_write(state / "s3.env", env)
    _record(state, "file", str(state / "s3.env"))
    # for a server whose command line is recorded: AWS_SHARED_CREDENTIALS_FILE names the keys without showing them
    creds = f"[default]\naws_access_key_id = {s3['access_key']}\naws_secret_access_key = {s3['secret_key']}\n"
    _private_write(state / "aws-credentials", creds)
    _record(state, "file", str(state / "aws-credentials"))
    return c


def down(state_dir: Path) -> bool:
    """Remove what `up` recorded in state_dir: daemons, namespace, veth, directory, files. False when nothing was."""
    state = Path(state_dir).resolve()
    if not (state / STATE_FILE).exists():
        return False
    for mnt in _recorded(state, "mount"):  # before ceph-fuse and the MDS stop, or the mount hangs
        if os.path.ismount(mnt):
            subprocess.run(["umount", "-l", mnt], stderr=subprocess.DEVNULL)
        with contextlib.suppress(OSError):
            os.rmdir(mnt)
    c = CephCluster.load(state)
    if c is not None:
        c.stop_all()
    for ns in _recorded(state, "ns"):
        # anything else still in our namespace is ours too (a daemon's child)
        p = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
        for pid in p.stdout.split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL)
    for link in _recorded(state, "veth"):  # gone with its peer's namespace already, normally
        subprocess.run(["ip", "link", "del", link], stderr=subprocess.DEVNULL)
    for d in _recorded(state, "dir"):
        shutil.rmtree(d, ignore_errors=True)
    for f in _recorded(state, "file"):
        Path(f).unlink(missing_ok=True)
    (state / STATE_FILE).unlink(missing_ok=True)
    return True


def _conf(c: CephCluster, fsid: str, network: str, store: str) -> str:
    d = c.dir
    lines = [
        "[global]",
        f"fsid = {fsid}",
        f"mon_host = [v2:{c.addr}:3300,v1:{c.addr}:6789]",
        f"public_network = {network}",
        f"public_addr = {c.addr}",
        "auth_cluster_required = none",
        "auth_service_required = none",
        "auth_client_required = none",
        # radosgw and radosgw-admin ask for a secure (encrypted) monitor connection by default, which needs cephx
        "ms_mon_client_mode = crc secure",
        f"run_dir = {d}/run",
        f"admin_socket = {d}/run/$name.$pid.asok",  # one per process: CLI calls may overlap
        f"log_file = {d}/log/$name.log",
        f"mon_cluster_log_file = {d}/log/cluster.log",
        f"crash_dir = {d}/crash",
        f"keyring = {d}/$name.keyring",
        f"mon_data = {d}/mon-$id",
        f"mgr_data = {d}/mgr-$id",
        f"osd_data = {d}/osd-$id",
        "mon_allow_pool_delete = true",
        "mon_allow_pool_size_one = true",
        "mon_warn_on_pool_no_redundancy = false",
        "mon_max_pg_per_osd = 1000",
        "osd_pool_default_size = 3",
        "osd_pool_default_min_size = 1",
        "osd_pool_default_pg_num = 8",
        "osd_pool_default_pgp_num = 8",
        "osd_pool_default_pg_autoscale_mode = off",
        "osd_crush_chooseleaf_type = 0",
        f"osd_objectstore = {store}",
        "memstore_device_bytes = 1073741824",
        "bluestore_block_create = true",
        "bluestore_block_size = 4294967296",
        "osd_memory_target = 805306368",
        # few threads: a test machine of two cores runs three OSDs beside other work
        "osd_op_num_shards = 1",
        "osd_op_num_threads_per_shard = 2",
        "",
        f"[{RGW_NAME}]",
        f"rgw_frontends = beast endpoint={c.addr}:{RGW_PORT}",
        f"rgw_data = {d}/rgw",
        "rgw_thread_pool_size = 64",
        "",
    ]
    return "\n".join(lines)


def _ip(*args: str) -> None:
    p = subprocess.run(["ip", *args], capture_output=True, text=True)
    if p.returncode != 0:
        raise CephError(f"ip {' '.join(args)}: {_tail(p.stderr)}")


def _run(argv: list[str], timeout_s: float = 60) -> str:
    p = subprocess.run(argv, capture_output=True, text=True, timeout=max(1.0, timeout_s))
    if p.returncode != 0:
        raise CephError(f"{argv[0]} {' '.join(argv[1:3])}: {_tail(p.stderr or p.stdout)}")
    return p.stdout


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise CephError("the cluster did not come up in time")
    return left


def _tail(text: str) -> str:
    return " | ".join(text.strip().splitlines()[-3:])[-400:] or "(no output)"


def _private_write(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


def _answers(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), 0.5).close()
        return True
    except OSError:
        return False


def _is_daemon(pid: int, conf: Path) -> bool:
    """Whether pid is alive (not a zombie) and a Ceph daemon started with this cluster's ceph.conf: a recorded pid
    the system gave to another process since is never signalled."""
    return str(conf) in (live_argv(pid) or [])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m deploy.ceph", description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=["up", "down"])
    ap.add_argument("--state-dir", required=True, type=Path, help="where the cluster's files and its record live")
    ap.add_argument("--osds", type=int, default=3, help="number of OSDs [3]")
    ap.add_argument("--store", choices=["memstore", "bluestore"], default="memstore", help="OSD object store")
    ap.add_argument("--cephfs", action="store_true", help="also an MDS and CephFS, mounted (ceph-fuse) at D/cephfs")
    ap.add_argument("--mounts", type=int, default=1, help="with --cephfs: ceph-fuse clients, at D/cephfs, cephfs1, ...")
    ap.add_argument("--bridge", help="join this bridge (a testbed's nodes') instead of a veth pair to this namespace")
    ap.add_argument("--addr", help="with --bridge: the cluster's address on it, A.B.C.D/24")
    args = ap.parse_args(argv)
    try:
        if args.action == "up":
            t0 = time.monotonic()
            c = up(args.state_dir, args.osds, args.store, args.cephfs, bridge=args.bridge, addr=args.addr,
                   mounts=args.mounts)  # fmt: skip
            print(c.endpoint)
            print(
                f"ceph up in {time.monotonic() - t0:.1f} s: {args.osds} OSDs ({args.store}), S3 keys in "
                f"{c.state_dir / 's3.json'} and s3.env"
                + (f"; CephFS at {', '.join(map(str, c.cephfs_mounts))}" if args.cephfs else ""),
                file=sys.stderr,
            )
        elif not down(args.state_dir):
            print(f"no cluster recorded in {args.state_dir}", file=sys.stderr)
    except CephError as exc:
        print(f"deploy.ceph: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, UserError) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
