#!/usr/bin/env bash
# kvtier as a secondary tier of vLLM's own offloading, on a CUDA GPU: a real vLLM with OffloadingConnector +
# TieringOffloadingSpec (small CPU tier) + KvtierTier, one prompt served from kvtier after the CPU tier is cleared
# and again after a restart, with the uncached greedy text each time. About 3-5 minutes (two vLLM starts).
#
# Usage: bash benchmarks/gpu_check_vllm_tier.sh [--cpu-only] [OUT_DIR] [PORT]
#   python3 must import a CUDA vLLM with tiered offloading (0.32 or newer); kvtier runs from this checkout.
#   --cpu-only: build the model and the config and check the config through vLLM's own spec and tier factories on
#   CPU (what the GPU run does first), then stop before starting vLLM.
# Checks, each printed as PASS/FAIL (exit 1 on a FAIL):
#   1 the first answer (nothing cached) is stored: kvtier holds entries;
#   2 after POST /reset_prefix_cache?reset_external=true (GPU prefix cache and CPU tier emptied, kvtier kept) the
#     same prompt is an L2 hit: vllm:kv_offload_tiering_read_bytes{tier="1:KvtierTier"} grows, same text;
#   3 after a restart of vLLM on the same directory (kvtier rescans it) the same again.
set -uo pipefail
cpu_only=0
if [ "${1:-}" = "--cpu-only" ]; then cpu_only=1; shift; fi
case "${1:-}" in -h | --help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; -*) echo "unknown option $1" >&2; exit 2 ;; esac
out=${1:-gpu-check-vllm-tier}
port=${2:-8011}
case "$port" in '' | *[!0-9]*) echo "PORT must be a number, got '$port'" >&2; exit 2 ;; esac
mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd)
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 PYTHONHASHSEED=0 VLLM_SERVER_DEV_MODE=1
rm -rf "$out/kvtier"
python3 deploy/make_tiny_model.py "$out/tiny" >"$out/model.txt" 2>&1 || { cat "$out/model.txt"; exit 1; }
# Small CPU tier (64 MiB); kvtier's disk tier behind it, with its own Prometheus exporter.
cfg=$(python3 - "$out" <<'EOF'
import json, sys
tier = {"type": "KvtierTier", "module_path": "kvconnector.vllm.tier", "disk_dir": f"{sys.argv[1]}/kvtier",
        "disk_capacity_gb": 1, "metrics_port": 0}
extra = {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 64 << 20, "secondary_tiers": [tier]}
print(json.dumps({"kv_connector": "OffloadingConnector", "kv_role": "kv_both", "kv_connector_extra_config": extra}))
EOF
)
echo "$cfg" >"$out/kv-transfer-config.json"
echo "--kv-transfer-config $cfg"
# Preflight on CPU: vLLM's spec factory builds the spec, its tier factory loads KvtierTier from these exact settings.
python3 - "$out/kv-transfer-config.json" "$out/preflight" <<'EOF' || exit 1
import json, sys
from kvconnector.vllm.driver import ManagerDriver
extra = json.load(open(sys.argv[1]))["kv_connector_extra_config"]
tiers = [dict(t, disk_dir=sys.argv[2], metrics_port=None) for t in extra["secondary_tiers"]]
with ManagerDriver(tiers, 8192, 1 << 20) as d:
    print("preflight: vLLM", __import__("vllm").__version__, "loaded", [type(t).__name__ for t in d.tiers])
EOF
[ "$cpu_only" = 1 ] && { echo "cpu-only: config checked; not starting vLLM"; exit 0; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"

pid=
start() {
    python3 -m vllm.entrypoints.openai.api_server --model "$out/tiny" --host 127.0.0.1 --port "$port" \
        --max-model-len 4096 --gpu-memory-utilization 0.2 --enforce-eager --kv-transfer-config "$cfg" \
        >>"$out/vllm.log" 2>&1 &
    pid=$!
    for _ in $(seq 240); do
        curl -sf "http://127.0.0.1:$port/health" >/dev/null && return 0
        kill -0 "$pid" 2>/dev/null || { tail -30 "$out/vllm.log"; return 1; }
        sleep 1
    done
    echo "vLLM did not answer /health within 240 s" >&2; return 1
}
stop() { [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; pid=; }
trap stop EXIT
ask() {  # ask BASE: the greedy text of a fixed prompt, and vLLM's bytes read from kvtier once past BASE (up to 20 s)
    python3 - "$port" "$out/tiny" "${1:-0}" <<'EOF'
import json, re, sys, time, urllib.request
port, model, base = sys.argv[1], sys.argv[2], float(sys.argv[3])
prompt = " ".join(f"word{i % 97} item{i}" for i in range(250))  # 1.3k tokens (tiny model): 80+ full blocks
body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 24, "temperature": 0}).encode()
req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"})
text = json.load(urllib.request.urlopen(req, timeout=120))["choices"][0]["text"]
pat = re.compile(r'^vllm:kv_offload_tiering_read_bytes_total\{[^}]*tier="1:KvtierTier"[^}]*\} (\S+)', re.M)
for _ in range(20):  # offloading stats reach /metrics with the engine's stats interval
    time.sleep(1)
    read = sum(float(v) for v in pat.findall(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()))
    if read > base:
        break
print(json.dumps({"text": text, "kvtier_read_bytes": read}))
EOF
}
field() { python3 -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }
fails=0
check() { if [ "$1" = 1 ]; then echo "PASS $2"; else echo "FAIL $2"; fails=$((fails + 1)); fi; }
entries() { find "$out/kvtier" -maxdepth 1 -name '*.kv' | wc -l; }

start || exit 1
a=$(ask -1) || exit 1; echo "first:   $a" | tee -a "$out/answers.txt"
for _ in $(seq 20); do [ "$(entries)" -gt 0 ] && break; sleep 1; done  # the cascade to kvtier is asynchronous
n=$(entries); check "$([ "$n" -gt 0 ] && echo 1)" "1 stored: $n kvtier entry files"
for _ in $(seq 10); do  # refused (success: false) while offload transfers are still in flight: retry
    curl -sf -X POST "http://127.0.0.1:$port/reset_prefix_cache?reset_external=true" >"$out/reset.json"
    grep -q '"success": *true' "$out/reset.json" && break
    sleep 1
done
check "$(grep -q '"success": *true' "$out/reset.json" && echo 1)" "2 reset_prefix_cache?reset_external=true: $(cat "$out/reset.json")"
b=$(ask "$(field "$a" kvtier_read_bytes)") || exit 1; echo "cleared: $b" | tee -a "$out/answers.txt"
check "$(python3 -c "import sys; print(int(float(sys.argv[1]) > float(sys.argv[2])))" "$(field "$b" kvtier_read_bytes)" "$(field "$a" kvtier_read_bytes)")" \
    "2 L2 hit after reset_external: kvtier read bytes $(field "$a" kvtier_read_bytes) -> $(field "$b" kvtier_read_bytes)"
check "$([ "$(field "$a" text)" = "$(field "$b" text)" ] && echo 1)" "2 same greedy text"
stop
start || exit 1
c=$(ask) || exit 1; echo "restart: $c" | tee -a "$out/answers.txt"
check "$(python3 -c "import sys; print(int(float(sys.argv[1]) > 0))" "$(field "$c" kvtier_read_bytes)")" \
    "3 L2 hit after a restart (rescanned): kvtier read bytes $(field "$c" kvtier_read_bytes)"
check "$([ "$(field "$a" text)" = "$(field "$c" text)" ] && echo 1)" "3 same greedy text"
stop
grep -E "kvtier secondary tier|rescan" "$out/vllm.log" | tail -3
echo "$fails failed; logs in $out"
[ "$fails" = 0 ]
