"""KV-cache geometry of the models the benchmarks size objects for.

bytes per token = layers x 2 (K and V) x kv_heads x head_dim x dtype bytes; for MLA (DeepSeek-V3) K and V share one
latent: layers x (kv_lora_rank + qk_rope_head_dim) x dtype bytes. The catalog values are those of the MLPerf Storage
KV Cache benchmark's table, so results compare with it; `--model` also takes a Hugging Face config.json.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    num_layers: int
    kv_heads: int = 0
    head_dim: int = 0
    # MLA models only: the compressed latent and the decoupled RoPE key.
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    def bytes_per_token(self, kv_dtype: str = "bf16") -> int:
        try:
            width = DTYPE_BYTES[kv_dtype]
        except KeyError:
            raise ConfigError(f"unknown --kv-dtype '{kv_dtype}' (choose from {', '.join(DTYPE_BYTES)})") from None
        if self.is_mla:
            return self.num_layers * (self.kv_lora_rank + self.qk_rope_head_dim) * width
        return self.num_layers * 2 * self.kv_heads * self.head_dim * width

    def kv_shape(self, tokens: int) -> tuple[int, ...]:
        """The tensor an engine would hold for `tokens` tokens: (layers, 2, tokens, kv_heads, head_dim), MLA without the 2."""
        if self.is_mla:
            return (self.num_layers, tokens, self.kv_lora_rank + self.qk_rope_head_dim)
        return (self.num_layers, 2, tokens, self.kv_heads, self.head_dim)


CATALOG: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec("tiny-1b", 12, 4, 128),
        ModelSpec("mistral-7b", 32, 8, 128),
        ModelSpec("llama2-7b", 32, 32, 128),
        ModelSpec("llama3.1-8b", 32, 8, 128),
        ModelSpec("llama3.1-70b-instruct", 80, 8, 128),
        ModelSpec("deepseek-v3", 61, kv_lora_rank=512, qk_rope_head_dim=64),
        ModelSpec("qwen3-32b", 64, 8, 80),
        ModelSpec("gpt-oss-120b", 36, 8, 64),
        ModelSpec("gpt-oss-20b", 24, 8, 64),
    )
}


def resolve_model(name_or_path: str) -> ModelSpec:
    """A catalog name, or a path to a Hugging Face config.json (or a folder holding one)."""
    if name_or_path in CATALOG:
        return CATALOG[name_or_path]
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ConfigError(f"unknown model '{name_or_path}': choose from {', '.join(CATALOG)} or give a config.json path")
    try:
        cfg = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read model config {path}: {exc}") from exc
    return spec_from_hf_config(cfg, name=str(path.parent.name or path))


def spec_from_hf_config(cfg: dict, name: str) -> ModelSpec:
    cfg = cfg.get("text_config", cfg)  # multimodal configs nest the language model
    try:
        layers = int(cfg["num_hidden_layers"])
        if cfg.get("kv_lora_rank"):
            return ModelSpec(name, layers, kv_lora_rank=int(cfg["kv_lora_rank"]), qk_rope_head_dim=int(cfg["qk_rope_head_dim"]))
        heads = int(cfg["num_attention_heads"])
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"model config '{name}' lacks {exc} (need num_hidden_layers, num_attention_heads, hidden_size)") from exc
    if min(layers, kv_heads, head_dim) <= 0:
        raise ConfigError(f"model config '{name}' has non-positive dimensions")
    return ModelSpec(name, layers, kv_heads, head_dim)
