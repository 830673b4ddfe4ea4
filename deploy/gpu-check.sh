#!/usr/bin/env bash
# On a host with an NVIDIA GPU and podman (CDI: nvidia-ctk cdi generate) or docker (nvidia-container-toolkit):
# build kvtier's GPU image (vLLM's official image + LMCache + kvtier, make image-gpu) and run deploy/gpu_check.py in
# it: vLLM on CUDA, LMCache, kvtier's disk tier as L2, one prompt computed, hit in L1, and after L1 is cleared hit
# from kvtier's disk tier. Needs vLLM's image from its registry (or VLLM_IMAGE naming a local one).
#
#   deploy/gpu-check.sh                          # podman, work dir /var/tmp/kvtier-gpu-check
#   ENGINE=docker deploy/gpu-check.sh /data/gpu-check
#   IMAGE=localhost/kvtier-gpu:0.1.0-abc1234 deploy/gpu-check.sh   # an image built before: no build
# Exit: gpu_check's (0 pass, 1 a check failed, 2 refused), or the build's.
set -euo pipefail
cd "$(dirname "$0")/.."
ENGINE=${ENGINE:-podman}
WORK=${1:-/var/tmp/kvtier-gpu-check}
case "$ENGINE" in
    podman) gpus=(--device nvidia.com/gpu=all) ;;
    docker) gpus=(--gpus all) ;;
    *) echo "gpu-check.sh: ENGINE is podman or docker, got $ENGINE" >&2; exit 2 ;;
esac
command -v "$ENGINE" >/dev/null || { echo "gpu-check.sh: $ENGINE is not installed" >&2; exit 2; }
if [ -z "${IMAGE:-}" ]; then
    make image-gpu CONTAINER_ENGINE="$ENGINE"
    IMAGE=$(make -s image-gpu-name)
fi
mkdir -p "$WORK"
# --ipc=host: vLLM's workers share memory beyond a container's default 64 MB /dev/shm
exec "$ENGINE" run --rm "${gpus[@]}" --ipc=host -v "$WORK:/work" --entrypoint python3 "$IMAGE" \
    -m deploy.gpu_check --work /work --device cuda
