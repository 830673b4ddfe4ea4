#!/usr/bin/env python3
"""make-tiny-model.py	build a tiny random-weight Llama and its tokenizer, offline, for tests against a real vLLM.

usage: make-tiny-model.py OUT_DIR [--vocab-size 4096] [--seed 0] [--force]

The model: a Llama of 2 layers, hidden 128, 4 attention heads, 2 KV heads (head_dim 32), random weights (seeded),
bfloat16. The tokenizer: byte-level BPE trained with the `tokenizers` library on the Python standard library's own
sources (always on the machine), wrapped as a PreTrainedTokenizerFast with a chat template. Nothing is downloaded.
The model's output is gibberish, but deterministic at temperature 0: what cache and timing tests need.

example:
  $ deploy/make-tiny-model.py /tmp/tiny-llama
  tiny model in /tmp/tiny-llama: vocab 4096, 2 layers, 1.3M parameters, 5.4 MB, 7.9 s
Re-running with the same OUT_DIR and arguments reuses the directory (a stamp file records the arguments).
"""

from __future__ import annotations

import argparse
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


def build(out_dir: str, vocab_size: int, seed: int) -> dict:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

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
        model_max_length=4096,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=4096,
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
        "layers": 2,
        "parameters": params,
        "bytes": size,
        "seed": seed,
        "requested_vocab_size": vocab_size,
        "build_s": round(time.perf_counter() - t0, 2),
    }
    with open(os.path.join(out_dir, STAMP), "w") as fh:
        json.dump(info, fh)
    return info


def ensure(out_dir: str, vocab_size: int = 4096, seed: int = 0, force: bool = False) -> dict:
    """Build into out_dir unless a build with the same arguments is already there."""
    stamp = os.path.join(out_dir, STAMP)
    if not force and os.path.exists(stamp):
        with open(stamp) as fh:
            info = json.load(fh)
        if info.get("requested_vocab_size") == vocab_size and info.get("seed") == seed:
            return info
    return build(out_dir, vocab_size, seed)


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
    args = ap.parse_args(argv)
    try:
        info = ensure(args.out_dir, args.vocab_size, args.seed, args.force)
    except ImportError as exc:
        print(f"make-tiny-model: needs torch, transformers and tokenizers ({exc.name} missing)", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"make-tiny-model: {args.out_dir}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(
        f"tiny model in {args.out_dir}: vocab {info['vocab_size']}, {info['layers']} layers, "
        f"{info['parameters'] / 1e6:.1f}M parameters, {info['bytes'] / 1e6:.1f} MB, {info['build_s']} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
