#!/usr/bin/env python3
"""make_tiny_model.py	build a tiny random-weight Llama and its tokenizer, offline, for tests against a real vLLM.

usage: make_tiny_model.py OUT_DIR [--vocab-size 4096] [--seed 0] [--force]
                          [--layers 2] [--hidden 128] [--heads 4] [--kv-heads 2] [--intermediate 256] [--max-len 4096]

The model: a Llama of 2 layers, hidden 128, 4 attention heads, 2 KV heads (head_dim = hidden / heads = 32), MLP width
256, 4096 positions, random weights (seeded), bfloat16. The size options build a larger one the same way, for
measurements where prefill must cost something (benchmarks/reload_vs_recompute.py): 4 layers of 512 with 8 heads and 4
KV heads is 16M parameters and 4 KiB of KV per token. The tokenizer: byte-level BPE trained with the `tokenizers`
library on the Python standard library's own sources (always on the machine), wrapped as a PreTrainedTokenizerFast
with a chat template. Nothing is downloaded. The model's output is gibberish, but deterministic at temperature 0: what
cache and timing tests need.

example:
  $ deploy/make_tiny_model.py /tmp/tiny-llama
  tiny model in /tmp/tiny-llama: vocab 4096, 2 layers x 128, 1.3M parameters, 512 B KV/token, 5.4 MB, 7.9 s
  $ deploy/make_tiny_model.py /tmp/big-llama --layers 4 --hidden 512 --heads 8 --kv-heads 4 --intermediate 1408
Re-running with the same OUT_DIR and arguments reuses the directory (a stamp file records the arguments).
"""

from __future__ import annotations

import argparse
import fcntl
import glob
import json
import os
import sys
import sysconfig
import time

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
STAMP = "kvtier-tiny-model.json"
# The tiny model's shape; a stamp written before the size options existed holds none of these keys and means these.
SHAPE = {"layers": 2, "hidden": 128, "heads": 4, "kv_heads": 2, "intermediate": 256, "max_len": 4096}


def check_shape(shape: dict) -> dict:
    """The full shape (defaults filled in); ValueError naming the option when it cannot make a Llama."""
    s = {**SHAPE, **{k: v for k, v in shape.items() if v is not None}}
    for k, v in s.items():
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"--{k.replace('_', '-')} must be a positive integer, got {v}")
    if s["hidden"] % s["heads"]:
        raise ValueError(f"--hidden {s['hidden']} is not a multiple of --heads {s['heads']}")
    if s["heads"] % s["kv_heads"]:
        raise ValueError(f"--heads {s['heads']} is not a multiple of --kv-heads {s['kv_heads']}")
    if (s["hidden"] // s["heads"]) % 2:
        raise ValueError(f"head size --hidden / --heads = {s['hidden'] // s['heads']} must be even (rotary embedding)")
    return s


def kv_bytes_per_token(s: dict) -> int:
    """K and V, every layer, bfloat16: what one token costs in any KV tier."""
    return 2 * s["layers"] * s["kv_heads"] * (s["hidden"] // s["heads"]) * 2


def _training_files(limit_bytes: int = 12 << 20) -> list[str]:
    stdlib = sysconfig.get_paths()["stdlib"]
    files, total = [], 0
    for path in sorted(glob.glob(os.path.join(stdlib, "*.py"))):
        size = os.path.getsize(path)
        files.append(path)
        total += size
        if total >= limit_bytes:
            break
    if not files:
        raise SystemExit(f"make-tiny-model: no Python sources under {stdlib} to train the tokenizer on")
    return files


def build(out_dir: str, vocab_size: int, seed: int, shape: dict | None = None) -> dict:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    shp = check_shape(shape or {})
    t0 = time.perf_counter()
    os.makedirs(out_dir, exist_ok=True)
    special = ["<unk>", "<s>", "</s>", "<pad>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train(_training_files(), trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=shp["max_len"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=shp["hidden"],
        intermediate_size=shp["intermediate"],
        num_hidden_layers=shp["layers"],
        num_attention_heads=shp["heads"],
        num_key_value_heads=shp["kv_heads"],
        head_dim=shp["hidden"] // shp["heads"],
        max_position_embeddings=shp["max_len"],
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out_dir, safe_serialization=True)
    params = sum(p.numel() for p in model.parameters())
    size = sum(os.path.getsize(os.path.join(out_dir, f)) for f in os.listdir(out_dir))
    info = {
        "vocab_size": len(fast),
        **shp,
        "kv_bytes_per_token": kv_bytes_per_token(shp),
        "parameters": params,
        "bytes": size,
        "seed": seed,
        "requested_vocab_size": vocab_size,
        "build_s": round(time.perf_counter() - t0, 2),
    }
    with open(os.path.join(out_dir, STAMP), "w") as fh:
        json.dump(info, fh)
    return info


def ensure(out_dir: str, vocab_size: int = 4096, seed: int = 0, force: bool = False, **shape) -> dict:
    """Build into out_dir unless a build with the same arguments (vocabulary, seed, shape) is already there. Two
    processes asking for the same directory at once (test workers) take turns: the second finds the first's build."""
    shp = check_shape(shape)
    stamp = os.path.join(out_dir, STAMP)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, ".build.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and os.path.exists(stamp):
            with open(stamp) as fh:
                info = json.load(fh)
            same_shape = all(info.get(k, SHAPE[k]) == v for k, v in shp.items())
            if info.get("requested_vocab_size") == vocab_size and info.get("seed") == seed and same_shape:
                return {**shp, "kv_bytes_per_token": kv_bytes_per_token(shp), **info}
        return build(out_dir, vocab_size, seed, shp)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[1:]),
    )
    ap.add_argument("out_dir")
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="rebuild even if OUT_DIR holds the same build")
    ap.add_argument("--layers", type=int, help=f"transformer layers [{SHAPE['layers']}]")
    ap.add_argument("--hidden", type=int, help=f"hidden size [{SHAPE['hidden']}]")
    ap.add_argument("--heads", type=int, help=f"attention heads; head size = hidden / heads [{SHAPE['heads']}]")
    ap.add_argument("--kv-heads", type=int, help=f"KV heads (grouped-query attention) [{SHAPE['kv_heads']}]")
    ap.add_argument("--intermediate", type=int, help=f"MLP width [{SHAPE['intermediate']}]")
    ap.add_argument("--max-len", type=int, help=f"positions, and the tokenizer's model_max_length [{SHAPE['max_len']}]")
    args = ap.parse_args(argv)
    shape = {k: getattr(args, k) for k in SHAPE}
    try:
        check_shape(shape)
    except ValueError as exc:
        print(f"make-tiny-model: {exc}", file=sys.stderr)
        return 2
    try:
        info = ensure(args.out_dir, args.vocab_size, args.seed, args.force, **shape)
    except ImportError as exc:
        print(f"make-tiny-model: needs torch, transformers and tokenizers ({exc.name} missing)", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"make-tiny-model: {args.out_dir}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(
        f"tiny model in {args.out_dir}: vocab {info['vocab_size']}, {info['layers']} layers x {info['hidden']}, "
        f"{info['parameters'] / 1e6:.1f}M parameters, {info['kv_bytes_per_token']} B KV/token, "
        f"{info['bytes'] / 1e6:.1f} MB, {info['build_s']} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
