"""The check a GPU host runs (deploy/gpu-check.sh runs it inside the GPU image): vLLM on CUDA + LMCache + kvtier's
disk tier as LMCache's L2, started by run-stack.sh; one prompt computed, hit in LMCache's L1, then, L1 cleared, hit
in kvtier's disk tier, with the same greedy text each time (deploy.stack.l2_hit, which the CPU end-to-end test runs
too). The model is the offline random-weight one deploy/make_tiny_model.py builds: no download.

  python -m deploy.gpu_check --work /var/tmp/kvtier-gpu-check
  python -m deploy.gpu_check --work /var/tmp/kvtier-gpu-check --device cpu     # the same check on vLLM's CPU build

Exit 0 when every check holds, 1 when one does not (each printed), 2 for a refusal (no GPU, a work dir in use).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import make_tiny_model
from .stack import down, l2_hit, prompt_text, up

CHUNKS = 5  # 1300 tokens at LMCache's chunk size 256: five full chunks


def refusal(device: str, work: Path) -> str | None:
    if device == "cuda":
        try:
            import torch
        except ImportError:
            return "torch is not importable: run inside the GPU image (make image-gpu) or a vLLM install"
        if not torch.cuda.is_available():
            return "no CUDA device is visible (podman: --device nvidia.com/gpu=all; docker: --gpus all)"
    if (work / "state" / "pids").exists():
        return f"{work / 'state'} holds a running stack: deploy/run-stack.sh down --state-dir {work / 'state'}"
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m deploy.gpu_check",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n" + "\n".join(__doc__.split("\n\n")[1].splitlines()),
    )
    ap.add_argument("--work", type=Path, required=True, help="model, stack state, kvtier's disk tier and logs")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--model", help="a model directory to serve instead of the tiny random-weight one")
    ap.add_argument("--timeout", type=int, default=600, help="seconds for the stack to come up [600]")
    a = ap.parse_args(argv)
    why = refusal(a.device, a.work)
    if why:
        print(f"gpu_check: {why}", file=sys.stderr)
        return 2
    model = a.model or str(a.work / "model")
    if not a.model:
        make_tiny_model.ensure(model)
    state = a.work / "state"
    print(f"gpu_check: starting vLLM ({a.device}) + LMCache + kvtier; logs in {state}", flush=True)
    try:
        pin = ["--gpus-per-instance", "1"] if a.device == "cuda" else []  # the instance on GPU 0 alone
        stack = up(state, model, a.work / "kv", "--disk-gb", "1", *pin, timeout_s=a.timeout, device=a.device)
    except RuntimeError as e:
        print(f"gpu_check: the stack did not start: {str(e).splitlines()[0]} (logs in {state})", file=sys.stderr)
        return 1
    try:
        hit, _ = l2_hit(stack, prompt_text(model, 1300, "argparse.py"), CHUNKS)
    finally:
        down(state)
    for name, value in vars(hit).items():
        print(f"  {name:<18} {value}")
    problems = hit.problems(CHUNKS)
    for p in problems:
        print(f"gpu_check: FAIL {p}")
    print("gpu_check: " + ("FAIL" if problems else f"PASS: an L2 hit from kvtier's disk tier on {a.device}"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
