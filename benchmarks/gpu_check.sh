#!/usr/bin/env bash
# The GPU tier on a machine with a CUDA GPU: its tests, then a short `kvtier bench` with GPU -> CPU -> disk tiers.
# Then the stack with --gpus-per-instance where vLLM and LMCache run on CUDA.
# Usage: bash benchmarks/gpu_check.sh OUT_DIR   (python3 must hold torch with CUDA; kvtier runs from this checkout)
set -uo pipefail
out=${1:-gpu-check}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" | tee -a "$out/gpu.txt"
python3 -m pytest -q -p no:cacheprovider tests/kvconnector/test_gpu_tier.py tests/kvconnector/test_store.py \
    tests/kvconnector/test_timed_io.py 2>&1 | tee "$out/pytest.txt"
python3 -m replay.cli bench --gpu-mem-gb 4 --cpu-mem-gb 4 --storage-capacity-gb 20 --duration 25 --num-users 40 \
    --seed 1 --no-progress --output "$out/bench-gpu.json" 2>&1 | tee "$out/bench-gpu.txt"
# The stack on the GPU, instance 0 pinned to GPU 0 (run-stack.sh --gpus-per-instance), where vLLM and LMCache are
# installed with CUDA: up, one prompt twice (the second an LMCache hit), down.
if python3 -c "import vllm, lmcache" 2>/dev/null; then
    python3 deploy/make_tiny_model.py "$out/tiny" >/dev/null
    bash deploy/run-stack.sh up --device cuda --gpus-per-instance 1 --model "$out/tiny" --vllm-port 18800 \
        --lmcache-port 18810 --lmcache-http-port 18820 --kv-dir "$out/kv" --state-dir "$out/stack" --python python3 \
        2>&1 | tee "$out/stack-up.txt"
    grep -h CUDA_VISIBLE_DEVICES "$out/stack/"*.cmd | tee "$out/stack-gpus.txt"
    for i in 1 2; do
        curl -s http://127.0.0.1:18800/v1/completions -H 'Content-Type: application/json' \
            -d '{"model": "tiny", "prompt": "'"$(python3 -c 'print("kv cache tier " * 300)')"'", "max_tokens": 4}'
        echo
    done | tee "$out/stack-prompts.txt"
    curl -s http://127.0.0.1:18800/metrics | grep -E '^vllm:external_prefix_cache_(hits|queries)_total' \
        | tee "$out/stack-hits.txt"
    bash deploy/run-stack.sh down --state-dir "$out/stack"
else
    echo "no vllm/lmcache with CUDA here: the stack step is skipped" | tee "$out/stack-up.txt"
fi
