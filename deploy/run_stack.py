"""run_stack.py	start/stop vLLM + LMCache + the kvtier backend, for people and the end-to-end tests alike.

deploy/run-stack.sh runs this module (python -m deploy.run_stack) with the same arguments; the servers' interpreter is
--python. Standard library only: run-stack.sh may find only a bare python3.

usage:
  deploy/run-stack.sh up --device cpu|cuda --model DIR --vllm-port P --lmcache-port P2 --lmcache-http-port P3 \\
                         --kv-dir DIR [--shared-dir DIR] [--instances N] [--mode mp|inprocess] [options]
  deploy/run-stack.sh up ... --nodes N [--shared glusterfs|redis-cluster|s3|cephfs|mooncake] [--shared-bw RATE]
  deploy/run-stack.sh up ... --prometheus [--prometheus-port P5] [--prometheus-interval S]
  deploy/run-stack.sh down [--state-dir DIR] [--grace S]
  deploy/run-stack.sh restart-lmcache [--state-dir DIR] [--instance I] [--signal TERM|KILL]
  deploy/run-stack.sh status [--state-dir DIR]

options of `up` (defaults in brackets):
  --metrics-port P4      kvtier Prometheus exporter of instance 0; instance i uses P4+i  [P3+10]
  --disk-gb G            local disk tier per instance; 0 = none (puts go straight to the shared tier)  [4]
  --shared-gb G          shared tier capacity accounted per instance  [4]
  --io-mode direct|buffered   I/O of the local disk tier  [direct]; a --kv-dir on tmpfs (/dev/shm) makes it a DRAM
                         tier: give buffered there (tmpfs refuses O_DIRECT)
  --l2 kvtier|lmcache-fs|none L2 adapter of the LMCache MP server (mp only)  [kvtier]
                         lmcache-fs: LMCache's own "fs" L2 adapter on --kv-dir, for comparisons (no kvtier, no
                         kvtier metrics; --io-mode direct = its use_odirect, --disk-gb and --shared-dir unused)
                         none: LMCache's memory (L1) only, what is evicted from it is gone (the DRAM-only
                         configuration of a long-session experiment; --disk-gb and --shared-dir unused)
  --l1-gb G              LMCache's own memory (L1) per instance in GiB (LMCache's unit), fractions
                         allowed (0.004 = 4.3 MB)  [1]
                         (the L2 size is --disk-gb, plus --shared-gb with --shared-dir)
  --lmcache-arg ARG      extra argument for the LMCache MP server (repeatable), e.g. --eviction-trigger-watermark
  --chunk-size N         LMCache chunk size in tokens  [256]
  --served-name NAME     model name served by vLLM  [tiny]
  --state-dir DIR        pids, logs, commands, endpoints.json  [$KVTIER_STACK_DIR or /tmp/kvtier-stack-$UID]
  --timeout S            seconds to wait for every server to be healthy  [300]
  --python PY            interpreter with vllm and lmcache  [$PYTHON or .venv/bin/python]
                         (.venv-lmcache057/bin/python: the same stack on LMCache 0.5.7rc2, `make test` builds it)
  --vllm-arg ARG         extra argument for vLLM (repeatable)
  --gpus-per-instance K  cuda only: instance (or node) i sees GPUs i*K .. i*K+K-1 (CUDA_VISIBLE_DEVICES in the
                         commands of its vLLM and its LMCache server, which must agree on device numbers); give vLLM
                         --vllm-arg --tensor-parallel-size=K to use them all. Refused on cpu (vLLM uses no GPU)
Nodes (root; see "Nodes" below):
  --nodes N              N nodes, each a network namespace with its own LMCache + kvtier + vLLM (not with --instances)
  --shared glusterfs|redis-cluster|s3|cephfs|mooncake   the nodes' shared tier (--nodes only; not --shared-dir)
                         glusterfs: deploy/glusterfs.sh up --state-dir STATE/gluster --mounts N; node j's shared
                         tier is its own FUSE client's mount (STATE/gluster/mnt, mnt2, ..) + /kv
                         redis-cluster: python -m deploy.redis_cluster up --state-dir STATE/redis --bind BRIDGE, the
                         nodes' L2 tier below the disk tier (kvtier's redis_url; --shared-gb is its capacity per node)
                         s3: python -m deploy.ceph up --state-dir STATE/ceph --bridge BRIDGE (a Ceph cluster on the
                         nodes' bridge at .250), bucket kvtier: the nodes' L2 tier below the disk tier (kvtier's
                         s3_bucket; keys in STATE/ceph/aws-credentials; --shared-gb is its capacity per node)
                         cephfs: the same cluster with CephFS, one ceph-fuse client per node (STATE/ceph/cephfs,
                         cephfs1, ..) + /kv as node j's shared directory tier
                         mooncake: python -m deploy.mooncake_store up --state-dir STATE/mooncake --bind BRIDGE (master
                         and metadata server), the nodes' L2 tier below the disk tier (kvtier's mooncake_master; each
                         node lends memory to the store, at its own address; --shared-gb is its capacity per node)
  --shared-bw RATE       glusterfs only: tc tbf on the storage link, RATE each way (glusterfs.sh --bw: 200mbps)
  --slurm                Slurm over the nodes (deploy/slurm.py): munged, slurmctld on node 0, slurmd on every node
                         (node names node0, node1, ..); export SLURM_CONF=STATE/slurm/slurm.conf, then sbatch
                         deploy/sbatch/kvtier-bench.sbatch or kvtier-mlperf.sbatch (python -m deploy.slurm up: the
                         nodes and Slurm without the engines)
Prometheus (Debian's `prometheus`, 2.42 tested; see "Prometheus" below):
  --prometheus           also start a Prometheus scraping every instance's (node's) vLLM, LMCache and kvtier
  --prometheus-port P5   its HTTP API and UI, on 127.0.0.1  [P3+30]
  --prometheus-interval S    seconds between scrapes and between rule evaluations  [5]
vLLM's own settings (defaults: what the end-to-end tests were sized for):
  --max-model-len N      longest prompt + answer in tokens  [2048]
  --max-num-seqs N       requests vLLM runs at once  [8]
  --prefix-caching on|off    vLLM's own prefix cache (off: every reuse comes through LMCache)  [off]
  --block-size N         vLLM's KV block size in tokens  [vLLM's default]
  --kv-space GIB         vLLM's KV cache: VLLM_CPU_KVCACHE_SPACE on cpu (whole GiB), --kv-cache-memory-bytes on
                         cuda  [$VLLM_CPU_KVCACHE_SPACE or 1 on cpu; vLLM's default on cuda]

What runs (every server on 127.0.0.1, each in its own process group):
  mp:        per instance an LMCache MP server (python -m lmcache.v1.multiprocess.http_server) with the kvtier L2
             adapter (kvconnector.lmcache.l2_adapter.KvtierL2Adapter; kvtier's metrics are served from that
             process), and a vLLM server with LMCacheMPConnector. Works with vLLM on CPU and GPU.
  inprocess: per instance a vLLM server with LMCacheConnectorV1 and the kvtier storage plugin (config file in the
             state dir). For GPU deployments: on a CPU-only vLLM, LMCache 0.5.6 has no CPU connector and vLLM runs
             degraded (recomputes).
  With --instances N > 1, instance i's vLLM listens on P+1+i, LMCache on P2+i / P3+i, and a round-robin proxy
  (deploy/rr_proxy.py) on P. Instance i's local disk tier is --kv-dir/inst<i>; --shared-dir is shared by all.
  Tiers of N instances (endpoints.json "tiers"): private (each its own disk tier, no --shared-dir: the baseline a
  shared tier is judged against), private+shared (--shared-dir too), shared (--shared-dir and --disk-gb 0).

Nodes (--nodes N, root): node i is a network namespace kvn-<tag>-<i> (<tag> from a hash of the state dir) joined to
  a bridge kvn<tag>b in the root namespace by a veth pair; the bridge is 10.253.X.1/24 and node i is 10.253.X.(10+i)
  (X from the same hash; a /24 that an address or route here already uses is skipped; glusterfs.sh uses 10.254/16).
  Inside node i run its LMCache MP server (ZMQ on the node's own loopback, HTTP on the node's address), kvtier's
  adapter (metrics on the node's address) and vLLM on the node's address, each on the ports given (every node the
  same ports: each has its own address), its disk tier in --kv-dir/node<i>. The round-robin proxy runs in the root
  namespace on 127.0.0.1:--vllm-port in front of the nodes' vLLMs; clients and tests reach each node's vLLM,
  LMCache HTTP and kvtier metrics at its address (endpoints.json "instances", one per node, and "nodes").
  The Redis Cluster runs in the root namespace bound to (and announcing) the bridge address, which every node
  reaches; GlusterFS serves from its own namespace and is mounted in the root namespace, mounts the nodes see.
  endpoints.json "nodes": per node its namespace, address, shared_dir (GlusterFS) and endpoints; "shared": the
  kind, its state dir and its mounts (glusterfs) or URL (redis-cluster). `restart-lmcache --instance I` restarts
  node I's LMCache server inside its namespace.
  Everything made is recorded in STATE/nodes.state the moment it exists; `down` removes exactly that (processes,
  the shared tier, namespaces, bridge), also after a failed `up`, and is idempotent.

Prometheus (--prometheus): a `prometheus` process on 127.0.0.1:P5 (in the root namespace: it reaches the nodes at
  their addresses) with STATE/prometheus/prometheus.yml, written by `python -m deploy.prometheus_config` from
  endpoints.json: jobs vllm, lmcache (mp only) and kvtier (--l2 kvtier only), one target per instance or node,
  each labelled stack_instance=<index>; the recording rules of deploy/prometheus/kvtier-rules.yml (hit rate per
  tier, bytes and operations per tier, latency quantiles per operation); its data in STATE/prometheus/data, emptied
  by each `up` (a stopped Prometheus leaves its last samples current for 5 minutes: a restarted stack's queries
  would add up the old targets' series). endpoints.json "prometheus" and `status` give its URL; `down`
  stops it with the rest. deploy/grafana/kvtier-dashboard.json is a Grafana dashboard of the rules for a Grafana
  that has this Prometheus as a data source. `kvtier replay --metrics-url prometheus+http://127.0.0.1:P5` reads the
  run's server-side figures from it.

example:
  $ deploy/make_tiny_model.py /tmp/tiny && deploy/run-stack.sh up --device cpu --model /tmp/tiny --vllm-port 8000 \\
      --lmcache-port 5555 --lmcache-http-port 8090 --kv-dir /tmp/kvtier-cache
  vllm     http://127.0.0.1:8000/v1
  lmcache  http://127.0.0.1:8090  (MP server 127.0.0.1:5555)
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

from . import SCRIPTS, nodes, processes, slurm
from .instance import Instance, Settings

ROOT = SCRIPTS.parent
SHARED_KINDS = ("glusterfs", "redis-cluster", "s3", "cephfs", "mooncake")
PROG = "run-stack.sh"
POSITIVE = re.compile(r"[1-9][0-9]*")
NUMBER = re.compile(r"[0-9]*\.?[0-9]+")
ZERO = re.compile(r"0*(\.0*)?")


class Refused(Exception):
    """What the user asked cannot be done: one line on stderr, exit 2."""


def default_python() -> str:
    venv = ROOT / ".venv" / "bin" / "python"
    return os.environ.get("PYTHON") or (str(venv) if os.access(venv, os.X_OK) else "python3")


def default_state() -> Path:
    return Path(os.environ.get("KVTIER_STACK_DIR") or f"/tmp/kvtier-stack-{os.getuid()}")


def python_env() -> dict[str, str]:
    """This environment with the package's root first on PYTHONPATH (for `python -m deploy.*`)."""
    return dict(os.environ, PYTHONPATH=str(ROOT))


def server_pythonpath() -> str:
    """The root, then the caller's PYTHONPATH (without the root run-stack.sh put first to start this)."""
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(":") if p and p != str(ROOT)]
    return ":".join([str(ROOT), *rest])


def parse(cmd: str, argv: list[str], spec: dict[str, str], flags: frozenset[str] = frozenset()) -> dict:
    """The bash loop this replaces: `--opt VALUE` (a list when repeatable: spec value ending in '+') or a flag."""
    out: dict = {}
    i = 0
    while i < len(argv):
        opt = argv[i]
        if opt in flags:
            out[opt] = True
            i += 1
            continue
        if opt not in spec:
            hint = f" (see the header of {Path(__file__).resolve()})" if cmd == "up" else ""
            raise Refused(f"{cmd}: unknown option {opt}{hint}")
        if i + 1 >= len(argv):
            raise Refused(f"{cmd}: {opt} needs a value")
        key = spec[opt]
        if key.endswith("+"):
            out.setdefault(key[:-1], []).append(argv[i + 1])
        else:
            out[key] = argv[i + 1]
        i += 2
    return out


# ---- down, status, restart-lmcache -----------------------------------------------------------------------------------
def down(state: Path, grace_s: float = 15, out=None, python: str | None = None) -> int:
    out = out or sys.stdout
    if not (state / "pids").exists() and not (state / nodes.STATE_FILE).exists():
        print(f"nothing to stop (no {state}/pids)", file=out, flush=True)
        return 0
    if (state / "pids").exists():
        processes.stop_groups(grace_s, signal.SIGTERM, [pid for _, pid in reversed(processes.recorded(state))])
        (state / "pids").unlink()
    nodes.remove(state, python or default_python(), python_env(), out)
    slurm.remove(state)
    print(f"stopped; logs kept in {state}", file=out, flush=True)
    return 0


def status(state: Path) -> int:
    if not (state / "pids").exists():
        print("not running")
        return 1
    for name, pid in processes.recorded(state):
        print(f"{name} {pid} {'running' if processes.group_alive(pid) else 'gone'}")
    path = state / "endpoints.json"
    if not path.exists():
        return 0
    text = path.read_text()
    ep = json.loads(text)
    for i, node in enumerate(ep.get("nodes", [])):
        inst = ep["instances"][i]
        print(
            f"node{i}  {node['netns']}  {node['address']}  vllm {inst['vllm']}  lmcache {inst['lmcache_http']}  "
            f"kvtier {inst['kvtier_metrics']}"
        )
    if ep.get("prometheus"):
        print(f"prometheus  {ep['prometheus']}  (config {ep['state_dir']}/prometheus/prometheus.yml)")
    if ep.get("slurm"):
        print(f"slurm  SLURM_CONF={ep['slurm']['conf']}  nodes {' '.join(n['name'] for n in ep['slurm']['nodes'])}")
    shared = ep.get("shared")
    if shared:
        where = shared.get("url") or ", ".join(shared.get("mounts", []))
        print(f"shared  {shared['kind']}  {where}" + (f"  ({shared['bw']} each way)" if shared.get("bw") else ""))
    sys.stdout.write(text)
    return 0


def restart_lmcache(state: Path, inst: int, sig_name: str, timeout_s: float) -> int:
    """Stop one LMCache server (TERM, or KILL for a crash test) and start it again with the same command."""
    sig = getattr(signal, f"SIG{sig_name}", None)
    if not isinstance(sig, signal.Signals):
        raise Refused(f"restart-lmcache: --signal is TERM or KILL (or another signal's name), got {sig_name}")
    name = f"lmcache{inst}"
    pid = processes.pid_of(state, name)
    if pid is None:
        raise Refused(f"no {name} in {state}/pids")
    processes.stop_groups(15, sig, [pid])
    processes.forget(state, name)
    with open(state / f"{name}.log", "a") as log:
        log.write(f"--- restart ({sig_name}) ---\n")
    processes.start(state, name, shlex.split((state / f"{name}.cmd").read_text()))
    url = json.loads((state / "endpoints.json").read_text())["instances"][inst]["lmcache_http"]
    try:
        processes.wait_http(state, name, url + "/healthcheck", time.monotonic() + timeout_s)
    except processes.NotHealthy:
        return 1
    print(f"{name} restarted")
    return 0


# ---- up --------------------------------------------------------------------------------------------------------------
UP_OPTIONS = {
    "--device": "device",
    "--model": "model",
    "--vllm-port": "vport",
    "--lmcache-port": "lport",
    "--lmcache-http-port": "hport",
    "--kv-dir": "kvdir",
    "--shared-dir": "shared",
    "--instances": "n",
    "--mode": "mode",
    "--metrics-port": "mport",
    "--disk-gb": "disk_gb",
    "--shared-gb": "shared_gb",
    "--io-mode": "io_mode",
    "--l2": "l2",
    "--l1-gb": "l1_gb",
    "--chunk-size": "chunk",
    "--served-name": "name",
    "--state-dir": "state",
    "--timeout": "timeout",
    "--python": "python",
    "--vllm-arg": "vextra+",
    "--lmcache-arg": "lextra+",
    "--max-model-len": "max_len",
    "--max-num-seqs": "max_seqs",
    "--prefix-caching": "prefix_caching",
    "--block-size": "vblock",
    "--kv-space": "kv_space",
    "--nodes": "nodes",
    "--shared": "shared_kind",
    "--shared-bw": "shared_bw",
    "--gpus-per-instance": "gpk",
    "--prometheus-port": "prom_port",
    "--prometheus-interval": "prom_interval",
}
UP_DEFAULTS = {
    **dict.fromkeys(
        ["device", "model", "vport", "lport", "hport", "kvdir", "shared", "mport", "vblock", "kv_space"], ""
    ),
    **dict.fromkeys(["nodes", "shared_kind", "shared_bw", "gpk", "prom_port", "prom_interval"], ""),
    **{"n": "1", "mode": "mp", "disk_gb": "4", "shared_gb": "4", "io_mode": "direct", "l1_gb": "1", "chunk": "256"},
    **{"name": "tiny", "timeout": "300", "l2": "kvtier", "max_len": "2048", "max_seqs": "8", "prefix_caching": "off"},
    **{"vextra": [], "lextra": []},
}


def check_up(o: dict) -> None:
    """Every refusal of `up`'s flags, in the order the shell script had them (the first one is the one said)."""

    def need(ok: bool, msg: str) -> None:
        if not ok:
            raise Refused(msg)

    def matches(rx: re.Pattern, v: str) -> bool:
        return rx.fullmatch(v) is not None

    need(o["device"] in ("cpu", "cuda"), "--device cpu|cuda is required")
    need(
        bool(o["model"]) and os.path.isdir(o["model"]),
        "--model DIR is required and must exist (deploy/make_tiny_model.py DIR)",
    )
    need(
        all(o[k] for k in ("vport", "lport", "hport")),
        "--vllm-port, --lmcache-port and --lmcache-http-port are required",
    )
    need(bool(o["kvdir"]), "--kv-dir DIR is required")
    need(o["mode"] in ("mp", "inprocess"), "--mode is mp or inprocess")
    need(o["l2"] in ("kvtier", "lmcache-fs", "none"), "--l2 is kvtier, lmcache-fs or none")
    need(
        o["l2"] == "kvtier" or (o["mode"] == "mp" and not o["shared"]),
        f"--l2 {o['l2']} needs --mode mp and no --shared-dir",
    )
    need(matches(POSITIVE, o["max_len"]), "--max-model-len must be a positive integer")
    need(matches(POSITIVE, o["max_seqs"]), "--max-num-seqs must be a positive integer")
    need(o["prefix_caching"] in ("on", "off"), "--prefix-caching is on or off")
    need(not o["vblock"] or matches(POSITIVE, o["vblock"]), "--block-size must be a positive integer")
    need(matches(NUMBER, o["l1_gb"]) and float(o["l1_gb"]) > 0, "--l1-gb must be a number of GB > 0")
    if o["kv_space"]:
        if o["device"] == "cpu":
            need(
                matches(POSITIVE, o["kv_space"]),
                f"--kv-space on cpu is whole GiB (VLLM_CPU_KVCACHE_SPACE), got {o['kv_space']}",
            )
        else:
            need(matches(NUMBER, o["kv_space"]), "--kv-space must be a number of GiB")
    need(o["io_mode"] in ("direct", "buffered"), "--io-mode is direct or buffered")
    need(matches(POSITIVE, o["n"]), "--instances must be a positive integer")
    for k, flag in (
        ("vport", "--vllm-port"),
        ("lport", "--lmcache-port"),
        ("hport", "--lmcache-http-port"),
        ("mport", "--metrics-port"),
    ):
        need(not o[k] or matches(POSITIVE, o[k]), f"{flag} must be a port number")
    for k, flag in (("disk_gb", "--disk-gb"), ("shared_gb", "--shared-gb")):
        need(matches(NUMBER, o[k]), f"{flag} must be a number of GB")
    need(matches(POSITIVE, o["chunk"]), "--chunk-size must be a positive integer")
    need(matches(NUMBER, o["timeout"]), "--timeout must be a number of seconds")
    # nodes, their shared tier, GPUs
    nodes_n, shared_kind = o["nodes"], o["shared_kind"]
    if nodes_n:
        need(matches(POSITIVE, nodes_n) and int(nodes_n) <= 200, "--nodes must be a positive integer (at most 200)")
        need(
            o["n"] == "1", "--nodes and --instances are exclusive (a node is an instance in its own network namespace)"
        )
        need(o["mode"] == "mp", "--nodes needs --mode mp")
        need(not o["shared"], f"--nodes takes --shared {'|'.join(SHARED_KINDS)}, not --shared-dir")
    if shared_kind:
        need(shared_kind in SHARED_KINDS, f"--shared is one of {', '.join(SHARED_KINDS)}")
        need(bool(nodes_n), f"--shared {shared_kind} needs --nodes N (on one host: --shared-dir DIR)")
        need(o["l2"] == "kvtier", "--shared needs --l2 kvtier")
    need(not o["shared_bw"] or shared_kind == "glusterfs", "--shared-bw needs --shared glusterfs")
    need(not o.get("slurm") or bool(nodes_n), "--slurm needs --nodes N (Slurm's nodes are the stack's nodes)")
    need(not o.get("slurm") or slurm.missing() is None, f"--slurm: {slurm.missing()}")
    if o["gpk"]:
        need(matches(POSITIVE, o["gpk"]), "--gpus-per-instance must be a positive integer")
        need(o["device"] == "cuda", "--gpus-per-instance needs --device cuda (vLLM on cpu uses no GPU)")
        count = int(nodes_n or o["n"])
        want, have = count * int(o["gpk"]), gpu_count()
        need(
            have is None or want <= have,
            f"--gpus-per-instance {o['gpk']}: {count} instance(s) need {want} GPUs, this host has {have}",
        )
    if nodes_n:
        need(os.geteuid() == 0, "--nodes needs root (network namespaces, a bridge)")
        need(shutil.which("ip") is not None, "--nodes needs ip (iproute2)")
        if shared_kind == "glusterfs":
            need(
                shutil.which("glusterd") is not None,
                "--shared glusterfs needs glusterd (apt-get install glusterfs-server glusterfs-client)",
            )
        elif shared_kind == "redis-cluster":
            need(
                shutil.which("redis-server") is not None,
                "--shared redis-cluster needs redis-server (apt-get install redis-server)",
            )
        elif shared_kind == "mooncake":
            from . import mooncake_store

            why = mooncake_store.missing()
            need(why is None, f"--shared mooncake: {why}")
        elif shared_kind in ("s3", "cephfs"):
            from . import ceph

            why = ceph.missing()
            need(why is None, f"--shared {shared_kind}: {why}")
            need(
                shared_kind == "s3" or all(shutil.which(b) for b in ceph.CEPHFS_BINARIES),
                f"--shared cephfs needs {ceph.CEPHFS_PACKAGES} (apt-get install {ceph.CEPHFS_PACKAGES})",
            )
            need(
                shared_kind == "cephfs" or importlib.util.find_spec("boto3") is not None,
                "--shared s3 needs boto3 (pip install 'kvtier[s3]')",
            )
    if o.get("prom"):
        o["prom_interval"] = o["prom_interval"] or "5"
        need(shutil.which("prometheus") is not None, "--prometheus needs prometheus (apt-get install prometheus)")
        need(not o["prom_port"] or matches(POSITIVE, o["prom_port"]), "--prometheus-port must be a port number")
        need(
            matches(NUMBER, o["prom_interval"]) and float(o["prom_interval"]) >= 0.1,
            "--prometheus-interval must be a number of seconds >= 0.1",
        )
    else:
        need(
            not o["prom_port"] and not o["prom_interval"],
            "--prometheus-port and --prometheus-interval need --prometheus",
        )
    if o["l2"] == "kvtier" and matches(ZERO, o["disk_gb"]):
        need(
            bool(o["shared"] or shared_kind), "--disk-gb 0 leaves kvtier no tier: give --shared-dir, --shared or a size"
        )


def gpu_count() -> int | None:
    """GPUs nvidia-smi lists; None when it cannot tell (no nvidia-smi, or it lists none)."""
    try:
        p = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    except OSError:
        return None
    n = sum(line.startswith("GPU") for line in p.stdout.splitlines())
    return n if p.returncode == 0 and n else None


def tiers_of(o: dict) -> str:
    """private (each instance its own disk tier), private+shared, or shared (no disk tier: --disk-gb 0)."""
    shared = bool(o["shared"] or o["shared_kind"])
    if o["l2"] == "kvtier" and ZERO.fullmatch(o["disk_gb"]):
        return "shared"
    return "private+shared" if shared else "private"


def settings_of(o: dict) -> Settings:
    env = ["env", "HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1", "VLLM_NO_USAGE_STATS=1", "DO_NOT_TRACK=1"]
    env += ["PYTHONHASHSEED=0", "LMCACHE_TRACK_USAGE=false", f"PYTHONPATH={server_pythonpath()}"]
    if o["device"] == "cpu":
        env.append(f"VLLM_CPU_KVCACHE_SPACE={o['kv_space'] or os.environ.get('VLLM_CPU_KVCACHE_SPACE') or '1'}")
    vs = ["--max-model-len", o["max_len"], "--max-num-seqs", o["max_seqs"]]
    vs.append("--enable-prefix-caching" if o["prefix_caching"] == "on" else "--no-enable-prefix-caching")
    if o["vblock"]:
        vs += ["--block-size", o["vblock"]]
    if o["kv_space"] and o["device"] == "cuda":
        vs += ["--kv-cache-memory-bytes", str(int(float(o["kv_space"]) * 2**30))]
    return Settings(
        python=o["python"],
        device=o["device"],
        model=o["model"],
        served_name=o["name"],
        mode=o["mode"],
        l2=o["l2"],
        io_mode=o["io_mode"],
        disk_gb=o["disk_gb"],
        shared_gb=o["shared_gb"],
        l1_gb=o["l1_gb"],
        chunk=o["chunk"],
        vllm_settings=vs,
        env=env,
        vllm_extra=o["vextra"],
        lmcache_extra=o["lextra"],
    )


def endpoints_json(fields: list[tuple[str, object]]) -> str:
    """endpoints.json as the shell script wrote it: json.dumps's spacing, but the instances and nodes joined by a bare
    comma (a reader comparing text sees no change)."""
    parts = []
    for k, v in fields:
        val = "[" + ",".join(json.dumps(x) for x in v) + "]" if isinstance(v, list) else json.dumps(v)
        parts.append(f"{json.dumps(k)}: {val}")
    return "{" + ", ".join(parts) + "}\n"


def up(argv: list[str]) -> int:
    o = {**UP_DEFAULTS, "vextra": [], "lextra": [], "python": default_python(), "state": str(default_state())}
    o.update(parse("up", argv, UP_OPTIONS, frozenset({"--prometheus", "--slurm"})))
    o["prom"] = o.pop("--prometheus", False)
    o["slurm"] = o.pop("--slurm", False)
    check_up(o)
    mport = int(o["mport"] or int(o["hport"]) + 10)
    prom_port = int(o["prom_port"] or int(o["hport"]) + 30)
    state = Path(o["state"])
    state.mkdir(parents=True, exist_ok=True)
    state.chmod(0o700)
    state = Path(os.path.abspath(state))  # the nodes' processes and the shared tier's mounts need absolute paths
    if (state / "pids").exists():
        if any(processes.group_alive(pid) for _, pid in processes.recorded(state)):
            raise Refused(f"a stack is already running from {state} (deploy/run-stack.sh down --state-dir {state})")
        (state / "pids").unlink()
    with open(os.devnull, "w") as null:  # what a run killed before its `down` left (none of its pids runs)
        nodes.remove(state, o["python"], python_env(), null)
    for p in [*state.glob("*.log"), *state.glob("*.cmd"), state / "endpoints.json"]:
        p.unlink(missing_ok=True)
    # Any failure from here on stops and removes what was started and made.
    try:
        return _start(o, state, mport, prom_port)
    except BaseException as exc:
        rc = exit_code(exc)
        if rc == 0:
            raise
        print(f"{PROG}: start-up failed, stopping what was started", file=sys.stderr, flush=True)
        down(state, 5, sys.stderr, o["python"])
        return rc


def exit_code(exc: BaseException) -> int:
    """The exit status a failure during start-up ends `up` with (after the clean-up), saying what it was."""
    if isinstance(exc, Refused):
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    if isinstance(exc, processes.NotHealthy):
        return 1  # wait_http said which and why
    if isinstance(exc, slurm.SlurmError):
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    if isinstance(exc, subprocess.CalledProcessError):
        print(f"{PROG}: {shlex.join(map(str, exc.cmd))} failed (exit {exc.returncode})", file=sys.stderr)
        return exc.returncode
    if isinstance(exc, SystemExit):
        return exc.code if isinstance(exc.code, int) else 1
    if isinstance(exc, KeyboardInterrupt):
        return 130
    traceback.print_exception(exc)
    return 1


def _start(o: dict, state: Path, mport: int, prom_port: int) -> int:
    s = settings_of(o)
    deadline = time.monotonic() + float(o["timeout"])
    n_nodes = int(o["nodes"] or 0)
    count = n_nodes or int(o["n"])
    vport, lport, hport = int(o["vport"]), int(o["lport"]), int(o["hport"])
    kvdir, shared_kind, shared_bw = o["kvdir"], o["shared_kind"], o["shared_bw"]
    # nodes: namespaces and their shared tier
    remote, capacity_key, shared_json, shared_line = {}, "", None, ""
    if n_nodes:
        nodes.up(state, n_nodes)
        if shared_kind == "glusterfs":
            nodes.gluster_up(state, n_nodes, shared_bw)
            mounts = [str(nodes.gluster_mount(state, i)) for i in range(n_nodes)]
            shared_json = {"kind": "glusterfs", "state_dir": str(state / "gluster"), "bw": shared_bw, "mounts": mounts}
            shared_line = f"GlusterFS {state}/gluster/mnt* (one FUSE client per node)"
            shared_line += f", {shared_bw} each way" if shared_bw else ""
        elif shared_kind == "redis-cluster":
            url = nodes.redis_up(state, o["python"], python_env())
            remote, capacity_key = {"redis_url": url}, "redis_capacity_gb"
            shared_json = {"kind": "redis-cluster", "state_dir": str(state / "redis"), "url": url}
            shared_line = url
        elif shared_kind == "mooncake":
            master, url = nodes.mooncake_up(state, o["python"], python_env())
            remote, capacity_key = {"mooncake_master": master, "mooncake_metadata_url": url}, "mooncake_capacity_gb"
            shared_json = {"kind": "mooncake", "state_dir": str(state / "mooncake"), "url": url, "master": master}
            shared_line = f"Mooncake Store: master {master}, metadata {url} (the nodes lend its memory)"
        elif shared_kind in ("s3", "cephfs"):
            ceph = nodes.ceph_up(state, o["python"], python_env(), shared_kind, n_nodes)
            shared_json = {"kind": shared_kind, "state_dir": str(state / "ceph"), "url": ceph["endpoint"]}
            if shared_kind == "s3":
                # the keys reach the servers as a file (their recorded command lines name it, not them)
                s.env.append(f"AWS_SHARED_CREDENTIALS_FILE={state / 'ceph' / 'aws-credentials'}")
                s.env.append("AWS_EC2_METADATA_DISABLED=true")  # nowhere else to ask for credentials
                remote = {"s3_bucket": nodes.S3_BUCKET, "s3_endpoint": ceph["endpoint"]}
                capacity_key = "s3_capacity_gb"
                shared_line = f"S3 {ceph['endpoint']}/{nodes.S3_BUCKET} (radosgw; Ceph in {state}/ceph)"
            else:
                shared_json["mounts"] = [str(nodes.ceph_mount(state, i)) for i in range(n_nodes)]
                shared_line = f"CephFS {state}/ceph/cephfs* (one ceph-fuse client per node)"
    slurm_json = None
    if o["slurm"]:
        addrs = [nodes.recorded(state, f"addr{i}")[0] for i in range(n_nodes)]
        slurm_json = slurm.start(state, nodes.recorded(state, "ns"), addrs, deadline)
    insts: list[Instance] = []
    for i in range(count):
        inst = Instance(
            i, "127.0.0.1", vport, lport + i, hport + i, mport + i, kvdir, o["shared"], remote, capacity_key
        )
        if n_nodes:  # every node the same ports, on its own address; LMCache's ZMQ socket on its own loopback
            inst.kv_dir, inst.lmcache_port, inst.lmcache_http_port, inst.metrics_port = (
                f"{kvdir}/node{i}",
                lport,
                hport,
                mport,
            )
            inst.host, inst.netns = nodes.recorded(state, f"addr{i}")[0], nodes.recorded(state, "ns")[i]
            if shared_kind == "glusterfs":
                inst.shared_dir = f"{nodes.gluster_mount(state, i)}/kv"
            elif shared_kind == "cephfs":
                inst.shared_dir = f"{nodes.ceph_mount(state, i)}/kv"
            elif shared_kind == "mooncake":  # the others fetch from this node's segment at its own address
                inst.remote = {**remote, "mooncake_local_hostname": inst.host}
        elif count > 1:
            inst.kv_dir, inst.vllm_port = f"{kvdir}/inst{i}", vport + 1 + i
        if o["gpk"]:
            k = int(o["gpk"])
            inst.gpus = ",".join(str(g) for g in range(i * k, i * k + k))
        for d in (kvdir, inst.kv_dir):
            os.makedirs(d, mode=0o700, exist_ok=True)
        config = None
        if s.mode == "mp":
            processes.start(state, f"lmcache{i}", inst.lmcache_command(s))
        else:
            config = state / f"lmcache-inst{i}.yaml"
            config.write_text(inst.inprocess_config(s))
            if s.device == "cpu":
                print(
                    f"{PROG}: note: in-process LMCache has no CPU connector in 0.5.6; vLLM will recompute",
                    file=sys.stderr,
                )
        processes.start(state, f"vllm{i}", inst.vllm_command(s, config))
        insts.append(inst)
    if count > 1:
        backends = [a for inst in insts for a in ("--backend", inst.vllm)]
        proxy = [s.python, str(SCRIPTS / "rr_proxy.py"), "--host", "127.0.0.1", "--port", str(vport), *backends]
        processes.start(state, "proxy", proxy)
    node_json = [
        {"netns": inst.netns, "address": inst.host, "shared_dir": inst.shared_dir, "endpoints": inst.endpoints()}
        for inst in insts
        if n_nodes
    ]
    fields = [
        *[("mode", s.mode), ("l2", s.l2), ("device", s.device), ("vllm", f"http://127.0.0.1:{vport}")],
        *[("model", s.served_name), ("shared_dir", o["shared"]), ("tiers", tiers_of(o)), ("state_dir", str(state))],
        *[("instances", [inst.endpoints() for inst in insts]), ("nodes", node_json), ("shared", shared_json)],
        ("prometheus", f"http://127.0.0.1:{prom_port}" if o["prom"] else None),
        ("slurm", slurm_json),
    ]
    (state / "endpoints.json").write_text(endpoints_json(fields))
    if o["prom"]:
        start_prometheus(state, s.python, o["prom_interval"], prom_port)
    for i, inst in enumerate(insts):
        if s.mode == "mp":
            processes.wait_http(state, f"lmcache{i}", inst.lmcache_http + "/healthcheck", deadline)
            if s.l2 == "kvtier":
                processes.wait_http(state, f"lmcache{i}", inst.kvtier_metrics, deadline)
        processes.wait_http(state, f"vllm{i}", inst.vllm + "/health", deadline)
    if count > 1:
        processes.wait_http(state, "proxy", f"http://127.0.0.1:{vport}/health", deadline)
    if o["prom"]:
        processes.wait_http(state, "prometheus", f"http://127.0.0.1:{prom_port}/-/ready", deadline)
    print(f"vllm     http://127.0.0.1:{vport}/v1")
    for i, inst in enumerate(insts):
        if n_nodes:
            print(f"node{i}    {inst.netns} {inst.host}")
        if s.mode == "mp":
            print(f"lmcache  {inst.lmcache_http}  (MP server 127.0.0.1:{inst.lmcache_port})")
        if s.l2 == "kvtier":
            print(f"kvtier   {inst.kvtier_metrics}")
        elif s.l2 == "none":
            print(f"l2       none (LMCache L1 only, {s.l1_gb} GB)")
        else:
            print(f"l2       LMCache fs adapter on {kvdir} (use_odirect: {str(s.io_mode == 'direct').lower()})")
    if shared_line:
        print(f"shared   {shared_line}")
    if slurm_json:
        print(f"slurm    SLURM_CONF={slurm_json['conf']}  (sbatch -N{n_nodes} deploy/sbatch/kvtier-bench.sbatch ...)")
    if o["prom"]:
        every = o["prom_interval"]
        print(f"prometheus http://127.0.0.1:{prom_port}  ({state}/prometheus/prometheus.yml, every {every} s)")
    print(f"state    {state}  (pids, logs, endpoints.json; stop with: deploy/run-stack.sh down --state-dir {state})")
    return 0


def start_prometheus(state: Path, python: str, interval: str, port: int) -> None:
    """Started last, so `down` (which stops in reverse order) stops it first: no scrape errors of servers stopping.
    Its data emptied: a stopped Prometheus leaves its last samples current for 5 minutes."""
    prom = state / "prometheus"
    shutil.rmtree(prom / "data", ignore_errors=True)
    os.makedirs(prom / "data", mode=0o700)
    with open(prom / "prometheus.yml", "w") as yml:
        cmd = [python, "-m", "deploy.prometheus_config", str(state / "endpoints.json"), "--interval", interval]
        subprocess.run(cmd, stdout=yml, env=python_env(), check=True)
    cmd = ["prometheus", "--config.file", str(prom / "prometheus.yml"), "--storage.tsdb.path", str(prom / "data")]
    processes.start(state, "prometheus", [*cmd, "--web.listen-address", f"127.0.0.1:{port}"])


# ---- the command line ------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if not argv:
            raise Refused(
                f"usage: {PROG} up|down|status|restart-lmcache [options] (see the header of {Path(__file__).resolve()})"
            )
        sub, rest = argv[0], argv[1:]
        if sub == "up":
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a killed `up` still stops what it started
            return up(rest)
        if sub == "down":
            o = parse("down", rest, {"--state-dir": "state", "--grace": "grace"})
            grace = o.get("grace", "15")
            if not NUMBER.fullmatch(grace):
                raise Refused("down: --grace must be a number of seconds")
            return down(Path(o.get("state") or default_state()), float(grace))
        if sub == "status":
            return status(Path(parse("status", rest, {"--state-dir": "state"}).get("state") or default_state()))
        if sub == "restart-lmcache":
            spec = {"--state-dir": "state", "--instance": "inst", "--signal": "sig", "--timeout": "timeout"}
            o = parse("restart-lmcache", rest, spec)
            for k, rx, what in (("inst", r"[0-9]+", "an instance index"), ("timeout", NUMBER.pattern, "seconds")):
                if k in o and not re.fullmatch(rx, o[k]):
                    raise Refused(f"restart-lmcache: --{'instance' if k == 'inst' else k} must be {what}")
            state = Path(o.get("state") or default_state())
            return restart_lmcache(state, int(o.get("inst", 0)), o.get("sig", "TERM"), float(o.get("timeout", 300)))
        raise Refused(f"unknown command {sub} (up, down, status, restart-lmcache)")
    except Refused as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
