#!/usr/bin/env bash
# The GPU tier on a machine with a CUDA GPU: its tests, then a short `kvtier bench` with GPU -> CPU -> disk tiers.
# Then an L2 hit from kvtier on the stack where vLLM and LMCache run on CUDA (deploy/gpu_check.py).
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
# The stack on the GPU where vLLM and LMCache are installed with CUDA: one prompt computed, hit in LMCache's L1, then
# (L1 cleared) hit in kvtier's disk tier (deploy/gpu_check.py, the check deploy/gpu-check.sh runs in the GPU image).
if python3 -c "import vllm, lmcache" 2>/dev/null; then
    python3 -m deploy.gpu_check --work "$out/stack" --device cuda 2>&1 | tee "$out/stack-check.txt"
else
    echo "no vllm/lmcache with CUDA here: the stack step is skipped" | tee "$out/stack-check.txt"
fi
