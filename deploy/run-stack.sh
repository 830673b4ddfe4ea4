#!/usr/bin/env bash
# run-stack.sh	start/stop vLLM + LMCache + the kvtier backend, for people and the end-to-end tests alike.
#
# usage:
#   deploy/run-stack.sh up --device cpu|cuda --model DIR --vllm-port P --lmcache-port P2 --lmcache-http-port P3 \
#                          --kv-dir DIR [--shared-dir DIR] [--instances N] [--mode mp|inprocess] [options]
#   deploy/run-stack.sh up ... --nodes N [--shared glusterfs|redis-cluster] [--shared-bw RATE]   (as root)
#   deploy/run-stack.sh up ... --prometheus [--prometheus-port P5] [--prometheus-interval S]
#   deploy/run-stack.sh down [--state-dir DIR] [--grace S]
#   deploy/run-stack.sh restart-lmcache [--state-dir DIR] [--instance I] [--signal TERM|KILL]
#   deploy/run-stack.sh status [--state-dir DIR]
#
# options of `up` (defaults in brackets):
#   --metrics-port P4      kvtier Prometheus exporter of instance 0; instance i uses P4+i  [P3+10]
#   --disk-gb G            local disk tier per instance; 0 = none (puts go straight to the shared tier)  [4]
#   --shared-gb G          shared tier capacity accounted per instance  [4]
#   --io-mode direct|buffered   I/O of the local disk tier  [direct]; a --kv-dir on tmpfs (/dev/shm) makes it a DRAM
#                          tier: give buffered there (tmpfs refuses O_DIRECT)
#   --l2 kvtier|lmcache-fs|none L2 adapter of the LMCache MP server (mp only)  [kvtier]
#                          lmcache-fs: LMCache's own "fs" L2 adapter on --kv-dir, for comparisons (no kvtier, no
#                          kvtier metrics; --io-mode direct = its use_odirect, --disk-gb and --shared-dir unused)
#                          none: LMCache's memory (L1) only, what is evicted from it is gone (the DRAM-only
#                          configuration of a long-session experiment; --disk-gb and --shared-dir unused)
#   --l1-gb G              LMCache's own memory (L1) per instance in GiB (LMCache's unit), fractions allowed (0.004 = 4.3 MB)  [1]
#                          (the L2 size is --disk-gb, plus --shared-gb with --shared-dir)
#   --lmcache-arg ARG      extra argument for the LMCache MP server (repeatable), e.g. --eviction-trigger-watermark
#   --chunk-size N         LMCache chunk size in tokens  [256]
#   --served-name NAME     model name served by vLLM  [tiny]
#   --state-dir DIR        pids, logs, commands, endpoints.json  [$KVTIER_STACK_DIR or /tmp/kvtier-stack-$UID]
#   --timeout S            seconds to wait for every server to be healthy  [300]
#   --python PY            interpreter with vllm and lmcache  [$PYTHON or .venv/bin/python]
#                          (.venv-lmcache057/bin/python: the same stack on LMCache 0.5.7rc2, `make test` builds it)
#   --vllm-arg ARG         extra argument for vLLM (repeatable)
#   --gpus-per-instance K  cuda only: instance (or node) i sees GPUs i*K .. i*K+K-1 (CUDA_VISIBLE_DEVICES in the
#                          commands of its vLLM and its LMCache server, which must agree on device numbers); give vLLM
#                          --vllm-arg --tensor-parallel-size=K to use them all. Refused on cpu (vLLM uses no GPU)
# Nodes (root; see "Nodes" below):
#   --nodes N              N nodes, each a network namespace with its own LMCache + kvtier + vLLM (not with --instances)
#   --shared glusterfs|redis-cluster   the nodes' shared tier (--nodes only; not with --shared-dir)
#                          glusterfs: deploy/glusterfs.sh up --state-dir STATE/gluster --mounts N; node j's shared
#                          tier is its own FUSE client's mount (STATE/gluster/mnt, mnt2, ..) + /kv
#                          redis-cluster: python -m deploy.redis_cluster up --state-dir STATE/redis --bind BRIDGE, the
#                          nodes' L2 tier below the disk tier (kvtier's redis_url; --shared-gb is its capacity per node)
#   --shared-bw RATE       glusterfs only: tc tbf on the storage link, RATE each way (glusterfs.sh --bw: 200mbps)
# Prometheus (Debian's `prometheus`, 2.42 tested; see "Prometheus" below):
#   --prometheus           also start a Prometheus scraping every instance's (node's) vLLM, LMCache and kvtier
#   --prometheus-port P5   its HTTP API and UI, on 127.0.0.1  [P3+30]
#   --prometheus-interval S    seconds between scrapes and between rule evaluations  [5]
# vLLM's own settings (defaults: what the end-to-end tests were sized for):
#   --max-model-len N      longest prompt + answer in tokens  [2048]
#   --max-num-seqs N       requests vLLM runs at once  [8]
#   --prefix-caching on|off    vLLM's own prefix cache (off: every reuse comes through LMCache)  [off]
#   --block-size N         vLLM's KV block size in tokens  [vLLM's default]
#   --kv-space GIB         vLLM's KV cache: VLLM_CPU_KVCACHE_SPACE on cpu (whole GiB), --kv-cache-memory-bytes on
#                          cuda  [$VLLM_CPU_KVCACHE_SPACE or 1 on cpu; vLLM's default on cuda]
#
# What runs (every server on 127.0.0.1, each in its own process group):
#   mp:        per instance an LMCache MP server (python -m lmcache.v1.multiprocess.http_server) with the kvtier L2
#              adapter (kvconnector.lmcache.l2_adapter.KvtierL2Adapter; kvtier's metrics are served from that
#              process), and a vLLM server with LMCacheMPConnector. Works with vLLM on CPU and GPU.
#   inprocess: per instance a vLLM server with LMCacheConnectorV1 and the kvtier storage plugin (config file in the
#              state dir). For GPU deployments: on a CPU-only vLLM, LMCache 0.5.6 has no CPU connector and vLLM runs
#              degraded (recomputes).
#   With --instances N > 1, instance i's vLLM listens on P+1+i, LMCache on P2+i / P3+i, and a round-robin proxy
#   (deploy/rr_proxy.py) on P. Instance i's local disk tier is --kv-dir/inst<i>; --shared-dir is shared by all.
#   Tiers of N instances (endpoints.json "tiers"): private (each its own disk tier, no --shared-dir: the baseline a
#   shared tier is judged against), private+shared (--shared-dir too), shared (--shared-dir and --disk-gb 0).
#
# Nodes (--nodes N, root): node i is a network namespace kvn-<tag>-<i> (<tag> from a hash of the state dir) joined to
#   a bridge kvn<tag>b in the root namespace by a veth pair; the bridge is 10.253.X.1/24 and node i is 10.253.X.(10+i)
#   (X from the same hash; a /24 that an address or route here already uses is skipped; glusterfs.sh uses 10.254/16).
#   Inside node i run its LMCache MP server (ZMQ on the node's own loopback, HTTP on the node's address), kvtier's
#   adapter (metrics on the node's address) and vLLM on the node's address, each on the ports given (every node the
#   same ports: each has its own address), its disk tier in --kv-dir/node<i>. The round-robin proxy runs in the root
#   namespace on 127.0.0.1:--vllm-port in front of the nodes' vLLMs; clients and tests reach each node's vLLM,
#   LMCache HTTP and kvtier metrics at its address (endpoints.json "instances", one per node, and "nodes").
#   The Redis Cluster runs in the root namespace bound to (and announcing) the bridge address, which every node
#   reaches; GlusterFS serves from its own namespace and is mounted in the root namespace, mounts the nodes see.
#   endpoints.json "nodes": per node its namespace, address, shared_dir (GlusterFS) and endpoints; "shared": the
#   kind, its state dir and its mounts (glusterfs) or URL (redis-cluster). `restart-lmcache --instance I` restarts
#   node I's LMCache server inside its namespace.
#   Everything made is recorded in STATE/nodes.state the moment it exists; `down` removes exactly that (processes,
#   the shared tier, namespaces, bridge), also after a failed `up`, and is idempotent.
#
# Prometheus (--prometheus): a `prometheus` process on 127.0.0.1:P5 (in the root namespace: it reaches the nodes at
#   their addresses) with STATE/prometheus/prometheus.yml, written by `python -m deploy.prometheus_config` from
#   endpoints.json: jobs vllm, lmcache (mp only) and kvtier (--l2 kvtier only), one target per instance or node,
#   each labelled stack_instance=<index>; the recording rules of deploy/prometheus/kvtier-rules.yml (hit rate per
#   tier, bytes and operations per tier, latency quantiles per operation); its data in STATE/prometheus/data, emptied
#   by each `up` (a stopped Prometheus leaves its last samples current for 5 minutes: a restarted stack's queries
#   would add up the old targets' series). endpoints.json "prometheus" and `status` give its URL; `down`
#   stops it with the rest. deploy/grafana/kvtier-dashboard.json is a Grafana dashboard of the rules for a Grafana
#   that has this Prometheus as a data source. `kvtier replay --metrics-url prometheus+http://127.0.0.1:P5` reads the
#   run's server-side figures from it.
#
# example:
#   $ deploy/make_tiny_model.py /tmp/tiny && deploy/run-stack.sh up --device cpu --model /tmp/tiny --vllm-port 8000 \
#       --lmcache-port 5555 --lmcache-http-port 8090 --kv-dir /tmp/kvtier-cache
#   vllm     http://127.0.0.1:8000/v1
#   lmcache  http://127.0.0.1:8090  (MP server 127.0.0.1:5555)
#   kvtier   http://127.0.0.1:8100/metrics
#   state    /tmp/kvtier-stack-0  (pids, logs, endpoints.json; stop with: deploy/run-stack.sh down)
#   $ deploy/run-stack.sh up --device cpu --model /tmp/tiny --vllm-port 8000 --lmcache-port 5555 \
#       --lmcache-http-port 8090 --kv-dir /tmp/kvtier-cache --nodes 2 --shared glusterfs --disk-gb 0
#   $ deploy/run-stack.sh up --device cpu --model /tmp/tiny --vllm-port 8000 --lmcache-port 5555 \
#       --lmcache-http-port 8090 --kv-dir /tmp/kvtier-cache --prometheus
#   ...
#   prometheus http://127.0.0.1:8120  (STATE/prometheus/prometheus.yml, every 5 s)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
STATE=${KVTIER_STACK_DIR:-/tmp/kvtier-stack-$(id -u)}
PY=${PYTHON:-}
[[ -z $PY && -x $ROOT/.venv/bin/python ]] && PY=$ROOT/.venv/bin/python
PY=${PY:-python3}

die() { echo "run-stack.sh: $*" >&2; exit 2; }

# ---- process bookkeeping -------------------------------------------------------------------------------------------
# start NAME CMD...: run CMD in a new session (its own process group), log to STATE/NAME.log, remember pid + command.
start() {
    local name=$1; shift
    printf '%q ' "$@" > "$STATE/$name.cmd"
    setsid "$@" >> "$STATE/$name.log" 2>&1 < /dev/null &
    echo "$name $!" >> "$STATE/pids"
}

group_alive() { kill -0 -- "-$1" 2>/dev/null; }

stop_groups() {  # stop_groups GRACE_S SIGNAL PID...: signal each group, wait, then SIGKILL what is left
    local grace=$1 sig=$2; shift 2
    local pid
    for pid in "$@"; do kill "-$sig" -- "-$pid" 2>/dev/null || true; done
    local deadline=$((SECONDS + grace))
    for pid in "$@"; do
        while group_alive "$pid" && ((SECONDS < deadline)); do sleep 0.2; done
        if group_alive "$pid"; then kill -KILL -- "-$pid" 2>/dev/null || true; fi
    done
    for pid in "$@"; do
        local n=0
        while group_alive "$pid" && ((n < 50)); do sleep 0.1; n=$((n + 1)); done
    done
}

pid_of() { awk -v n="$1" '$1 == n {p = $2} END {print p}' "$STATE/pids" 2>/dev/null; }

wait_http() {  # wait_http NAME URL DEADLINE: until URL answers 200, failing early if NAME's process group is gone
    local name=$1 url=$2 deadline=$3 pid
    pid=$(pid_of "$name")
    while ! "$PY" - "$url" <<'EOF' 2>/dev/null
import sys, urllib.request
sys.exit(0 if urllib.request.urlopen(sys.argv[1], timeout=2).status == 200 else 1)
EOF
    do
        if [[ -n $pid ]] && ! group_alive "$pid"; then
            echo "run-stack.sh: $name exited during start-up; last lines of $STATE/$name.log:" >&2
            tail -n 25 "$STATE/$name.log" >&2
            return 1
        fi
        if ((SECONDS > deadline)); then
            echo "run-stack.sh: $name not healthy at $url after the timeout; log: $STATE/$name.log" >&2
            return 1
        fi
        sleep 0.5
    done
}

# ---- nodes: network namespaces on a bridge ------------------------------------------------------------------------
# STATE/nodes.state: one KEY=VALUE line per thing made (bridge, ns, shared, ...), appended the moment it exists.
nrecord() { echo "$1=$2" >> "$STATE/nodes.state"; }
nrecorded() { [[ -f $STATE/nodes.state ]] && sed -n "s/^$1=//p" "$STATE/nodes.state" || true; }

free_node_net() {  # a 10.253.X (/24) that no address or route here falls in; X from a hash of the state dir
    local h x i used
    h=$(printf '%s' "$STATE" | cksum | cut -d' ' -f1)
    used=$(ip -4 -o addr show; ip -4 route show table all)
    for ((i = 0; i < 254; i++)); do
        x=$(( (h + i * 7) % 254 + 1 ))
        grep -qE "(^|[^0-9])10\.253\.$x\.|10\.253\.0\.0/16|10\.0\.0\.0/8" <<< "$used" || { echo "10.253.$x"; return; }
    done
    die "no free 10.253.x.0/24 found"
}

nodes_net_up() {  # nodes_net_up N: the bridge and N namespaces, each recorded the moment it exists
    local n=$1 tag net br i ns vh vn
    tag=$(printf '%s' "$STATE" | sha1sum | cut -c1-8)
    net=$(free_node_net)
    br=kvn${tag}b
    ip link add "$br" type bridge; nrecord bridge "$br"
    ip addr add "$net.1/24" dev "$br"
    ip link set "$br" up
    nrecord host_addr "$net.1"
    for ((i = 0; i < n; i++)); do
        ns=kvn-$tag-$i vh=kvn$tag${i}h vn=kvn$tag${i}n
        ip netns add "$ns"; nrecord ns "$ns"
        ip link add "$vh" type veth peer name "$vn"; nrecord veth "$vh"
        ip link set "$vn" netns "$ns"
        ip link set "$vh" master "$br"
        ip link set "$vh" up
        ip netns exec "$ns" ip addr add "$net.$((10 + i))/24" dev "$vn"
        ip netns exec "$ns" ip link set "$vn" up
        ip netns exec "$ns" ip link set lo up  # LMCache's ZMQ socket and vLLM's own helpers use the node's loopback
        # a default route (the root namespace forwards nothing): vLLM asks the kernel for its outgoing address
        ip netns exec "$ns" ip route add default via "$net.1"
        nrecord "addr$i" "$net.$((10 + i))"
    done
}

gluster_mount() { if (($1 == 0)); then echo "$STATE/gluster/mnt"; else echo "$STATE/gluster/mnt$(($1 + 1))"; fi; }

nodes_down() {  # processes left in our namespaces, the shared tier, the namespaces, the bridge: what nodes.state names
    [[ -f $STATE/nodes.state ]] || return 0
    local ns pid kind i vh br
    for ns in $(nrecorded ns); do
        ip netns pids "$ns" > /dev/null 2>&1 || continue
        for pid in $(ip netns pids "$ns"); do kill "$pid" 2>/dev/null || true; done  # every process in it is ours
        for ((i = 0; i < 50; i++)); do [[ -z $(ip netns pids "$ns") ]] && break; sleep 0.2; done
        for pid in $(ip netns pids "$ns"); do kill -9 "$pid" 2>/dev/null || true; done
    done
    for kind in $(nrecorded shared); do
        case $kind in
            glusterfs) bash "$ROOT/deploy/glusterfs.sh" down --state-dir "$STATE/gluster" > /dev/null || true ;;
            redis-cluster) PYTHONPATH=$ROOT "$PY" -m deploy.redis_cluster down --state-dir "$STATE/redis" || true ;;
        esac
    done
    for ns in $(nrecorded ns); do ip netns del "$ns" 2>/dev/null || true; done
    for vh in $(nrecorded veth); do ip link del "$vh" 2>/dev/null || true; done  # gone with its peer's namespace
    for br in $(nrecorded bridge); do ip link del "$br" 2>/dev/null || true; done
    rm -f "$STATE/nodes.state"
    echo "nodes removed"
}

# ---- commands ----------------------------------------------------------------------------------------------------
cmd_down() {
    local grace=15
    while (($#)); do
        case $1 in
            --state-dir) STATE=$2; shift 2 ;;
            --grace) grace=$2; shift 2 ;;
            *) die "down: unknown option $1" ;;
        esac
    done
    if [[ ! -f $STATE/pids && ! -f $STATE/nodes.state ]]; then echo "nothing to stop (no $STATE/pids)"; return 0; fi
    if [[ -f $STATE/pids ]]; then
        # shellcheck disable=SC2046
        stop_groups "$grace" TERM $(awk '{print $2}' "$STATE/pids" | tac)
        rm -f "$STATE/pids"
    fi
    nodes_down
    echo "stopped; logs kept in $STATE"
}

cmd_status() {
    while (($#)); do
        case $1 in
            --state-dir) STATE=$2; shift 2 ;;
            *) die "status: unknown option $1" ;;
        esac
    done
    [[ -f $STATE/pids ]] || { echo "not running"; return 1; }
    local name pid
    while read -r name pid; do
        if group_alive "$pid"; then echo "$name $pid running"; else echo "$name $pid gone"; fi
    done < "$STATE/pids"
    [[ -f $STATE/endpoints.json ]] || return 0
    "$PY" - "$STATE/endpoints.json" <<'EOF'
import json, sys
ep = json.load(open(sys.argv[1]))
for i, node in enumerate(ep.get("nodes", [])):
    inst = ep["instances"][i]
    print(f"node{i}  {node['netns']}  {node['address']}  vllm {inst['vllm']}  lmcache {inst['lmcache_http']}  "
          f"kvtier {inst['kvtier_metrics']}")
if ep.get("prometheus"):
    print(f"prometheus  {ep['prometheus']}  (config {ep['state_dir']}/prometheus/prometheus.yml)")
shared = ep.get("shared")
if shared:
    where = shared.get("url") or ", ".join(shared.get("mounts", []))
    print(f"shared  {shared['kind']}  {where}" + (f"  ({shared['bw']} each way)" if shared.get("bw") else ""))
EOF
    cat "$STATE/endpoints.json"
}

cmd_restart_lmcache() {  # stop one LMCache server (TERM, or KILL for a crash test) and start it again, same command
    local inst=0 sig=TERM timeout=300
    while (($#)); do
        case $1 in
            --state-dir) STATE=$2; shift 2 ;;
            --instance) inst=$2; shift 2 ;;
            --signal) sig=$2; shift 2 ;;
            --timeout) timeout=$2; shift 2 ;;
            *) die "restart-lmcache: unknown option $1" ;;
        esac
    done
    local name=lmcache$inst pid
    pid=$(pid_of "$name")
    [[ -n $pid ]] || die "no $name in $STATE/pids"
    stop_groups 15 "$sig" "$pid"
    sed -i "/^$name /d" "$STATE/pids"
    echo "--- restart ($sig) ---" >> "$STATE/$name.log"
    eval "start $name $(cat "$STATE/$name.cmd")"
    local url
    url=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["instances"][int(sys.argv[2])]["lmcache_http"])' \
        "$STATE/endpoints.json" "$inst")
    wait_http "$name" "$url/healthcheck" $((SECONDS + timeout))
    echo "$name restarted"
}

cmd_up() {
    local device="" model="" vport="" lport="" hport="" kvdir="" shared="" n=1 mode=mp mport="" disk_gb=4 shared_gb=4
    local io_mode=direct l1_gb=1 chunk=256 name=tiny timeout=300 l2kind=kvtier
    local nodes="" shared_kind="" shared_bw="" gpk="" prom="" prom_port="" prom_interval=""
    local -a vextra=() lextra=()
    # vLLM's settings (the long-session experiment sizes them)
    local max_len=2048 max_seqs=8 prefix_caching=off vblock="" kv_space=""
    while (($#)); do
        case $1 in
            --device) device=$2; shift 2 ;;
            --model) model=$2; shift 2 ;;
            --vllm-port) vport=$2; shift 2 ;;
            --lmcache-port) lport=$2; shift 2 ;;
            --lmcache-http-port) hport=$2; shift 2 ;;
            --kv-dir) kvdir=$2; shift 2 ;;
            --shared-dir) shared=$2; shift 2 ;;
            --instances) n=$2; shift 2 ;;
            --mode) mode=$2; shift 2 ;;
            --metrics-port) mport=$2; shift 2 ;;
            --disk-gb) disk_gb=$2; shift 2 ;;
            --shared-gb) shared_gb=$2; shift 2 ;;
            --io-mode) io_mode=$2; shift 2 ;;
            --l2) l2kind=$2; shift 2 ;;
            --l1-gb) l1_gb=$2; shift 2 ;;
            --chunk-size) chunk=$2; shift 2 ;;
            --served-name) name=$2; shift 2 ;;
            --state-dir) STATE=$2; shift 2 ;;
            --timeout) timeout=$2; shift 2 ;;
            --python) PY=$2; shift 2 ;;
            --vllm-arg) vextra+=("$2"); shift 2 ;;
            --lmcache-arg) lextra+=("$2"); shift 2 ;;
            --max-model-len) max_len=$2; shift 2 ;;
            --max-num-seqs) max_seqs=$2; shift 2 ;;
            --prefix-caching) prefix_caching=$2; shift 2 ;;
            --block-size) vblock=$2; shift 2 ;;
            --kv-space) kv_space=$2; shift 2 ;;
            --nodes) nodes=$2; shift 2 ;;
            --shared) shared_kind=$2; shift 2 ;;
            --shared-bw) shared_bw=$2; shift 2 ;;
            --gpus-per-instance) gpk=$2; shift 2 ;;
            --prometheus) prom=1; shift ;;
            --prometheus-port) prom_port=$2; shift 2 ;;
            --prometheus-interval) prom_interval=$2; shift 2 ;;
            *) die "up: unknown option $1 (see the header of $0)" ;;
        esac
    done
    [[ $device == cpu || $device == cuda ]] || die "--device cpu|cuda is required"
    [[ -n $model && -d $model ]] || die "--model DIR is required and must exist (deploy/make_tiny_model.py DIR)"
    [[ -n $vport && -n $lport && -n $hport ]] || die "--vllm-port, --lmcache-port and --lmcache-http-port are required"
    [[ -n $kvdir ]] || die "--kv-dir DIR is required"
    [[ $mode == mp || $mode == inprocess ]] || die "--mode is mp or inprocess"
    [[ $l2kind == kvtier || $l2kind == lmcache-fs || $l2kind == none ]] || die "--l2 is kvtier, lmcache-fs or none"
    [[ $l2kind == kvtier || ($mode == mp && -z $shared) ]] || die "--l2 $l2kind needs --mode mp and no --shared-dir"
    [[ $max_len =~ ^[1-9][0-9]*$ ]] || die "--max-model-len must be a positive integer"
    [[ $max_seqs =~ ^[1-9][0-9]*$ ]] || die "--max-num-seqs must be a positive integer"
    [[ $prefix_caching == on || $prefix_caching == off ]] || die "--prefix-caching is on or off"
    [[ -z $vblock || $vblock =~ ^[1-9][0-9]*$ ]] || die "--block-size must be a positive integer"
    [[ $l1_gb =~ ^[0-9]*\.?[0-9]+$ ]] && "$PY" -c 'import sys; sys.exit(float(sys.argv[1]) <= 0)' "$l1_gb" \
        || die "--l1-gb must be a number of GB > 0"
    if [[ -n $kv_space ]]; then
        if [[ $device == cpu ]]; then
            [[ $kv_space =~ ^[1-9][0-9]*$ ]] || die "--kv-space on cpu is whole GiB (VLLM_CPU_KVCACHE_SPACE), got $kv_space"
        else
            [[ $kv_space =~ ^[0-9]*\.?[0-9]+$ ]] || die "--kv-space must be a number of GiB"
        fi
    fi
    [[ $io_mode == direct || $io_mode == buffered ]] || die "--io-mode is direct or buffered"
    [[ $n =~ ^[1-9][0-9]*$ ]] || die "--instances must be a positive integer"
    # ---- nodes, their shared tier, GPUs ----
    if [[ -n $nodes ]]; then
        [[ $nodes =~ ^[1-9][0-9]*$ ]] && ((nodes <= 200)) || die "--nodes must be a positive integer (at most 200)"
        ((n == 1)) || die "--nodes and --instances are exclusive (a node is an instance in its own network namespace)"
        [[ $mode == mp ]] || die "--nodes needs --mode mp"
        [[ -z $shared ]] || die "--nodes takes --shared glusterfs|redis-cluster, not --shared-dir"
    fi
    if [[ -n $shared_kind ]]; then
        [[ $shared_kind == glusterfs || $shared_kind == redis-cluster ]] || die "--shared is glusterfs or redis-cluster"
        [[ -n $nodes ]] || die "--shared $shared_kind needs --nodes N (on one host: --shared-dir DIR)"
        [[ $l2kind == kvtier ]] || die "--shared needs --l2 kvtier"
    fi
    [[ -z $shared_bw || $shared_kind == glusterfs ]] || die "--shared-bw needs --shared glusterfs"
    if [[ -n $gpk ]]; then
        [[ $gpk =~ ^[1-9][0-9]*$ ]] || die "--gpus-per-instance must be a positive integer"
        [[ $device == cuda ]] || die "--gpus-per-instance needs --device cuda (vLLM on cpu uses no GPU)"
        local want=$(( ${nodes:-$n} * gpk )) have
        if have=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU'); then
            ((want <= have)) || die "--gpus-per-instance $gpk: ${nodes:-$n} instance(s) need $want GPUs, this host has $have"
        fi
    fi
    if [[ -n $nodes ]]; then
        [[ $(id -u) -eq 0 ]] || die "--nodes needs root (network namespaces, a bridge)"
        command -v ip > /dev/null || die "--nodes needs ip (iproute2)"
        if [[ $shared_kind == glusterfs ]]; then
            command -v glusterd > /dev/null || die "--shared glusterfs needs glusterd (apt-get install glusterfs-server glusterfs-client)"
        elif [[ $shared_kind == redis-cluster ]]; then
            command -v redis-server > /dev/null || die "--shared redis-cluster needs redis-server (apt-get install redis-server)"
        fi
    fi
    if [[ -n $prom ]]; then
        prom_interval=${prom_interval:-5}
        command -v prometheus > /dev/null || die "--prometheus needs prometheus (apt-get install prometheus)"
        [[ -z $prom_port || $prom_port =~ ^[1-9][0-9]*$ ]] || die "--prometheus-port must be a port number"
        [[ $prom_interval =~ ^[0-9]*\.?[0-9]+$ ]] && "$PY" -c 'import sys; sys.exit(float(sys.argv[1]) < 0.1)' \
            "$prom_interval" || die "--prometheus-interval must be a number of seconds >= 0.1"
    else
        [[ -z $prom_port && -z $prom_interval ]] || die "--prometheus-port and --prometheus-interval need --prometheus"
    fi
    # ---- instance tiers (private / private+shared / shared) ----
    local tiers=private
    [[ -n $shared || -n $shared_kind ]] && tiers=private+shared
    if [[ $l2kind == kvtier && $disk_gb =~ ^0*(\.0*)?$ ]]; then
        [[ -n $shared || -n $shared_kind ]] || die "--disk-gb 0 leaves kvtier no tier: give --shared-dir, --shared or a size"
        tiers=shared
    fi
    # ---- end instance tiers ----
    mport=${mport:-$((hport + 10))}
    prom_port=${prom_port:-$((hport + 30))}
    mkdir -p "$STATE"
    chmod 700 "$STATE"
    STATE=$(cd "$STATE" && pwd)  # the nodes' processes and the shared tier's mounts need absolute paths
    if [[ -f $STATE/pids ]]; then
        local alive=0 p
        for p in $(awk '{print $2}' "$STATE/pids"); do group_alive "$p" && alive=1; done
        ((alive == 0)) || die "a stack is already running from $STATE (deploy/run-stack.sh down --state-dir $STATE)"
        rm -f "$STATE/pids"
    fi
    nodes_down > /dev/null  # what a run killed before its `down` left (nothing of it runs: its pids are all gone)
    rm -f "$STATE"/*.log "$STATE"/*.cmd "$STATE/endpoints.json"
    # Any failure from here on (a failed command, or die) stops and removes what was started and made.
    trap 'rc=$?; if ((rc != 0)); then echo "run-stack.sh: start-up failed, stopping what was started" >&2
          cmd_down --state-dir "$STATE" --grace 5 >&2; fi' EXIT

    local -a venv=(env "HF_HUB_OFFLINE=1" "TRANSFORMERS_OFFLINE=1" "VLLM_NO_USAGE_STATS=1" "DO_NOT_TRACK=1"
                   "PYTHONHASHSEED=0" "LMCACHE_TRACK_USAGE=false" "PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}")
    [[ $device == cpu ]] && venv+=("VLLM_CPU_KVCACHE_SPACE=${kv_space:-${VLLM_CPU_KVCACHE_SPACE:-1}}")
    local -a vsettings=(--max-model-len "$max_len" --max-num-seqs "$max_seqs")
    if [[ $prefix_caching == on ]]; then vsettings+=(--enable-prefix-caching); else vsettings+=(--no-enable-prefix-caching); fi
    [[ -n $vblock ]] && vsettings+=(--block-size "$vblock")
    if [[ -n $kv_space && $device == cuda ]]; then
        vsettings+=(--kv-cache-memory-bytes "$("$PY" -c 'import sys; print(int(float(sys.argv[1]) * 2**30))' "$kv_space")")
    fi
    local deadline=$((SECONDS + timeout)) i count=$n
    [[ -n $nodes ]] && count=$nodes
    # ---- nodes: namespaces and their shared tier ----
    local redis_url="" shared_json=null
    local -a node_json=()
    if [[ -n $nodes ]]; then
        nodes_net_up "$nodes"
        if [[ $shared_kind == glusterfs ]]; then
            local -a bw=()
            [[ -n $shared_bw ]] && bw=(--bw "$shared_bw")
            nrecord shared glusterfs
            bash "$ROOT/deploy/glusterfs.sh" up --state-dir "$STATE/gluster" --mounts "$nodes" ${bw[@]+"${bw[@]}"}
            mkdir -p "$STATE/gluster/mnt/kv"
            shared_json=$(printf '{"kind": "glusterfs", "state_dir": "%s", "bw": "%s", "mounts": [' "$STATE/gluster" "$shared_bw")
            for ((i = 0; i < nodes; i++)); do
                ((i > 0)) && shared_json+=", "
                shared_json+="\"$(gluster_mount "$i")\""
            done
            shared_json+="]}"
        elif [[ $shared_kind == redis-cluster ]]; then
            nrecord shared redis-cluster
            redis_url=$(PYTHONPATH=$ROOT "$PY" -m deploy.redis_cluster up --state-dir "$STATE/redis" \
                --bind "$(nrecorded host_addr)" 2>> "$STATE/redis.log")
            shared_json=$(printf '{"kind": "redis-cluster", "state_dir": "%s", "url": "%s"}' "$STATE/redis" "$redis_url")
        fi
    fi
    # ---- end nodes ----
    local -a insts=() vurls=() lurls=() murls=() lports=()
    for ((i = 0; i < count; i++)); do
        local dir=$kvdir vp=$vport lp=$((lport + i)) hp=$((hport + i)) mp=$((mport + i)) host=127.0.0.1 sdir=$shared
        local nsi=""
        local -a inns=() nenv=("${venv[@]}")
        if [[ -n $nodes ]]; then
            # every node the same ports, on its own address; LMCache's ZMQ socket on the node's own loopback
            dir=$kvdir/node$i lp=$lport hp=$hport mp=$mport host=$(nrecorded "addr$i")
            nsi=$(nrecorded ns | sed -n "$((i + 1))p")
            inns=(ip netns exec "$nsi")
            [[ $shared_kind == glusterfs ]] && sdir=$(gluster_mount "$i")/kv
        elif ((n > 1)); then
            dir=$kvdir/inst$i vp=$((vport + 1 + i))
        fi
        [[ -n $gpk ]] && nenv+=("CUDA_VISIBLE_DEVICES=$(seq -s, $((i * gpk)) $((i * gpk + gpk - 1)))")
        mkdir -p -m 700 "$kvdir" "$dir"
        local params
        params=$("$PY" - "$dir" "$disk_gb" "$io_mode" "$sdir" "$shared_gb" "$mp" "$redis_url" "$host" <<'EOF'
import json, sys
d, disk_gb, io_mode, shared, shared_gb, mport, redis_url, host = sys.argv[1:]
p = {"disk_dir": d, "disk_capacity_gb": float(disk_gb), "io_mode": io_mode, "metrics_port": int(mport),
     "metrics_host": host, "snapshot_path": d + "/kvtier-stats.json"}
if shared:
    p.update(shared_dir=shared, shared_capacity_gb=float(shared_gb))
if redis_url:
    p.update(redis_url=redis_url, redis_capacity_gb=float(shared_gb))
print(json.dumps(p))
EOF
)
        local kvcfg
        if [[ $mode == mp ]]; then
            local l2
            local -a l2arg=()
            if [[ $l2kind == kvtier ]]; then
                # "shared": LMCache tags the adapter's cache events with it; kvtier's tiers say the same (a shared dir)
                l2=$("$PY" -c 'import json,sys; p = json.loads(sys.argv[1]); print(json.dumps({"type": "plugin",
                     "module_path": "kvconnector.lmcache.l2_adapter", "class_name": "KvtierL2Adapter",
                     "shared": "shared_dir" in p or "redis_url" in p, "adapter_params": p}))' "$params")
            elif [[ $l2kind == lmcache-fs ]]; then
                l2=$("$PY" -c 'import json,sys; print(json.dumps({"type": "fs", "base_path": sys.argv[1],
                     "use_odirect": sys.argv[2] == "direct"}))' "$dir" "$io_mode")
            fi
            [[ $l2kind == none ]] || l2arg=(--l2-adapter "$l2")  # none: no adapter, LMCache's L1 is all there is
            start "lmcache$i" ${inns[@]+"${inns[@]}"} "${nenv[@]}" "$PY" -m lmcache.v1.multiprocess.http_server \
                --host 127.0.0.1 --port "$lp" --http-host "$host" --http-port "$hp" \
                --prometheus-port $((hp + 20)) --chunk-size "$chunk" --l1-size-gb "$l1_gb" \
                --eviction-policy LRU --supported-transfer-mode auto ${l2arg[@]+"${l2arg[@]}"} \
                ${lextra[@]+"${lextra[@]}"}
            kvcfg=$("$PY" -c 'import json,sys; print(json.dumps({"kv_connector": "LMCacheMPConnector",
                "kv_connector_module_path": "lmcache.integration.vllm.lmcache_mp_connector", "kv_role": "kv_both",
                "kv_connector_extra_config": {"lmcache.mp.host": "tcp://127.0.0.1", "lmcache.mp.port": int(sys.argv[1])}}))' \
                "$lp")
        else
            "$PY" - "$STATE/lmcache-inst$i.yaml" "$chunk" "$l1_gb" "$params" <<'EOF'
import json, sys
path, chunk, l1, params = sys.argv[1:]
lines = [f"chunk_size: {int(chunk)}", "local_cpu: true", f"max_local_cpu_size: {float(l1)}",
         'storage_plugins: ["kvtier"]', "extra_config:",
         "  storage_plugin.kvtier.module_path: kvconnector.lmcache.storage_plugin",
         "  storage_plugin.kvtier.class_name: KvtierStoragePlugin"]
lines += [f"  kvtier.{k}: {json.dumps(v)}" for k, v in json.loads(params).items()]
open(path, "w").write("\n".join(lines) + "\n")
EOF
            kvcfg='{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}'
            [[ $device == cpu ]] && echo "run-stack.sh: note: in-process LMCache has no CPU connector in 0.5.6; vLLM will recompute" >&2
        fi
        local -a ienv=("${nenv[@]}")
        [[ $mode == inprocess ]] && ienv+=("LMCACHE_CONFIG_FILE=$STATE/lmcache-inst$i.yaml")
        start "vllm$i" ${inns[@]+"${inns[@]}"} "${ienv[@]}" "$PY" -m vllm.entrypoints.openai.api_server --model "$model" \
            --served-model-name "$name" --dtype bfloat16 "${vsettings[@]}" --enforce-eager \
            --host "$host" --port "$vp" --kv-transfer-config "$kvcfg" \
            ${vextra[@]+"${vextra[@]}"}
        vurls+=("http://$host:$vp") lurls+=("http://$host:$hp") murls+=("http://$host:$mp/metrics") lports+=("$lp")
        insts+=("$(printf '{"vllm": "%s", "lmcache_port": %s, "lmcache_http": "%s", "kvtier_metrics": "%s", "lmcache_metrics": "%s/metrics", "kv_dir": "%s"}' \
            "${vurls[i]}" "$lp" "${lurls[i]}" "${murls[i]}" "${lurls[i]}" "$dir")")
        if [[ -n $nodes ]]; then
            node_json+=("$(printf '{"netns": "%s", "address": "%s", "shared_dir": "%s", "endpoints": %s}' \
                "$nsi" "$host" "$sdir" "${insts[i]}")")
        fi
    done
    if [[ -n $nodes ]] || ((n > 1)); then
        local -a backs=()
        for ((i = 0; i < count; i++)); do backs+=(--backend "${vurls[i]}"); done
        start proxy "$PY" "$ROOT/deploy/rr_proxy.py" --host 127.0.0.1 --port "$vport" "${backs[@]}"
    fi
    local joined nodes_joined=""
    joined=$(IFS=,; echo "${insts[*]}")
    [[ -n $nodes ]] && nodes_joined=$(IFS=,; echo "${node_json[*]}")
    local prom_json=null
    [[ -n $prom ]] && prom_json="\"http://127.0.0.1:$prom_port\""
    printf '{"mode": "%s", "l2": "%s", "device": "%s", "vllm": "http://127.0.0.1:%s", "model": "%s", "shared_dir": "%s", "tiers": "%s", "state_dir": "%s", "instances": [%s], "nodes": [%s], "shared": %s, "prometheus": %s}\n' \
        "$mode" "$l2kind" "$device" "$vport" "$name" "$shared" "$tiers" "$STATE" "$joined" "$nodes_joined" "$shared_json" \
        "$prom_json" > "$STATE/endpoints.json"
    if [[ -n $prom ]]; then
        # started last, so `down` (which stops in reverse order) stops it first: no scrape errors of servers stopping
        rm -rf "$STATE/prometheus/data"
        mkdir -p -m 700 "$STATE/prometheus/data"
        PYTHONPATH=$ROOT "$PY" -m deploy.prometheus_config "$STATE/endpoints.json" --interval "$prom_interval" \
            > "$STATE/prometheus/prometheus.yml"
        start prometheus prometheus --config.file "$STATE/prometheus/prometheus.yml" \
            --storage.tsdb.path "$STATE/prometheus/data" --web.listen-address "127.0.0.1:$prom_port"
    fi

    for ((i = 0; i < count; i++)); do
        if [[ $mode == mp ]]; then
            wait_http "lmcache$i" "${lurls[i]}/healthcheck" "$deadline"
            if [[ $l2kind == kvtier ]]; then
                wait_http "lmcache$i" "${murls[i]}" "$deadline"
            fi
        fi
        wait_http "vllm$i" "${vurls[i]}/health" "$deadline"
    done
    if [[ -n $nodes ]] || ((n > 1)); then wait_http proxy "http://127.0.0.1:$vport/health" "$deadline"; fi
    [[ -z $prom ]] || wait_http prometheus "http://127.0.0.1:$prom_port/-/ready" "$deadline"
    trap - EXIT
    echo "vllm     http://127.0.0.1:$vport/v1"
    for ((i = 0; i < count; i++)); do
        [[ -n $nodes ]] && echo "node$i    $(nrecorded ns | sed -n "$((i + 1))p") $(nrecorded "addr$i")"
        [[ $mode == mp ]] && echo "lmcache  ${lurls[i]}  (MP server 127.0.0.1:${lports[i]})"
        if [[ $l2kind == kvtier ]]; then echo "kvtier   ${murls[i]}"
        elif [[ $l2kind == none ]]; then echo "l2       none (LMCache L1 only, $l1_gb GB)"
        else echo "l2       LMCache fs adapter on $kvdir (use_odirect: $([[ $io_mode == direct ]] && echo true || echo false))"; fi
    done
    [[ -n $redis_url ]] && echo "shared   $redis_url"
    [[ $shared_kind == glusterfs ]] && echo "shared   GlusterFS $STATE/gluster/mnt* (one FUSE client per node)${shared_bw:+, $shared_bw each way}"
    [[ -n $prom ]] && echo "prometheus http://127.0.0.1:$prom_port  ($STATE/prometheus/prometheus.yml, every $prom_interval s)"
    echo "state    $STATE  (pids, logs, endpoints.json; stop with: deploy/run-stack.sh down --state-dir $STATE)"
}

(($#)) || die "usage: run-stack.sh up|down|status|restart-lmcache [options] (see the header of $0)"
sub=$1; shift
case $sub in
    up) cmd_up "$@" ;;
    down) cmd_down "$@" ;;
    status) cmd_status "$@" ;;
    restart-lmcache) cmd_restart_lmcache "$@" ;;
    *) die "unknown command $sub (up, down, status, restart-lmcache)" ;;
esac
