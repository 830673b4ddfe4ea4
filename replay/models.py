"""KV-cache geometry of the models the benchmarks size objects for.

bytes per token = layers x 2 (K and V) x kv_heads x head_dim x dtype bytes; for MLA (DeepSeek-V3) K and V share one
latent: layers x (kv_lora_rank + qk_rope_head_dim) x dtype bytes. The catalog values are those of the MLPerf Storage
KV Cache benchmark's table, so results compare with it; `--model` also takes a Hugging Face config.json.

Each model also has its context length (`max_position_embeddings` of its config.json): no request can hold more
tokens, so a workload row longer than that is cut to it. A config.json is validated field by field (whole, positive
numbers; no silent truncation of 1.7 to 1): a bad one is one ConfigError line naming the file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvconnector.errors import ConfigError
from kvconnector.validation import describe_validation_error, error_path

from .common.json_files import InputError, loads_json

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
    # Tokens one sequence can hold (config.json's max_position_embeddings); 0 = not known.
    max_context_tokens: int = 0

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


CATALOG: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        # Context lengths are max_position_embeddings of each model's config.json. tiny-1b is the MLPerf table's
        # made-up model: it gets Llama-3.2-1B's (the real 1B model of that family).
        ModelSpec("tiny-1b", 12, 4, 128, max_context_tokens=131_072),
        ModelSpec("mistral-7b", 32, 8, 128, max_context_tokens=32_768),
        ModelSpec("llama2-7b", 32, 32, 128, max_context_tokens=4_096),
        ModelSpec("llama3.1-8b", 32, 8, 128, max_context_tokens=131_072),
        ModelSpec("llama3.1-70b-instruct", 80, 8, 128, max_context_tokens=131_072),
        ModelSpec("deepseek-v3", 61, kv_lora_rank=512, qk_rope_head_dim=64, max_context_tokens=163_840),
        ModelSpec("qwen3-32b", 64, 8, 80, max_context_tokens=40_960),
        ModelSpec("gpt-oss-120b", 36, 8, 64, max_context_tokens=131_072),
        ModelSpec("gpt-oss-20b", 24, 8, 64, max_context_tokens=131_072),
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
        raise ConfigError(
            f"unknown model '{name_or_path}': choose from {', '.join(CATALOG)} or give a config.json path"
        )
    try:
        cfg = loads_json(path.read_bytes())
    except InputError as exc:
        raise ConfigError(f"model config {path}: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read model config {path}: {exc.strerror or exc}") from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:  # json.loads takes UTF-8 (with or without BOM)
        where = f" (line {exc.lineno})" if isinstance(exc, json.JSONDecodeError) else ""
        raise ConfigError(f"model config {path}: not valid JSON{where}") from exc
    return spec_from_hf_config(cfg, name=str(path.parent.name or path), source=str(path))


# Real configs stay far below these; the caps keep an absurd file from sizing absurd entries.
_Dim = Annotated[int, Field(strict=True, gt=0, le=1 << 20)]


class _HFConfig(BaseModel):
    """The fields of a Hugging Face config.json that size the KV cache. Strict: 1.7, "32" and true are not 32."""

    model_config = ConfigDict(extra="ignore")
    num_hidden_layers: _Dim
    num_attention_heads: _Dim | None = None
    num_key_value_heads: _Dim | None = None
    hidden_size: _Dim | None = None
    head_dim: _Dim | None = None
    kv_lora_rank: Annotated[int, Field(strict=True, ge=0, le=1 << 20)] | None = None
    qk_rope_head_dim: Annotated[int, Field(strict=True, ge=0, le=1 << 20)] | None = None
    max_position_embeddings: Annotated[int, Field(strict=True, gt=0, le=1 << 40)] | None = None


def spec_from_hf_config(cfg, name: str, source: str | None = None) -> ModelSpec:
    where = f"model config {source or name}"
    if not isinstance(cfg, dict):
        raise ConfigError(f"{where}: expected a JSON object of fields, found a {type(cfg).__name__}")
    if "text_config" in cfg and cfg["text_config"] is not None:  # multimodal configs nest the language model
        if not isinstance(cfg["text_config"], dict):
            raise ConfigError(f"{where}: text_config must be an object, found a {type(cfg['text_config']).__name__}")
        cfg = cfg["text_config"]
    try:
        hf = _HFConfig.model_validate(cfg)
    except ValidationError as exc:
        err = exc.errors()[0]
        if err["type"] == "missing":
            raise ConfigError(
                f"{where}: lacks '{error_path(err['loc'])}' (need num_hidden_layers, num_attention_heads, hidden_size)"
            ) from None
        raise ConfigError(describe_validation_error(exc, where, show_input=True)) from None
    context = hf.max_position_embeddings or 0
    if hf.kv_lora_rank:
        if not hf.qk_rope_head_dim:
            raise ConfigError(f"{where}: an MLA config (kv_lora_rank) needs a positive qk_rope_head_dim")
        return ModelSpec(
            name,
            hf.num_hidden_layers,
            kv_lora_rank=hf.kv_lora_rank,
            qk_rope_head_dim=hf.qk_rope_head_dim,
            max_context_tokens=context,
        )
    if hf.num_attention_heads is None:
        raise ConfigError(
            f"{where}: lacks 'num_attention_heads' (need num_hidden_layers, num_attention_heads, hidden_size)"
        )
    kv_heads = hf.num_key_value_heads or hf.num_attention_heads
    if hf.head_dim:
        head_dim = hf.head_dim
    elif hf.hidden_size is None:
        raise ConfigError(f"{where}: lacks 'hidden_size' (or head_dim)")
    elif hf.hidden_size % hf.num_attention_heads:
        raise ConfigError(
            f"{where}: hidden_size {hf.hidden_size} is not a multiple of num_attention_heads "
            f"{hf.num_attention_heads}; give head_dim"
        )
    else:
        head_dim = hf.hidden_size // hf.num_attention_heads
    return ModelSpec(name, hf.num_hidden_layers, kv_heads, head_dim, max_context_tokens=context)
