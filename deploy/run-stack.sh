#!/usr/bin/env bash
# run-stack.sh	start/stop vLLM + LMCache + the kvtier backend, for people and the end-to-end tests alike.
#
# usage:
#   deploy/run-stack.sh up --device cpu|cuda --model DIR --vllm-port P --lmcache-port P2 --lmcache-http-port P3 \
#                          --kv-dir DIR [--shared-dir DIR] [--instances N] [--mode mp|inprocess] [options]
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
# example:
#   $ deploy/make_tiny_model.py /tmp/tiny && deploy/run-stack.sh up --device cpu --model /tmp/tiny --vllm-port 8000 \
#       --lmcache-port 5555 --lmcache-http-port 8090 --kv-dir /tmp/kvtier-cache
#   vllm     http://127.0.0.1:8000/v1
#   lmcache  http://127.0.0.1:8090  (MP server 127.0.0.1:5555)
#   kvtier   http://127.0.0.1:8100/metrics
#   state    /tmp/kvtier-stack-0  (pids, logs, endpoints.json; stop with: deploy/run-stack.sh down)
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
    [[ -f $STATE/pids ]] || { echo "nothing to stop (no $STATE/pids)"; return 0; }
    # shellcheck disable=SC2046
    stop_groups "$grace" TERM $(awk '{print $2}' "$STATE/pids" | tac)
    rm -f "$STATE/pids"
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
    # ---- instance tiers (private / private+shared / shared) ----
    local tiers=private
    [[ -n $shared ]] && tiers=private+shared
    if [[ $l2kind == kvtier && $disk_gb =~ ^0*(\.0*)?$ ]]; then
        [[ -n $shared ]] || die "--disk-gb 0 leaves kvtier no tier: give --shared-dir or a size"
        tiers=shared
    fi
    # ---- end instance tiers ----
    mport=${mport:-$((hport + 10))}
    mkdir -p "$STATE"
    chmod 700 "$STATE"
    if [[ -f $STATE/pids ]]; then
        local alive=0 p
        for p in $(awk '{print $2}' "$STATE/pids"); do group_alive "$p" && alive=1; done
        ((alive == 0)) || die "a stack is already running from $STATE (deploy/run-stack.sh down --state-dir $STATE)"
        rm -f "$STATE/pids"
    fi
    rm -f "$STATE"/*.log "$STATE"/*.cmd "$STATE/endpoints.json"
    trap 'echo "run-stack.sh: start-up failed, stopping what was started" >&2; cmd_down --state-dir "$STATE" --grace 5 >&2' ERR

    local -a venv=(env "HF_HUB_OFFLINE=1" "TRANSFORMERS_OFFLINE=1" "VLLM_NO_USAGE_STATS=1" "DO_NOT_TRACK=1"
                   "PYTHONHASHSEED=0" "LMCACHE_TRACK_USAGE=false" "PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}")
    [[ $device == cpu ]] && venv+=("VLLM_CPU_KVCACHE_SPACE=${kv_space:-${VLLM_CPU_KVCACHE_SPACE:-1}}")
    local -a vsettings=(--max-model-len "$max_len" --max-num-seqs "$max_seqs")
    if [[ $prefix_caching == on ]]; then vsettings+=(--enable-prefix-caching); else vsettings+=(--no-enable-prefix-caching); fi
    [[ -n $vblock ]] && vsettings+=(--block-size "$vblock")
    if [[ -n $kv_space && $device == cuda ]]; then
        vsettings+=(--kv-cache-memory-bytes "$("$PY" -c 'import sys; print(int(float(sys.argv[1]) * 2**30))' "$kv_space")")
    fi
    local deadline=$((SECONDS + timeout)) i
    local -a insts=()
    for ((i = 0; i < n; i++)); do
        local dir=$kvdir vp=$vport
        ((n > 1)) && dir=$kvdir/inst$i && vp=$((vport + 1 + i))
        mkdir -p -m 700 "$kvdir" "$dir"
        local params
        params=$("$PY" - "$dir" "$disk_gb" "$io_mode" "$shared" "$shared_gb" "$((mport + i))" <<'EOF'
import json, sys
d, disk_gb, io_mode, shared, shared_gb, mport = sys.argv[1:]
p = {"disk_dir": d, "disk_capacity_gb": float(disk_gb), "io_mode": io_mode, "metrics_port": int(mport),
     "snapshot_path": d + "/kvtier-stats.json"}
if shared:
    p.update(shared_dir=shared, shared_capacity_gb=float(shared_gb))
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
                     "shared": "shared_dir" in p, "adapter_params": p}))' "$params")
            elif [[ $l2kind == lmcache-fs ]]; then
                l2=$("$PY" -c 'import json,sys; print(json.dumps({"type": "fs", "base_path": sys.argv[1],
                     "use_odirect": sys.argv[2] == "direct"}))' "$dir" "$io_mode")
            fi
            [[ $l2kind == none ]] || l2arg=(--l2-adapter "$l2")  # none: no adapter, LMCache's L1 is all there is
            start "lmcache$i" "${venv[@]}" "$PY" -m lmcache.v1.multiprocess.http_server \
                --host 127.0.0.1 --port $((lport + i)) --http-host 127.0.0.1 --http-port $((hport + i)) \
                --prometheus-port $((hport + 20 + i)) --chunk-size "$chunk" --l1-size-gb "$l1_gb" \
                --eviction-policy LRU --supported-transfer-mode auto ${l2arg[@]+"${l2arg[@]}"} \
                ${lextra[@]+"${lextra[@]}"}
            kvcfg=$("$PY" -c 'import json,sys; print(json.dumps({"kv_connector": "LMCacheMPConnector",
                "kv_connector_module_path": "lmcache.integration.vllm.lmcache_mp_connector", "kv_role": "kv_both",
                "kv_connector_extra_config": {"lmcache.mp.host": "tcp://127.0.0.1", "lmcache.mp.port": int(sys.argv[1])}}))' \
                $((lport + i)))
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
        local -a ienv=("${venv[@]}")
        [[ $mode == inprocess ]] && ienv+=("LMCACHE_CONFIG_FILE=$STATE/lmcache-inst$i.yaml")
        start "vllm$i" "${ienv[@]}" "$PY" -m vllm.entrypoints.openai.api_server --model "$model" \
            --served-model-name "$name" --dtype bfloat16 "${vsettings[@]}" --enforce-eager \
            --host 127.0.0.1 --port "$vp" --kv-transfer-config "$kvcfg" \
            ${vextra[@]+"${vextra[@]}"}
        insts+=("$(printf '{"vllm": "http://127.0.0.1:%s", "lmcache_port": %s, "lmcache_http": "http://127.0.0.1:%s", "kvtier_metrics": "http://127.0.0.1:%s/metrics", "lmcache_metrics": "http://127.0.0.1:%s/metrics", "kv_dir": "%s"}' \
            "$vp" $((lport + i)) $((hport + i)) $((mport + i)) $((hport + i)) "$dir")")
    done
    if ((n > 1)); then
        local -a backs=()
        for ((i = 0; i < n; i++)); do backs+=(--backend "http://127.0.0.1:$((vport + 1 + i))"); done
        start proxy "$PY" "$ROOT/deploy/rr_proxy.py" --host 127.0.0.1 --port "$vport" "${backs[@]}"
    fi
    local joined
    joined=$(IFS=,; echo "${insts[*]}")
    printf '{"mode": "%s", "l2": "%s", "device": "%s", "vllm": "http://127.0.0.1:%s", "model": "%s", "shared_dir": "%s", "tiers": "%s", "state_dir": "%s", "instances": [%s]}\n' \
        "$mode" "$l2kind" "$device" "$vport" "$name" "$shared" "$tiers" "$STATE" "$joined" > "$STATE/endpoints.json"

    for ((i = 0; i < n; i++)); do
        if [[ $mode == mp ]]; then
            wait_http "lmcache$i" "http://127.0.0.1:$((hport + i))/healthcheck" "$deadline"
            if [[ $l2kind == kvtier ]]; then
                wait_http "lmcache$i" "http://127.0.0.1:$((mport + i))/metrics" "$deadline"
            fi
        fi
        local vp=$vport
        ((n > 1)) && vp=$((vport + 1 + i))
        wait_http "vllm$i" "http://127.0.0.1:$vp/health" "$deadline"
    done
    ((n > 1)) && wait_http proxy "http://127.0.0.1:$vport/health" "$deadline"
    trap - ERR
    echo "vllm     http://127.0.0.1:$vport/v1"
    for ((i = 0; i < n; i++)); do
        [[ $mode == mp ]] && echo "lmcache  http://127.0.0.1:$((hport + i))  (MP server 127.0.0.1:$((lport + i)))"
        if [[ $l2kind == kvtier ]]; then echo "kvtier   http://127.0.0.1:$((mport + i))/metrics"
        elif [[ $l2kind == none ]]; then echo "l2       none (LMCache L1 only, $l1_gb GB)"
        else echo "l2       LMCache fs adapter on $kvdir (use_odirect: $([[ $io_mode == direct ]] && echo true || echo false))"; fi
    done
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
