"""End to end on two nodes: `run-stack.sh up --nodes 2 --shared glusterfs|redis-cluster|s3|cephfs|mooncake` puts each
node's LMCache MP server, kvtier adapter and vLLM in its own network namespace, and their one shared tier between
them: a GlusterFS volume (one FUSE client per node), a Redis Cluster bound to the nodes' bridge, a Ceph cluster on
that bridge (an S3 bucket through radosgw; or CephFS, one ceph-fuse client per node), or a Mooncake Store whose
master is bound to the bridge and whose memory the nodes lend.

Per shared kind, one stack (its start-up is about a minute here):
1. a prompt to node 1's vLLM is computed and stored in the shared tier (no local disk tier: puts go straight to it);
   node 1's LMCache L1 cleared; the same prompt to node 2's vLLM is an external prefix-cache hit there, loaded by
   node 2's kvtier from the shared tier, keys it never stored itself; the same greedy text;
2. Prometheus (`--prometheus`, in the root namespace) scrapes every node's vLLM, LMCache and kvtier at its address;
3. `down` leaves no namespace, bridge, mount or process of the stack or its shared tier behind.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
from kvtier_stack import (
    alive,
    clear_l1,
    complete,
    down,
    group_pids,
    kvtier_event,
    metric,
    metrics,
    need_lmcache,
    prompt_text,
    up,
    vllm_external_hits,
    wait_for,
)

from deploy import RUN_STACK, mooncake_store, slurm

pytestmark = [
    pytest.mark.e2e,
    # alone: two instances, a GlusterFS volume or a Redis cluster, and Prometheus at once; beside another stack on two
    # cores a node's scrapes lagged its stores and the Prometheus check failed
    pytest.mark.serial,
    pytest.mark.root(reason="network namespaces, a bridge and FUSE mounts"),
    pytest.mark.timeout(900),
]

CHUNKS = 5  # 1300 tokens at LMCache's chunk size 256: five full chunks are stored
HIT_TOKENS = CHUNKS * 256
# kvtier's name of the tier each kind configures
TIER = {"glusterfs": "shared", "redis-cluster": "redis", "s3": "s3", "cephfs": "shared", "mooncake": "mooncake"}
NEEDS = {
    "glusterfs": ("glusterd", "gluster"),
    "redis-cluster": ("redis-server", "redis-cli"),
    "s3": ("ceph-mon", "ceph-osd", "radosgw"),
    "cephfs": ("ceph-mon", "ceph-osd", "ceph-mds", "ceph-fuse"),
    "mooncake": (),  # console scripts of the venv: mooncake_store.missing() says
}
EXTRA = {"mooncake": ["--shared-gb", "0.5"]}  # each node lends 1.25 x this to the store
# Slurm over the nodes of one kind (a few seconds more; deploy/slurm.py, tests/deploy/test_slurm.py for its jobs)
SLURM_KIND = "redis-cluster"


@pytest.fixture(scope="module", params=list(TIER))
def nodes(request, tiny_model_dir, tmp_path_factory):
    kind = request.param
    missing = [exe for exe in NEEDS[kind] if shutil.which(exe) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (deploy/install-system-deps.sh)")
    if kind == "mooncake" and mooncake_store.missing():
        pytest.skip(mooncake_store.missing())
    need_lmcache()
    base = tmp_path_factory.mktemp(f"nodes-{kind}")
    state = base / "state"
    extra = ["--nodes", "2", "--shared", kind, "--disk-gb", "0", "--l1-gb", "0.5", *EXTRA.get(kind, [])]
    if shutil.which("prometheus"):  # Prometheus in the root namespace scraping every node (its own test below)
        extra += ["--prometheus", "--prometheus-interval", "1"]
    if kind == SLURM_KIND and slurm.missing() is None:
        extra += ["--slurm"]
    try:
        stack = up(state, tiny_model_dir, base / "kv", *extra, timeout_s=480)
    except Exception:
        said = (state / "ceph.log").read_text(errors="replace") if (state / "ceph.log").exists() else ""
        if kind == "cephfs" and "ceph-fuse did not mount" in said:  # as tests/kvconnector/test_s3_tier.py's cephfs
            down(state)
            pytest.skip(f"CephFS could not be mounted on this machine: {said.strip().splitlines()[-1]}")
        raise
    ctx = SimpleNamespace(kind=kind, tier=TIER[kind], state=state, stack=stack, model=tiny_model_dir)
    ctx.made = made_by(state)
    try:
        yield ctx
    finally:
        down(state)


def made_by(state: Path) -> dict:
    """What a nodes stack made, from its state directory: namespaces, bridge, processes (the stack's groups, glusterd,
    Redis' nodes) and mounts, to look for after `down`."""
    recorded = (state / "nodes.state").read_text().splitlines()
    made = {"netns": {v for k, _, v in (r.partition("=") for r in recorded) if k == "ns"}}
    made["links"] = {v for k, _, v in (r.partition("=") for r in recorded) if k in ("bridge", "veth")}
    made["groups"] = set(group_pids(state))
    made["pids"] = set()
    gluster = state / "gluster" / "gluster.state"
    if gluster.exists():
        for k, _, v in (line.partition("=") for line in gluster.read_text().splitlines()):
            if k == "ns":
                made["netns"].add(v)
            elif k == "veth_host":
                made["links"].add(v)
            elif k == "glusterd_pid":
                made["pids"].add(int(v))
    redis = state / "redis" / "redis-cluster.json"
    if redis.exists():
        made["pids"] |= set(json.loads(redis.read_text())["pids"].values())
    mooncake = mooncake_store.MooncakeStore.load(state / "mooncake")
    if mooncake is not None:
        made["pids"] |= set(mooncake.pids.values())
    ceph = state / "ceph" / "ceph.state"
    if ceph.exists():
        for k, _, v in (line.partition("=") for line in ceph.read_text().splitlines()):
            if k == "ns":
                made["netns"].add(v)
            elif k == "veth":
                made["links"].add(v)
            elif k == "pid":
                made["pids"].add(int(v.rpartition(":")[2]))
    assert len(made["netns"]) >= 2 and made["groups"], made
    return made


def running(pid: int) -> bool:
    """A live process (not a zombie waiting for its parent: a daemon's exit is reaped by whoever adopted it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def test_node_2_loads_from_the_shared_tier_what_node_1_computed(nodes):
    s = nodes.stack
    addresses = [n["address"] for n in s.endpoints["nodes"]]
    assert len(set(addresses)) == 2 and all(
        s.inst(i)["vllm"].startswith(f"http://{a}:") for i, a in enumerate(addresses)
    )
    assert s.endpoints["shared"]["kind"] == nodes.kind
    prompt = prompt_text(nodes.model, 1300, "typing.py")
    a, b = s.inst(0), s.inst(1)
    ha = vllm_external_hits(a["vllm"])
    out_a, _, _ = complete(a["vllm"], prompt)
    assert vllm_external_hits(a["vllm"]) == ha  # computed on node 1
    assert wait_for(lambda: kvtier_event(s, "store_ok", 0) >= CHUNKS, 60), s.log("lmcache0")
    written = metric(metrics(a["kvtier_metrics"]), "kvtier_bytes_total", op="write", tier=nodes.tier)
    assert written > 0  # node 1 stored into the shared tier itself (no local disk tier)
    clear_l1(s, 0)

    hb = vllm_external_hits(b["vllm"])
    out_b, _, _ = complete(b["vllm"], prompt)
    assert out_b == out_a
    assert vllm_external_hits(b["vllm"]) - hb >= HIT_TOKENS, s.log("lmcache1")
    assert kvtier_event(s, "shared_adopted", 1) >= CHUNKS  # keys node 2 learnt from the tier, stored by node 1
    assert kvtier_event(s, "hits", 1, tier=nodes.tier) >= CHUNKS
    assert metric(metrics(b["kvtier_metrics"]), "kvtier_bytes_total", op="read", tier=nodes.tier) > 0
    assert kvtier_event(s, "store_ok", 1) == 0 and kvtier_event(s, "load_errors", 1) == 0
    # the round-robin proxy in the root namespace alternates between the nodes
    assert {complete(s.vllm, prompt)[2].get("x-kvtier-backend") for _ in range(2)} == {"0", "1"}


def _fault(nodes) -> tuple[str, callable, callable]:
    """What to break in this kind of shared tier, and how to mend it: GlusterFS' storage link, one Redis master,
    radosgw (S3), the Mooncake master, or one of Ceph's three OSDs (CephFS: pools of size 3 and min_size 1 keep
    serving; memstore keeps nothing across a restart, so the OSD stays down and mending is the cluster's own)."""
    if nodes.kind == "mooncake":
        store = mooncake_store.MooncakeStore.load(nodes.state / "mooncake")
        return "the Mooncake master killed", store.kill_master, store.start_master
    if nodes.kind in ("s3", "cephfs"):
        import signal

        from deploy.ceph import CephCluster

        cluster = CephCluster.load(nodes.state / "ceph")
        if nodes.kind == "s3":
            return "radosgw killed", lambda: cluster.signal("rgw", signal.SIGKILL), cluster.start_rgw
        return "one OSD of three killed", lambda: cluster.signal("osd.2", signal.SIGKILL), lambda: None
    if nodes.kind == "glusterfs":
        state = dict(line.split("=", 1) for line in (nodes.state / "gluster" / "gluster.state").read_text().split())

        def link(updown: str) -> None:
            subprocess.run(["ip", "link", "set", state["veth_host"], updown], check=True)

        return "the storage node's link cut", lambda: link("down"), lambda: link("up")
    from deploy.redis_cluster import RedisClusterNodes

    cluster = RedisClusterNodes.load(nodes.state / "redis")
    victim = cluster.ports[0]

    def restart() -> None:
        cluster.start_node(victim)
        cluster.wait_ok()

    return "one Redis master killed", lambda: cluster.kill(victim), restart


def test_slurm_runs_a_task_on_each_node_beside_its_engines(nodes):
    if not nodes.stack.endpoints.get("slurm"):
        pytest.skip(f"Slurm runs on the {SLURM_KIND} stack only" + (f" ({slurm.missing()})" if slurm.missing() else ""))
    said = slurm.srun(nodes.state, "-N2", "-n2", *slurm.WHERE)
    assert said.returncode == 0, said.stderr
    lines = sorted(said.stdout.splitlines())
    for i, node in enumerate(nodes.stack.endpoints["nodes"]):  # task i in node i's namespace, where its vLLM listens
        assert lines[i].startswith(f"{i} node{i} ") and f" {node['address']}/24 " in lines[i], lines
    assert nodes.stack.endpoints["slurm"]["conf"] == str(nodes.state / "slurm" / "slurm.conf")


def test_prometheus_scrapes_every_node(nodes):
    prom = nodes.stack.endpoints.get("prometheus")
    if not prom:
        pytest.skip("prometheus not installed (deploy/install-system-deps.sh)")

    def targets() -> list[dict]:
        with urllib.request.urlopen(prom + "/api/v1/targets", timeout=10) as r:
            return json.load(r)["data"]["activeTargets"]

    assert wait_for(lambda: all(t["health"] == "up" for t in targets()), 60), targets()
    seen = {(t["labels"]["job"], t["labels"]["stack_instance"], t["scrapeUrl"]) for t in targets()}
    want = set()
    for i, node in enumerate(nodes.stack.endpoints["nodes"]):
        e = node["endpoints"]
        want |= {("vllm", str(i), e["vllm"] + "/metrics"), ("lmcache", str(i), e["lmcache_metrics"])}
        want.add(("kvtier", str(i), e["kvtier_metrics"]))
    assert seen == want
    # node 1 stored into the shared tier in the first test: Prometheus has its bytes, under its index, once a scrape
    # after those stores has landed (a target is "up" from its first scrape, which may have been before them: a CI
    # run read 0 once)
    q = urllib.parse.urlencode(
        {"query": f'sum by (stack_instance) (kvtier_bytes_total{{op="write",tier="{nodes.tier}"}})'}
    )

    def written() -> dict[str, float]:
        with urllib.request.urlopen(f"{prom}/api/v1/query?{q}", timeout=10) as r:
            return {x["metric"]["stack_instance"]: float(x["value"][1]) for x in json.load(r)["data"]["result"]}

    assert wait_for(lambda: written().get("0", 0.0) > 0, 30, 0.5), written()


def test_requests_keep_completing_while_the_shared_tier_is_broken_and_it_recovers(nodes):
    """Fresh prompts to both nodes while part of the shared tier is gone: each completes (a miss and a recompute, or
    a hit from what survives), none hangs past the request timeout, nothing differs from what the model computes;
    once mended, a prompt node 1 stores is again served to node 2 from the tier. Counts printed (pytest -s)."""
    s = nodes.stack
    what, brk, mend = _fault(nodes)
    errors0 = [kvtier_event(s, e, i) for i in (0, 1) for e in ("store_errors", "load_errors")]
    brk()
    try:
        took = []
        for k in range(6):
            prompt = prompt_text(nodes.model, 700, "pathlib.py")[k * 40 :]  # its own prefix: nothing to reuse
            t0 = time.monotonic()
            text, _, _ = complete(s.inst(k % 2)["vllm"], prompt, timeout_s=120)
            took.append(time.monotonic() - t0)
            assert text  # an answer, whatever the tier did
    finally:
        mend()
    errors = [kvtier_event(s, e, i) for i in (0, 1) for e in ("store_errors", "load_errors")]
    print(f"\n{nodes.kind}: {what}: 6 requests completed, slowest {max(took):.1f} s, "
          f"store/load errors counted (node 1, node 2): {[b - a for a, b in zip(errors0, errors)]}")  # fmt: skip

    # recovered: node 1 stores a new prompt into the tier again, node 2 loads it from there
    t_mended = time.monotonic()
    attempts = iter(range(1000))

    def served_to_node_2() -> bool:
        prompt = prompt_text(nodes.model, 1300, "inspect.py")[next(attempts) * 40 :]  # new each try: nothing stored
        a, b = s.inst(0), s.inst(1)
        stored = kvtier_event(s, "store_ok", 0)
        out_a, _, _ = complete(a["vllm"], prompt)
        if not wait_for(lambda: kvtier_event(s, "store_ok", 0) >= stored + CHUNKS, 30):
            return False  # the tier refused the stores still: try again
        clear_l1(s, 0)
        hb = vllm_external_hits(b["vllm"])
        out_b, _, _ = complete(b["vllm"], prompt)
        return out_b == out_a and vllm_external_hits(b["vllm"]) - hb >= HIT_TOKENS

    assert wait_for(served_to_node_2, 120, 1.0), s.log("lmcache1")
    print(f"{nodes.kind}: served from the tier to node 2 again {time.monotonic() - t_mended:.1f} s after mending")


def test_down_leaves_no_namespace_mount_or_process(nodes):
    down(nodes.state)
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert not nodes.made["netns"] & {line.split()[0] for line in netns.splitlines() if line}
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    assert not [name for name in nodes.made["links"] if f" {name}:" in links or f" {name}@" in links]
    assert str(nodes.state) not in Path("/proc/mounts").read_text()
    assert not [pgid for pgid in nodes.made["groups"] if alive(pgid)]
    assert not [pid for pid in nodes.made["pids"] if running(pid)]
    assert not (nodes.state / "nodes.state").exists() and not (nodes.state / "pids").exists()
    assert not (nodes.state / "slurm" / "munge").exists()  # Slurm's key and socket (with --slurm)
    again = subprocess.run(
        ["bash", str(RUN_STACK), "down", "--state-dir", str(nodes.state)], capture_output=True, text=True
    )
    assert again.returncode == 0 and "nothing to stop" in again.stdout  # idempotent
