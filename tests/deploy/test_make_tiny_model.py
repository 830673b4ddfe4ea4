"""deploy/make_tiny_model.py's size options: a model built with them loads with the shape asked for, a stamp of
another shape is not reused, and an impossible shape is one line and exit 2. No server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from deploy import make_tiny_model

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "make_tiny_model.py"


def _mod():
    return make_tiny_model


@pytest.mark.slow
def test_size_options_build_that_shape(tmp_path):
    import torch
    from safetensors import safe_open
    from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM

    out = tmp_path / "m"
    args = ["--layers", "3", "--hidden", "96", "--heads", "6", "--kv-heads", "3", "--intermediate", "200"]
    p = subprocess.run([sys.executable, str(SCRIPT), str(out), "--vocab-size", "512", "--max-len", "1024", *args],
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert p.returncode == 0, p.stderr
    # head size 16; K and V of 3 layers x 3 KV heads x 16 in bfloat16
    assert "3 layers x 96" in p.stdout and "576 B KV/token" in p.stdout, p.stdout

    cfg = AutoConfig.from_pretrained(out)
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads) == (3, 96, 6)
    assert (cfg.num_key_value_heads, cfg.intermediate_size, cfg.max_position_embeddings) == (3, 200, 1024)
    assert AutoTokenizer.from_pretrained(out).model_max_length == 1024
    with safe_open(str(next(out.glob("*.safetensors"))), "pt") as f:
        names = list(f.keys())
        assert sum(".mlp.down_proj.weight" in n for n in names) == 3
        assert tuple(f.get_slice("model.layers.2.self_attn.k_proj.weight").get_shape()) == (3 * 16, 96)
        assert tuple(f.get_slice("model.layers.0.mlp.up_proj.weight").get_shape()) == (200, 96)
    # the weights load and run at that shape
    model = LlamaForCausalLM.from_pretrained(out, torch_dtype=torch.bfloat16)
    with torch.no_grad():
        logits = model(torch.tensor([[1, 5, 9, 12]])).logits
    assert tuple(logits.shape) == (1, 4, cfg.vocab_size)

    stamp = json.loads((out / "kvtier-tiny-model.json").read_text())
    assert stamp["layers"] == 3 and stamp["kv_bytes_per_token"] == 576

    mod = _mod()
    # same arguments: the directory is reused (no rebuild: build_s is the first build's)
    again = mod.ensure(str(out), 512, 0, layers=3, hidden=96, heads=6, kv_heads=3, intermediate=200, max_len=1024)
    assert again["build_s"] == stamp["build_s"]


def test_old_stamp_means_the_tiny_shape(tmp_path, monkeypatch):
    """A stamp from before the size options (no shape keys) is reused for the default shape, rebuilt for another."""
    mod = _mod()
    old = {"vocab_size": 4096, "layers": 2, "parameters": 1, "bytes": 1, "seed": 0, "requested_vocab_size": 4096,
           "build_s": 1.0}  # fmt: skip
    (tmp_path / mod.STAMP).write_text(json.dumps(old))
    built = []
    monkeypatch.setattr(mod, "build", lambda out, vocab, seed, shape: built.append(shape) or {"rebuilt": True})
    info = mod.ensure(str(tmp_path))
    assert built == [] and info["hidden"] == 128 and info["kv_bytes_per_token"] == 512
    assert mod.ensure(str(tmp_path), layers=4) == {"rebuilt": True}
    assert built[0]["layers"] == 4 and built[0]["hidden"] == 128


@pytest.mark.parametrize(
    "args, says",
    [
        (["--hidden", "100", "--heads", "3"], "--hidden 100 is not a multiple of --heads 3"),
        (["--heads", "4", "--kv-heads", "3"], "--heads 4 is not a multiple of --kv-heads 3"),
        (["--layers", "0"], "--layers must be a positive integer"),
        (["--hidden", "96", "--heads", "32"], "must be even"),
    ],
)
def test_impossible_shape_is_a_usage_error(tmp_path, args, says):
    out = tmp_path / "m"
    p = subprocess.run([sys.executable, str(SCRIPT), str(out), *args], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert p.stderr.startswith("make-tiny-model: ") and says in p.stderr and p.stderr.count("\n") == 1, p.stderr
    assert not out.exists()
