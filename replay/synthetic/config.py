"""The one validated configuration of `kvtier bench`: defaults < YAML file (`--config`) < KVTIER_* env < CLI flags,
merged by replay.settings (the same loader as `kvtier replay`).

Top-level keys are the MLPerf Storage KV Cache benchmark's flags (underscored); sections are its config.yaml sections
(user_templates, qos_profiles, qos_distribution, eviction, prefix_cache, rag, conversation, autoscaler, decode,
generation, sharegpt, model_configs). Unknown keys are errors, and every key is used by the run (tests prove it).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..settings import load_settings


class _Section(BaseModel):
    # inf and nan are never a sensible size, rate or time: reject them everywhere.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


def _check_range(name: str, rng: tuple, minimum: float = 0) -> None:
    lo, hi = rng
    if lo < minimum or hi < lo:
        raise ValueError(f"{name} must be [low, high] with {minimum} <= low <= high, got {list(rng)}")


class UserTemplate(_Section):
    context_tokens: tuple[int, int]
    generate_tokens: tuple[int, int]
    think_time_s: tuple[float, float]
    weight: float = Field(1.0, gt=0)

    @model_validator(mode="after")
    def _ranges(self) -> UserTemplate:
        _check_range("context_tokens", self.context_tokens, 1)
        _check_range("generate_tokens", self.generate_tokens, 0)
        _check_range("think_time_s", self.think_time_s, 0)
        return self


# Context, generation and think-time ranges of the MLPerf KV Cache spec (section 4.1).
DEFAULT_USER_TEMPLATES = {
    "chatbot": UserTemplate(context_tokens=(512, 4096), generate_tokens=(50, 200), think_time_s=(0.1, 0.5)),
    "coding": UserTemplate(context_tokens=(4096, 25000), generate_tokens=(100, 500), think_time_s=(0.2, 1.0)),
    "document": UserTemplate(context_tokens=(4096, 16384), generate_tokens=(200, 800), think_time_s=(0.3, 1.5)),
}


class QoSProfile(_Section):
    priority: int = Field(ge=0)
    target_p95_ms: float = Field(gt=0)
    target_p99_ms: float = Field(gt=0)
    # Share of the I/O workers under saturation, relative to the other classes (qos_scheduler fair); default
    # 2 ** priority (8, 4, 2 for interactive, responsive, batch).
    weight: float | None = Field(None, gt=0)

    @property
    def share(self) -> float:
        # Each priority level doubles the share (levels past 64 add nothing: the float would overflow).
        return self.weight if self.weight is not None else 2.0 ** min(self.priority, 64)


# MLPerf KV Cache spec section 3.9. Higher priority goes first.
DEFAULT_QOS = {
    "interactive": QoSProfile(priority=3, target_p95_ms=50, target_p99_ms=100),
    "responsive": QoSProfile(priority=2, target_p95_ms=100, target_p99_ms=200),
    "batch": QoSProfile(priority=1, target_p95_ms=1000, target_p99_ms=5000),
}
DEFAULT_QOS_DISTRIBUTION = {"interactive": 0.15, "responsive": 0.35, "batch": 0.50}


class EvictionConfig(_Section):
    target_usage_ratio: float = Field(0.8, gt=0, le=1)
    large_entry_limit_ratio: float = Field(0.95, gt=0, le=1)


class SystemPrompt(_Section):
    text: str
    tokens: int = Field(gt=0)


class PrefixCacheConfig(_Section):
    # The three common system prompts of the MLPerf spec, with a realistic prefix length each.
    system_prompts: list[SystemPrompt] = Field(
        default_factory=lambda: [
            SystemPrompt(text="You are a helpful assistant.", tokens=512),
            SystemPrompt(text="You are an AI assistant helping with coding tasks.", tokens=1024),
            SystemPrompt(text="You are a professional writing assistant.", tokens=768),
        ]
    )
    # Share of conversations that start with one of the system prompts.
    probability: float = Field(0.8, ge=0, le=1)


class RAGConfig(_Section):
    chunk_tokens: int = Field(512, gt=0)
    chunks_per_doc: int = Field(8, gt=0)
    top_k: int = Field(5, gt=0)
    # Share of requests that are RAG queries (read top_k chunks as a burst before prefill).
    probability: float = Field(0.3, ge=0, le=1)


class ConversationConfig(_Section):
    end_probability: float = Field(0.2, ge=0, le=1)
    max_turns: int = Field(64, ge=1)


class AutoscalerConfig(_Section):
    interval_s: float = Field(5.0, gt=0)
    min_users: int = Field(1, ge=1)
    max_users: int = Field(10_000, ge=1)
    scale_up_factor: float = Field(1.2, gt=1)
    scale_down_factor: float = Field(0.8, gt=0, lt=1)
    cooldown_s: float = Field(30.0, ge=0)
    # qos mode holds saturation within +- band around the target.
    band: float = Field(0.1, gt=0, lt=1)
    # capacity mode: ramp factor while throughput grows fast, then the fine-tune factor.
    ramp_factor: float = Field(2.0, gt=1)
    fine_factor: float = Field(1.5, gt=1)
    fast_growth: float = Field(0.2, gt=0)


class DecodeConfig(_Section):
    batch_size: int = Field(32, ge=1)


class GenerationConfig(_Section):
    ms_per_token: dict[Literal["none", "fast", "realistic"], float] = Field(
        default_factory=lambda: {"none": 0.0, "fast": 2.0, "realistic": 30.0}
    )


class ShareGPTConfig(_Section):
    min_turns: int = Field(1, ge=1)
    max_turn_tokens: int | None = Field(None, gt=0)


class ModelConfig(_Section):
    num_layers: int = Field(gt=0)
    kv_heads: int = Field(0, ge=0)
    head_dim: int = Field(0, ge=0)
    kv_lora_rank: int = Field(0, ge=0)
    qk_rope_head_dim: int = Field(0, ge=0)
    # The model's context length (max_position_embeddings); 0 = not known (requests bounded by the tiers only).
    max_context_tokens: int = Field(0, ge=0)


class BenchConfig(_Section):
    # ---- what is simulated
    model: str = "tiny-1b"
    kv_dtype: Literal["bf16", "fp16", "fp8", "int8", "fp32"] = "bf16"
    num_users: int = Field(100, ge=1, le=100_000)
    duration: float = Field(60.0, gt=0, le=7 * 24 * 3600)
    max_requests: int = Field(0, ge=0)
    request_rate: float = Field(0.0, ge=0)
    seed: int | None = Field(None, ge=0, lt=2**63)
    # Lowers the bound on a request's tokens below the model's context length (longer rows and turns are cut to it).
    max_context_tokens: int | None = Field(None, gt=0)
    disable_multi_turn: bool = False
    disable_prefix_caching: bool = False
    generation_mode: Literal["none", "fast", "realistic"] = "none"
    performance_profile: Literal["latency", "throughput"] = "latency"
    prefill_only: bool = False
    decode_only: bool = False
    enable_rag: bool = False
    rag_num_docs: int = Field(10, ge=1)
    enable_autoscaling: bool = False
    autoscaler_mode: Literal["qos", "capacity"] = "qos"
    target_saturation: float = Field(0.8, gt=0, lt=1)
    # ---- workload sources
    dataset_path: str | None = None
    max_conversations: int = Field(500, ge=1)
    use_burst_trace: bool = False
    burst_trace_path: str | None = None
    trace_speedup: float = Field(1.0, ge=0)
    replay_cycles: int = Field(0, ge=0)
    # ---- tiers
    gpu_mem_gb: float | None = Field(None, ge=0, le=100_000)
    cpu_mem_gb: float = Field(4.0, ge=0, le=100_000)
    cache_dir: str | None = None
    storage_capacity_gb: float = Field(0.0, ge=0, le=10_000_000)
    io_mode: Literal["direct", "buffered"] = "direct"
    promote_on_hit: bool = False
    # ---- execution
    max_concurrent_allocs: int = Field(0, ge=0)
    io_workers: int = Field(8, ge=1, le=1024)
    random_buffer_mb: int = Field(256, ge=16, le=16384)
    precondition: bool = False
    precondition_size_gb: float = Field(0.0, ge=0)
    precondition_threads: int = Field(0, ge=0, le=256)
    num_clients: int = Field(1, ge=1, le=256)
    # ---- output
    output: str | None = None
    xlsx_output: str | None = None
    csv_output: str | None = None
    io_trace_log: str | None = None
    plots: str | None = None
    keep_cache: bool = False
    progress: bool = True
    enable_latency_tracing: bool = False
    # ---- config.yaml sections
    user_templates: dict[str, UserTemplate] = Field(default_factory=lambda: dict(DEFAULT_USER_TEMPLATES))
    qos_profiles: dict[str, QoSProfile] = Field(default_factory=lambda: dict(DEFAULT_QOS))
    qos_distribution: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_QOS_DISTRIBUTION))
    # How storage operations of different classes share the I/O workers: fair = weighted fair queuing (every class
    # with work waiting gets a share in proportion to its qos_profiles weight: priority, not starvation); strict =
    # the higher priority always first (lower classes can complete nothing while storage is saturated).
    qos_scheduler: Literal["fair", "strict"] = "fair"
    eviction: EvictionConfig = Field(default_factory=EvictionConfig)
    prefix_cache: PrefixCacheConfig = Field(default_factory=PrefixCacheConfig)
    rag: RAGConfig = Field(default_factory=RAGConfig)
    conversation: ConversationConfig = Field(default_factory=ConversationConfig)
    autoscaler: AutoscalerConfig = Field(default_factory=AutoscalerConfig)
    decode: DecodeConfig = Field(default_factory=DecodeConfig)
    generation: GenerationConfig = Field(default_factory=GenerationConfig)
    sharegpt: ShareGPTConfig = Field(default_factory=ShareGPTConfig)
    model_configs: dict[str, ModelConfig] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> BenchConfig:
        if not self.user_templates:
            raise ValueError("user_templates: at least one template is needed")
        if self.prefill_only and self.decode_only:
            raise ValueError("--prefill-only and --decode-only exclude each other")
        if self.use_burst_trace and not self.burst_trace_path:
            raise ValueError("--use-burst-trace needs --burst-trace-path FILE|DIR|GLOB")
        if self.use_burst_trace and self.dataset_path:
            raise ValueError("--use-burst-trace and --dataset-path exclude each other: pick one workload source")
        unknown = set(self.qos_distribution) - set(self.qos_profiles)
        if unknown:
            raise ValueError(f"qos_distribution names classes not in qos_profiles: {sorted(unknown)}")
        if (
            not self.qos_distribution
            or sum(self.qos_distribution.values()) <= 0
            or min(self.qos_distribution.values()) < 0
        ):
            raise ValueError("qos_distribution needs non-negative shares with a positive sum")
        if self.enable_latency_tracing and self.num_clients > 1:
            raise ValueError("--enable-latency-tracing traces one process: not with --num-clients")
        if self.autoscaler.min_users > self.autoscaler.max_users:
            raise ValueError("autoscaler.min_users must not exceed autoscaler.max_users")
        return self

    @property
    def ms_per_token(self) -> float:
        return self.generation.ms_per_token.get(self.generation_mode, 0.0)


ENV_PREFIX = "KVTIER_"


def load_config(yaml_path: str | None, cli: dict, flag_paths: dict[str, tuple[str, ...]] | None = None) -> BenchConfig:
    """Defaults < the YAML file < KVTIER_<KEY> env < the flags in `cli` (by argparse dest; `flag_paths` maps a
    dest that sets a section key to its path). ConfigError with one line naming the flag, variable or file."""
    return load_settings(BenchConfig, config_path=yaml_path, env_prefix=ENV_PREFIX, flags=cli, flag_paths=flag_paths)
