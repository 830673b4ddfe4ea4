"""Slurm over the nodes of a stack (`run-stack.sh up --nodes N --slurm`, or `python -m deploy.slurm up` for the nodes
and Slurm alone; root): munged in the root namespace, slurmctld on node 0 and slurmd on every node, each in its
node's network namespace under its own host name (a UTS namespace: Slurm finds its node by host name), so a job's
tasks run inside the nodes, at their addresses, as on separate hosts.

Everything lives in STATE/slurm: cluster.json (the nodes: name, address, namespace), slurm.conf (what sbatch, srun,
sinfo and scancel read: export SLURM_CONF=STATE/slurm/slurm.conf), mpi.conf, the munge key and socket, logs, spool
and controller state. The daemons run in the foreground as servers of the stack (deploy/processes.py), so `down`
stops them with the rest, and removing the nodes kills whatever a job left running inside them.

What Slurm needs here that a cluster of real hosts gives by itself (Slurm 22.05, Debian 12's packages):
- a host name per node: `unshare --uts` with `hostname nodeI` before the daemon starts;
- the host's cgroup mounts: the daemons enter only the node's network namespace (nsenter --net), not the fresh
  mount namespace `ip netns exec` makes, which has no /sys/fs/cgroup (slurmd refuses to start without it);
- a private directory per node for PMIx (srun --mpi=pmix, the MpiDefault here): Slurm's PMIx plugin makes
  <PMIxCliTmpDirBase>/spmix_appdir_<uid>_<job>.<step>, the same name on every node, so the nodes' shared /tmp
  collides; each slurmd gets its own mount namespace where STATE/slurm/pmix is a bind of STATE/slurm/pmix-nodeI
  (propagation slave: mounts the host makes later, a shared tier's, still reach the node).

Standard library only (see deploy/processes.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from . import SCRIPTS, nodes, processes

DIR = "slurm"
NEEDS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "sinfo")
PACKAGES = "apt-get install munge slurmctld slurmd slurm-client"
PARTITION = "kv"


class SlurmError(RuntimeError):
    """Slurm did not come up: which daemon, and the end of its log."""


def missing() -> str | None:
    """Why Slurm cannot start here, or None."""
    absent = [exe for exe in NEEDS if shutil.which(exe) is None]
    return f"{', '.join(absent)} not installed ({PACKAGES})" if absent else None


def node_name(i: int) -> str:
    return f"node{i}"


def conf_path(state: Path) -> Path:
    return state / DIR / "slurm.conf"


def env(state: Path) -> dict[str, str]:
    """The environment sbatch, srun and sinfo need to find this cluster."""
    return {**os.environ, "SLURM_CONF": str(conf_path(state))}


# a task's index, host name and addresses: where Slurm ran it
WHERE = ("sh", "-c", 'echo "$SLURM_PROCID $(hostname) $(ip -4 -o addr show scope global)"')


def srun(state: Path, *argv: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    """`srun ARGV` on this cluster from the host, its output captured."""
    return subprocess.run(["srun", *argv], env=env(state), capture_output=True, text=True, timeout=timeout_s)


def write_conf(d: Path, addrs: list[str]) -> None:
    cpus = os.cpu_count() or 1
    lines = [
        "ClusterName=kvtier",
        f"SlurmctldHost={node_name(0)}({addrs[0]})",
        "SlurmUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={d / 'munge' / 'munge.socket'}",
        f"StateSaveLocation={d / 'ctld'}",
        f"SlurmdSpoolDir={d / 'spool' / '%n'}",
        f"SlurmctldPidFile={d / 'slurmctld.pid'}",
        f"SlurmdPidFile={d / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={d / 'slurmctld.log'}",
        f"SlurmdLogFile={d / 'slurmd-%n.log'}",
        # no cgroup hierarchy of our own: the node's processes are tracked by their parentage
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "MpiDefault=pmix",
        "MailProg=/bin/true",
        "ReturnToService=2",
        "SelectType=select/linear",
        *(
            f"NodeName={node_name(i)} NodeAddr={a} NodeHostname={node_name(i)} CPUs={cpus} State=UNKNOWN"
            for i, a in enumerate(addrs)
        ),
        f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
    ]
    (d / "slurm.conf").write_text("\n".join(lines) + "\n")
    (d / "mpi.conf").write_text(f"PMIxCliTmpDirBase={d / 'pmix'}\n")


def in_node(ns: str, name: str, argv: list[str], bind: tuple[Path, Path] | None = None) -> list[str]:
    """argv in network namespace ns under host name `name` (and, with bind, its own mount namespace where bind[1]
    shows bind[0])."""
    script = f'hostname {name} && {f"mount --bind {bind[0]} {bind[1]} && " if bind else ""}exec "$@"'
    unshare = ["unshare", "--uts", *(["--mount", "--propagation", "slave"] if bind else [])]
    return ["nsenter", f"--net=/run/netns/{ns}", *unshare, "sh", "-c", script, "sh", *argv]


def start(state: Path, namespaces: list[str], addrs: list[str], deadline: float) -> dict:
    """munged, slurmctld and one slurmd per node, as servers of the stack in `state`; waits until every node is idle.
    What endpoints.json records."""
    d = state / DIR
    for sub in ("munge", "ctld", "pmix", *(f"spool/{node_name(i)}" for i in range(len(addrs)))):
        (d / sub).mkdir(parents=True, exist_ok=True)
    (d / "munge").chmod(0o700)
    key = d / "munge" / "munge.key"
    key.unlink(missing_ok=True)
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    write_conf(d, addrs)
    m = d / "munge"
    munged = ["munged", "--foreground", "--force", f"--key-file={key}", f"--socket={m / 'munge.socket'}"]
    munged += [f"--pid-file={m / 'munged.pid'}", f"--seed-file={m / 'munged.seed'}", f"--log-file={d / 'munged.log'}"]
    processes.start(state, "munged", munged)
    _wait(lambda: (m / "munge.socket").exists(), deadline, state, "munged")
    cenv = ["env", f"SLURM_CONF={d / 'slurm.conf'}"]
    processes.start(state, "slurmctld", in_node(namespaces[0], node_name(0), [*cenv, "slurmctld", "-D", "-i"]))
    for i, ns in enumerate(namespaces):
        (d / f"pmix-{node_name(i)}").mkdir(exist_ok=True)
        bind = (d / f"pmix-{node_name(i)}", d / "pmix")
        processes.start(state, f"slurmd{i}", in_node(ns, node_name(i), [*cenv, "slurmd", "-D"], bind))
    daemons = ["slurmctld", *(f"slurmd{i}" for i in range(len(addrs)))]
    _wait(lambda: idle_nodes(state) == len(addrs), deadline, state, *daemons)
    info = {
        "conf": str(d / "slurm.conf"),
        "partition": PARTITION,
        "nodes": [
            {"name": node_name(i), "address": a, "netns": ns} for i, (a, ns) in enumerate(zip(addrs, namespaces))
        ],
    }
    (d / "cluster.json").write_text(json.dumps(info, indent=1) + "\n")
    return info


def remove(state: Path) -> None:
    """What the daemons kept once they are stopped: the munge key and seed, the spool, the controller's state, the
    PMIx directories. slurm.conf and the logs stay, as the stack's own logs do."""
    d = state / DIR
    for sub in ("munge", "spool", "ctld", "pmix", *(p.name for p in d.glob("pmix-*"))):
        shutil.rmtree(d / sub, ignore_errors=True)


def idle_nodes(state: Path) -> int:
    """How many of the cluster's nodes sinfo reports idle (0 while the controller does not answer)."""
    p = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=env(state), capture_output=True, text=True, timeout=30)
    return sum(1 for line in p.stdout.splitlines() if line.split()[1:] == ["idle"]) if p.returncode == 0 else 0


def _wait(ready, deadline: float, state: Path, *names: str) -> None:
    while not ready():
        gone = [n for n in names if not processes.group_alive(processes.pid_of(state, n) or 0)]
        if gone or time.monotonic() > deadline:
            why = f"{gone[0]} exited" if gone else "not ready before the timeout"
            logs = [state / f"{n}.log" for n in names] + [state / DIR / f"{n}.log" for n in names]
            tail = " | ".join(
                line for p in logs if p.exists() for line in p.read_text(errors="replace").splitlines()[-3:]
            )
            raise SlurmError(f"Slurm: {why}; {tail or 'nothing in its logs'}")
        time.sleep(0.3)


def down(state: Path, out=None) -> int:
    """The stack's own `down` (run-stack.sh down: its servers, then the nodes and this module's files)."""
    cmd = [sys.executable, "-m", "deploy.run_stack", "down", "--state-dir", str(state)]
    path = os.pathsep.join(filter(None, [str(SCRIPTS.parent), os.environ.get("PYTHONPATH")]))
    return subprocess.run(cmd, stdout=out, env={**os.environ, "PYTHONPATH": path}).returncode


# ---- the command line: the nodes and Slurm alone (no LMCache, no vLLM) ----------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m deploy.slurm",
        description="N network-namespace nodes with Slurm on them (no engines): for kvtier bench and MLPerf ranks "
        "through sbatch/srun. run-stack.sh up --nodes N --slurm does the same beside vLLM + LMCache + kvtier.",
        epilog="example:\n  python -m deploy.slurm up --state-dir /tmp/kv-slurm --nodes 2\n"
        "  SLURM_CONF=/tmp/kv-slurm/slurm/slurm.conf sbatch -N2 deploy/slurm/kvtier-bench.sbatch\n"
        "  python -m deploy.slurm down --state-dir /tmp/kv-slurm",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("command", choices=("up", "down"))
    ap.add_argument("--state-dir", type=Path, required=True)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=60)
    a = ap.parse_args(argv)
    state = a.state_dir.resolve()
    if a.command == "down":
        return down(state)
    why = missing() or (None if os.geteuid() == 0 else "needs root (network namespaces)")
    if why is None and not 1 <= a.nodes <= 64:
        why = "--nodes is 1 to 64"
    if why is None and any(processes.group_alive(pid) for _, pid in processes.recorded(state)):
        why = f"{state} holds a running stack or cluster: python -m deploy.slurm down --state-dir {state}"
    if why:
        print(f"deploy.slurm: {why}", file=sys.stderr)
        return 2
    state.mkdir(parents=True, exist_ok=True)
    try:
        nodes.up(state, a.nodes)
        info = start(
            state,
            nodes.recorded(state, "ns"),
            [nodes.recorded(state, f"addr{i}")[0] for i in range(a.nodes)],
            time.monotonic() + a.timeout,
        )
    except (SlurmError, nodes.NoFreeNet, subprocess.CalledProcessError) as exc:
        print(f"deploy.slurm: {exc}", file=sys.stderr)
        down(state, sys.stderr)
        return 1
    print(f"slurm    SLURM_CONF={info['conf']}  partition {PARTITION}")
    for n in info["nodes"]:
        print(f"{n['name']}    {n['netns']} {n['address']}")
    print(f"state    {state}  (stop with: python -m deploy.slurm down --state-dir {state})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
