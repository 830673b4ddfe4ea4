"""The one validated configuration of `kvtier bench`: defaults < YAML file (`--config`) < KVTIER_* env < CLI flags,
merged by replay.common.settings (the same loader as `kvtier replay`).

Top-level keys are the MLPerf Storage KV Cache benchmark's flags (underscored); sections are its config.yaml sections
(user_templates, qos_profiles, qos_distribution, eviction, prefix_cache, rag, conversation, autoscaler, decode,
generation, sharegpt, model_configs). Unknown keys are errors, and every key is used by the run (tests prove it).

The reference implementation's own config.yaml is accepted as it is: its key names are aliases of kvtier's
(`context_range` = `context_tokens`), the two keys whose form differs (`generation_timing` in seconds,
`qos_distribution` as thresholds) are converted, and its keys kvtier has no use for are accepted and named in the
run's notes. `mlperf_config.REFERENCE_KEYS` lists every reference key with what it means in both.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator

from kvconnector.units import GB
from replay.models import CATALOG
from replay.sources.block_traces import MAX_BLOCK_TOKENS
from replay.sources.trace_timing import DEFAULT_MAX_IDLE_S, TIMINGS

from ..common.settings import load_settings
from .mlperf_config import check_validation_limits, from_reference


def _also(name: str, reference: str):
    """Accept the MLPerf reference's name for the same key (errors name the one the user wrote)."""
    return AliasChoices(name, reference)


DEFAULT_IO_WORKERS = 8
# --use-burst-trace without --burst-trace-path reads this file (relative to the working directory), as the reference
# does: the trace's place in a clone of the BurstGPT repository.
REFERENCE_BURST_TRACE_PATH = "BurstGPT/data/BurstGPT_1.csv"
# The reference's --gpu-mem-gb and --cpu-mem-gb defaults (its kv_cache/cli.py): kvtier's in the trace-only mode.
REFERENCE_GPU_MEM_GB = 16.0
REFERENCE_CPU_MEM_GB = 32.0
GIB = 1 << 30
# What one unit of the size keys (gpu_mem_gb, cpu_mem_gb, storage_capacity_gb, precondition_size_gb) is in bytes:
# the reference reads its size flags as GiB (its cache.py multiplies by 1024**3), so kvtier does by default; GB
# (10**9, as disks and kvtier's result keys count) on request.
SIZE_UNITS = {"GiB": GIB, "GB": GB}
# The reference runs min(num_users, 500) request threads.
REFERENCE_MAX_WORKERS = 500


class _Section(BaseModel):
    # inf and nan are never a sensible size, rate or time: reject them everywhere.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


def _check_range(name: str, rng: tuple, minimum: float = 0) -> None:
    lo, hi = rng
    if lo < minimum or hi < lo:
        raise ValueError(f"{name} must be [low, high] with {minimum} <= low <= high, got {list(rng)}")


def _drop_shadowed(model: type[BaseModel], section: dict) -> dict:
    """The section without the reference's name of a key whose kvtier name is also there."""
    out = dict(section)
    for name, field in model.model_fields.items():
        if isinstance(field.validation_alias, AliasChoices) and name in out:
            for alias in field.validation_alias.choices:
                if alias != name:
                    out.pop(alias, None)
    return out


class UserTemplate(_Section):
    context_tokens: tuple[int, int] = Field(validation_alias=_also("context_tokens", "context_range"))
    generate_tokens: tuple[int, int] = Field(validation_alias=_also("generate_tokens", "generation_range"))
    think_time_s: tuple[float, float] = Field(validation_alias=_also("think_time_s", "think_time_range"))
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
    target_p95_ms: float = Field(gt=0, validation_alias=_also("target_p95_ms", "target_latency_p95_ms"))
    target_p99_ms: float = Field(gt=0, validation_alias=_also("target_p99_ms", "target_latency_p99_ms"))
    # The reference's three- and four-nines targets; when given, the SLA is judged at those percentiles too.
    target_p999_ms: float | None = Field(None, gt=0, validation_alias=_also("target_p999_ms", "target_latency_p999_ms"))
    target_p9999_ms: float | None = Field(
        None, gt=0, validation_alias=_also("target_p9999_ms", "target_latency_p9999_ms")
    )
    # Share of the I/O workers under saturation, relative to the other classes (qos_scheduler fair); default
    # 2 ** priority (8, 4, 2 for interactive, responsive, batch).
    weight: float | None = Field(None, gt=0)

    def targets(self) -> dict[float, float]:
        """Percentile -> target in ms, for every target the profile has."""
        out = {95.0: self.target_p95_ms, 99.0: self.target_p99_ms}
        if self.target_p999_ms is not None:
            out[99.9] = self.target_p999_ms
        if self.target_p9999_ms is not None:
            out[99.99] = self.target_p9999_ms
        return out

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
    # The reference's safety limits on its recursive eviction. kvtier's store needs none (making room is a loop over
    # one tier's LRU, a demotion goes one tier down, never fails a put while a victim exists): accepted, noted, unused.
    max_recursion_depth: int | None = Field(None, ge=1)
    max_evictions_hard_cap: int | None = Field(None, ge=1)
    max_evictions_min: int | None = Field(None, ge=0)


class GPUBackendConfig(_Section):
    # The reference sizes its GPU tier from the device (memory_fraction) and retries on CUDA OOM; kvtier's GPU tier is
    # exactly --gpu-mem-gb, allocated up front: accepted, noted, unused.
    memory_fraction: float | None = Field(None, gt=0, le=1)
    max_eviction_attempts: int | None = Field(None, ge=0)
    free_memory_threshold: float | None = Field(None, ge=0, lt=1)


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
    probability: float = Field(0.8, ge=0, le=1, validation_alias=_also("probability", "system_prompt_hit_probability"))
    # System prompts shorter than this many tokens are not cached (no prefix entry is read or written for them).
    min_prefix_length: int = Field(0, ge=0)
    # At most this many distinct system prompts (the first ones) have cached prefixes; 0 = all of them.
    max_prefix_entries: int = Field(0, ge=0)


class RAGConfig(_Section):
    chunk_tokens: int = Field(512, gt=0, validation_alias=_also("chunk_tokens", "chunk_size_tokens"))
    chunks_per_doc: int = Field(8, gt=0)
    top_k: int = Field(5, gt=0, validation_alias=_also("top_k", "top_k_chunks"))
    # Share of requests that are RAG queries (read top_k chunks as a burst before prefill).
    probability: float = Field(0.3, ge=0, le=1, validation_alias=_also("probability", "request_probability"))
    # A chunk entry holds at most this many bytes (its tokens are cut to fit); None = no cap.
    max_chunk_bytes: int | None = Field(None, gt=0)
    # Which documents a query reads: zipfian favours the first documents (1/rank), uniform (or random) does not.
    retrieval_distribution: Literal["zipfian", "uniform", "random"] = "zipfian"
    # Cap on the documents ingested (--rag-num-docs is cut to it); 0 = no cap.
    max_documents: int = Field(0, ge=0)
    # Document sizes in tokens, drawn per document: a document has ceil(tokens / chunk_tokens) chunks instead of
    # chunks_per_doc. "large" applies to models with hidden_dim >= 8192 or >= 64 layers (as the reference decides).
    large_model_doc_tokens_min: int | None = Field(None, gt=0)
    large_model_doc_tokens_max: int | None = Field(None, gt=0)
    small_model_doc_tokens_min: int | None = Field(None, gt=0)
    small_model_doc_tokens_max: int | None = Field(None, gt=0)

    def chunk_tokens_for(self, bytes_per_token: int) -> int:
        """Tokens one chunk entry holds: chunk_tokens, cut so it stays within max_chunk_bytes."""
        if self.max_chunk_bytes is None:
            return self.chunk_tokens
        return max(1, min(self.chunk_tokens, self.max_chunk_bytes // bytes_per_token))


class ConversationConfig(_Section):
    end_probability: float = Field(
        0.2, ge=0, le=1, validation_alias=_also("end_probability", "end_conversation_probability")
    )
    # Turns are made as a run reaches them (replay/sources/synthetic_users.py), so a large cap costs nothing; 10^12
    # is more than any run sends (a turn a microsecond for eleven days) and keeps a length a Python sequence holds.
    max_turns: int = Field(64, ge=1, le=10**12, validation_alias=_also("max_turns", "max_turns_per_conv"))
    # The reference's cap on conversations it keeps state for. kvtier keeps none beyond each user's current
    # conversation (one per user, so never more than --num-users): accepted, noted, unused.
    max_conversations: int | None = Field(None, ge=1)


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
    # The reference's count of agreeing samples before a scale step; kvtier decides once per interval_s, so this is
    # accepted, noted, unused (lengthen interval_s for the same damping).
    consecutive_samples_required: int | None = Field(None, ge=1)


class SaturationDetectionConfig(_Section):
    # The reference's storage-saturation heuristics (latency and queue-depth thresholds over a sample window). kvtier
    # measures saturation directly (busy share of the I/O workers; SLAs per class): accepted, noted, unused.
    read_latency_p95_threshold_ms: float | None = Field(None, gt=0)
    write_latency_p95_threshold_ms: float | None = Field(None, gt=0)
    queue_depth_threshold: int | None = Field(None, ge=1)
    history_window_size: int | None = Field(None, ge=1)


class ValidationLimitsConfig(_Section):
    # Upper bounds on the run's size: a value above one is an error (exit 2) naming the limit. None = no bound.
    max_users: int | None = Field(None, ge=1)
    max_duration_seconds: float | None = Field(None, gt=0)
    max_gpu_memory_gb: float | None = Field(None, ge=0)
    max_cpu_memory_gb: float | None = Field(None, ge=0)


# A per-class or per-mode value (ms per token, a class's share): a time or a share is never negative.
NonNegative = Annotated[float, Field(ge=0)]

# The size keys whose 0 means "none" or "auto" (storage): any other value must be at least one byte.
SIZE_KEYS = ("gpu_mem_gb", "cpu_mem_gb", "storage_capacity_gb", "precondition_size_gb")


class DecodeConfig(_Section):
    batch_size: int = Field(32, ge=1)


class GenerationConfig(_Section):
    ms_per_token: dict[Literal["none", "fast", "realistic"], NonNegative] = Field(
        default_factory=lambda: {"none": 0.0, "fast": 2.0, "realistic": 30.0}
    )
    # --prefix-model chained: simulated GPU time per prompt token the server computes (new tokens and every token it
    # recomputes after a prefix miss), by generation mode.
    prefill_ms_per_token: dict[Literal["none", "fast", "realistic"], NonNegative] = Field(
        default_factory=lambda: {"none": 0.0, "fast": 0.02, "realistic": 0.2}
    )


class ShareGPTConfig(_Section):
    min_turns: int = Field(1, ge=1)
    max_turn_tokens: int | None = Field(None, gt=0)
    # A turn's input / answer tokens are cut to these (counted in the load report), as the reference truncates.
    max_context_tokens: int | None = Field(None, gt=0)
    max_generation_tokens: int | None = Field(None, gt=0)
    # Characters per token when tiktoken's cl100k_base data is not on the machine (the load report says which).
    chars_per_token_estimate: float = Field(4.0, gt=0)


class ModelConfig(_Section):
    # A label for the results (the reference's display name); the key under model_configs is what --model selects.
    name: str | None = None
    num_layers: int = Field(gt=0)
    kv_heads: int = Field(0, ge=0)
    head_dim: int = Field(0, ge=0, validation_alias=_also("head_dim", "kv_dim_per_head"))
    # The reference's shape keys: head_dim = hidden_dim / num_heads when head_dim is not given.
    hidden_dim: int = Field(0, ge=0)
    num_heads: int = Field(0, ge=0)
    # The KV element type of this model, used when --kv-dtype / kv_dtype is not given (float16 = fp16, ...).
    dtype: Literal["float16", "bfloat16", "float32", "fp16", "bf16", "fp32", "fp8", "int8"] | None = None
    # mla needs kv_lora_rank (bytes per token from the latent); mha/gqa use kv_heads x head_dim.
    attention_type: Literal["mha", "gqa", "mqa", "mla"] | None = None
    kv_lora_rank: int = Field(0, ge=0)
    qk_rope_head_dim: int = Field(0, ge=0)
    # The model's context length (max_position_embeddings); 0 = not known (a catalog model of the same name lends
    # its own; else requests are bounded by the tiers only).
    max_context_tokens: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _shape(self) -> ModelConfig:
        if self.attention_type == "mla" and not self.kv_lora_rank:
            raise ValueError("attention_type mla needs kv_lora_rank")
        if self.kv_lora_rank or self.attention_type == "mla":
            return self
        if not self.head_dim and not (self.hidden_dim and self.num_heads):
            raise ValueError("give head_dim (or kv_dim_per_head), or hidden_dim and num_heads")
        if not self.head_dim and self.hidden_dim % self.num_heads:
            raise ValueError(f"hidden_dim {self.hidden_dim} is not a multiple of num_heads {self.num_heads}")
        if not self.kv_heads and not self.num_heads:
            raise ValueError("give kv_heads (or num_heads, for a model without grouped KV heads)")
        return self

    def spec_fields(self, key: str) -> dict:
        """The replay.models.ModelSpec fields of this model (the shape keys resolved); a model of the catalog
        redefined under its own name (the reference's config.yaml does that) keeps the catalog's context length."""
        known = CATALOG.get(key)
        return {
            "num_layers": self.num_layers,
            "kv_heads": self.kv_heads or self.num_heads,
            "head_dim": self.head_dim or (self.hidden_dim // self.num_heads if self.num_heads else 0),
            "kv_lora_rank": self.kv_lora_rank,
            "qk_rope_head_dim": self.qk_rope_head_dim,
            "max_context_tokens": self.max_context_tokens or (known.max_context_tokens if known else 0),
        }


def check_storage_backend(cfg: BenchConfig) -> None:
    """Each storage flag is read by its backend only, and an object store's run says how much it may hold."""
    defaults = type(cfg).model_fields
    if cfg.storage_backend == "disk":
        for key in ("s3_bucket", "s3_endpoint"):
            if getattr(cfg, key) is not None:
                raise ValueError(f"--{key.replace('_', '-')} is read with --storage-backend s3 only")
        return
    if not cfg.s3_bucket:
        raise ValueError("--storage-backend s3 needs --s3-bucket NAME (a bucket that exists)")
    if not cfg.storage_capacity_gb:
        raise ValueError(
            "--storage-backend s3 needs --storage-capacity-gb (0 means a filesystem's free space; a bucket has none "
            "to measure)"
        )
    for key, what in (("io_mode", "the disk tier's I/O"), ("sync", "the disk tier's durability")):
        if getattr(cfg, key) != defaults[key].default:
            raise ValueError(f"--{key.replace('_', '-')} sets {what}: not read with --storage-backend s3")
    if cfg.precondition:
        raise ValueError("--precondition writes a device's file to reach steady state: not with --storage-backend s3")


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
    # The reference accepts 0.0-1.0 inclusive (kv_cache/workload.py, validate_args).
    target_saturation: float = Field(0.8, ge=0, le=1)
    # ---- workload sources
    dataset_path: str | None = None
    max_conversations: int = Field(500, ge=1)
    use_burst_trace: bool = False
    burst_trace_path: str | None = None
    # 0 = no delay; else at least registry.MIN_TRACE_SPEEDUP (checked in _check).
    trace_speedup: float = Field(1.0, ge=0)
    # A block-hash trace at dataset_path (replay.sources.registry.block_trace_names()) replayed block by block on
    # the store, with the plan's per-tier prediction beside the measured hit rates (replay/synthetic/trace_blocks.py).
    source: str | None = None
    # The trace's block in tokens (lengths scaled with it); None = its format's own.
    trace_block_tokens: int | None = Field(None, ge=1, le=MAX_BLOCK_TOKENS)
    # When the trace's requests start (replay/sources/trace_timing.py): timestamps (open loop) or think (each session's
    # calls closed loop, a call its pause after the call it follows ended; pauses capped at max_idle_s).
    trace_timing: Literal[TIMINGS] = "timestamps"  # type: ignore[valid-type]
    max_idle_s: float = Field(DEFAULT_MAX_IDLE_S, gt=0)
    # --source hit-rate (given --target-hit-rate, it is the source): sessions whose prefix hit rate at a cache of
    # cache_tokens (None: what the store's tiers hold) is the target (replay/sources/target_hit_rate.py); input_len
    # and output_len are each turn's tokens.
    target_hit_rate: float | None = Field(None, ge=0, le=1)
    cache_tokens: float | None = Field(None, gt=0)
    input_len: int = Field(2048, ge=1)
    output_len: int = Field(128, ge=1)
    replay_cycles: int = Field(0, ge=0)
    # ---- tiers (sizes in size_unit: GiB as the reference reads them, or GB)
    size_unit: Literal["GiB", "GB"] = "GiB"
    gpu_mem_gb: float | None = Field(None, ge=0, le=100_000)
    # The reference's multi-GPU node: the GPU tier holds num_gpus x gpu_mem_gb, and with tensor_parallel TP each rank
    # stores 1/TP of every entry (the entries written and read are bytes_per_token / TP per token).
    num_gpus: int = Field(1, ge=1, le=4096)
    tensor_parallel: int = Field(1, ge=1, le=4096)
    cpu_mem_gb: float = Field(4.0, ge=0, le=100_000)
    cache_dir: str | None = None
    storage_capacity_gb: float = Field(0.0, ge=0, le=10_000_000)
    io_mode: Literal["direct", "buffered"] = "direct"
    # When a disk-tier write is durable (kvconnector.timed_io.Sync): entry = before it completes; none = at writeback.
    sync: Literal["entry", "none"] = "entry"
    # Where the storage tier lives: disk = files under cache_dir; s3 = one object per entry in the bucket s3_bucket,
    # under a prefix of the run's own (endpoint s3_endpoint, else boto3's AWS_ENDPOINT_URL; credentials as boto3 finds
    # them: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile). Objects left at the end are deleted (keep_cache keeps).
    storage_backend: Literal["disk", "s3"] = "disk"
    s3_bucket: str | None = None
    s3_endpoint: str | None = None
    promote_on_hit: bool = False
    # ---- execution
    max_concurrent_allocs: int = Field(0, ge=0)
    # kvtier: a turn's entry holds the tokens it adds (what engines store); reference: the MLPerf reference's request
    # semantics (whole-context entries, every earlier turn re-read, >= 10k-token requests prefill only, and
    # max_concurrent_allocs 0 = no bound on requests doing I/O at once). See the README's "Request models".
    request_model: Literal["kvtier", "reference"] = "reference"
    # entries: a turn's KV is one entry (above). chained: a session's KV is a chain of block_size-token blocks, each
    # an entry, reused only up to the first block missing from every tier; sessions run in lockstep rounds
    # (replay/synthetic/chained.py).
    prefix_model: Literal["entries", "chained"] = "entries"
    block_size: int = Field(256, ge=1, le=1_048_576)
    # chained: turns per session (every session runs exactly this many); 0 = each conversation's own length.
    rounds: int = Field(0, ge=0, le=1_000_000)
    # None: 8, or with request_model reference one per user up to 500 (see effective_io_workers).
    io_workers: int | None = Field(None, ge=1, le=1024)
    random_buffer_mb: int = Field(256, ge=16, le=16384)
    precondition: bool = False
    precondition_size_gb: float = Field(0.0, ge=0)
    precondition_threads: int = Field(0, ge=0, le=256)
    num_clients: int = Field(1, ge=1, le=256)
    # ---- output
    output: str | None = None
    xlsx_output: str | None = None
    csv_output: str | None = None
    # The reference's trace mode: no device I/O (every tier a no-op of the same capacity), one row per operation
    # in the reference's CSV columns, for replaying elsewhere (see replay/outputs/io_trace.py).
    io_trace_log: str | None = None
    # kvtier's log of the real operations of a run, with their host and device times.
    io_op_log: str | None = None
    # The reference's --validation-trace: a JSON list of a real system's requests; the run's hit rate is compared
    # with the trace's (replay/synthetic/validation_trace.py).
    validation_trace: str | None = None
    plots: str | None = None
    # kvtier report's page of this run (replay/outputs/html), written after the results JSON
    html_output: str | None = None
    keep_cache: bool = False
    progress: bool = True
    enable_latency_tracing: bool = False
    # ---- config.yaml sections
    user_templates: dict[str, UserTemplate] = Field(default_factory=lambda: dict(DEFAULT_USER_TEMPLATES))
    qos_profiles: dict[str, QoSProfile] = Field(default_factory=lambda: dict(DEFAULT_QOS))
    qos_distribution: dict[str, NonNegative] = Field(default_factory=lambda: dict(DEFAULT_QOS_DISTRIBUTION))
    # How storage operations of different classes share the I/O workers: fair = weighted fair queuing (every class
    # with work waiting gets a share in proportion to its qos_profiles weight: priority, not starvation); strict =
    # the higher priority always first (lower classes can complete nothing while storage is saturated).
    qos_scheduler: Literal["fair", "strict"] = "fair"
    eviction: EvictionConfig = Field(default_factory=EvictionConfig)
    gpu_backend: GPUBackendConfig = Field(default_factory=GPUBackendConfig)
    prefix_cache: PrefixCacheConfig = Field(default_factory=PrefixCacheConfig)
    rag: RAGConfig = Field(default_factory=RAGConfig)
    conversation: ConversationConfig = Field(default_factory=ConversationConfig)
    autoscaler: AutoscalerConfig = Field(default_factory=AutoscalerConfig)
    decode: DecodeConfig = Field(default_factory=DecodeConfig)
    generation: GenerationConfig = Field(default_factory=GenerationConfig)
    sharegpt: ShareGPTConfig = Field(default_factory=ShareGPTConfig)
    saturation_detection: SaturationDetectionConfig = Field(default_factory=SaturationDetectionConfig)
    validation_limits: ValidationLimitsConfig = Field(default_factory=ValidationLimitsConfig)
    model_configs: dict[str, ModelConfig] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _reference(cls, data):
        # The reference's config.yaml forms that are not plain aliases (see mlperf_config.from_reference), and a
        # flag that sets a section key (--rag-top-k) winning over the reference's name for it in the file.
        data = from_reference(data, GenerationConfig().ms_per_token)
        if isinstance(data, dict) and data.get("prefix_model") == "chained" and "request_model" not in data:
            # The chained prefix model is kvtier's own model of requests (block chains, lockstep rounds): unless the
            # user asks for another, it runs with kvtier's request model, not the default reference one.
            data["request_model"] = "kvtier"
        if isinstance(data, dict) and data.get("io_trace_log"):
            # The trace-only mode holds no memory in any tier, so what keeps kvtier's tier defaults small does not
            # apply: the reference's defaults, so that its trace commands (docs/io_trace_log_usage.md) trace the
            # same tiers.
            if data.get("gpu_mem_gb") is None:
                data["gpu_mem_gb"] = REFERENCE_GPU_MEM_GB
            data.setdefault("cpu_mem_gb", REFERENCE_CPU_MEM_GB)
        if isinstance(data, dict) and data.get("use_burst_trace") and not data.get("burst_trace_path"):
            data["burst_trace_path"] = REFERENCE_BURST_TRACE_PATH  # the reference's default (its cli.py)
        if isinstance(data, dict):
            for name, field in cls.model_fields.items():
                section = data.get(name)
                kind = field.annotation
                if isinstance(section, dict) and isinstance(kind, type) and issubclass(kind, BaseModel):
                    data[name] = _drop_shadowed(kind, section)
        return data

    @model_validator(mode="after")
    def _check(self) -> BenchConfig:
        check_validation_limits(self)
        for key in SIZE_KEYS:
            size = getattr(self, key)
            if size and self.size_bytes(size) < 1:  # 1e-12 would be 0 bytes, and 0 means the opposite
                zero = "auto: the free space" if key == "storage_capacity_gb" else "none"
                raise ValueError(
                    f"--{key.replace('_', '-')} {size:g} is less than one byte (0 means {zero}); a tier that "
                    "should hold nothing can be a few bytes"
                )
        if not self.user_templates:
            raise ValueError("user_templates: at least one template is needed")
        if self.prefill_only and self.decode_only:
            raise ValueError("--prefill-only and --decode-only exclude each other")
        if self.use_burst_trace and self.dataset_path:
            raise ValueError("--use-burst-trace and --dataset-path exclude each other: pick one workload source")
        from replay.sources.registry import (
            BENCH_TRACE_READS,
            MIN_TRACE_SPEEDUP,
            block_trace_names,
            check_reads,
            check_source,
        )

        if 0 < self.trace_speedup < MIN_TRACE_SPEEDUP:
            raise ValueError(
                f"--trace-speedup {self.trace_speedup:g}: 0 (no delay) or at least {MIN_TRACE_SPEEDUP:g} (a thousand "
                "times slower than recorded)"
            )
        if self.target_hit_rate is not None and self.source is None:
            self.source = "hit-rate"  # the target names the workload; no --source needed
        if self.source == "hit-rate" and self.target_hit_rate is None:
            raise ValueError("--source hit-rate needs --target-hit-rate R")
        if self.source is not None:
            source = check_source(self.source, {"--dataset-path": self.dataset_path}, choices=block_trace_names())
            check_reads(self, source, BENCH_TRACE_READS)
        else:
            give = f"a block-hash trace: give --source ({', '.join(block_trace_names())})"
            for key, what in (
                ("trace_block_tokens", f"rescales {give}"),
                ("trace_timing", f"paces {give}"),
                ("max_idle_s", f"paces {give}"),
                ("cache_tokens", "sizes the sessions of --target-hit-rate R: give it"),
                ("input_len", "sizes the sessions of --target-hit-rate R: give it"),
                ("output_len", "sizes the sessions of --target-hit-rate R: give it"),
            ):
                if getattr(self, key) != type(self).model_fields[key].default:
                    raise ValueError(f"--{key.replace('_', '-')} {what}")
        unknown = set(self.qos_distribution) - set(self.qos_profiles)
        if unknown:
            raise ValueError(f"qos_distribution names classes not in qos_profiles: {sorted(unknown)}")
        if (
            not self.qos_distribution
            or sum(self.qos_distribution.values()) <= 0
            or min(self.qos_distribution.values()) < 0
        ):
            raise ValueError("qos_distribution needs non-negative shares with a positive sum")
        if self.tensor_parallel > self.num_gpus:
            raise ValueError(
                f"--tensor-parallel {self.tensor_parallel} exceeds --num-gpus {self.num_gpus}: a rank is one GPU "
                "(give 1 <= TP <= num_gpus)"
            )
        if self.enable_latency_tracing and self.io_trace_log:
            raise ValueError("--enable-latency-tracing traces device I/O, and --io-trace-log runs without any")
        if self.enable_latency_tracing and self.num_clients > 1:
            raise ValueError("--enable-latency-tracing traces one process: not with --num-clients")
        if self.prefix_model == "chained":
            clash = [
                flag
                for flag, on in (
                    ("--request-model reference", self.request_model == "reference"),
                    ("--decode-only", self.decode_only),
                    ("--enable-autoscaling", self.enable_autoscaling),
                    ("--num-clients > 1", self.num_clients > 1),
                    ("a timed trace (--trace-speedup > 0)", self.use_burst_trace and self.trace_speedup > 0),
                )
                if on
            ]
            if clash:
                raise ValueError(f"--prefix-model chained runs fixed sessions in rounds: not with {clash[0]}")
        check_storage_backend(self)
        if self.autoscaler.min_users > self.autoscaler.max_users:
            raise ValueError("autoscaler.min_users must not exceed autoscaler.max_users")
        return self

    @property
    def effective_io_workers(self) -> int:
        """Threads doing storage I/O: io_workers when given; else 8, or with request_model reference the reference's
        bound, one per user up to 500 (its request threads each do their I/O synchronously)."""
        if self.io_workers is not None:
            return self.io_workers
        return min(self.num_users, REFERENCE_MAX_WORKERS) if self.request_model == "reference" else DEFAULT_IO_WORKERS

    def as_run(self, **ran) -> BenchConfig:
        """This config as a run used it, for results files: each key of AUTO_KEYS left out (None: its meaning can
        depend on the host, --gpu-mem-gb being 16 with CUDA and 0 without) set to the value `ran` gives it, io_workers
        (when `ran` has none) to effective_io_workers, and each QoS class's weight to its share. A reader then needs
        neither the host nor this version's defaults; a key still None means none (no context length known, no
        one seed in `kvtier merge` of runs with their own)."""
        update: dict = {k: v for k, v in ran.items() if k in AUTO_KEYS and getattr(self, k) is None and v is not None}
        update.setdefault("io_workers", self.effective_io_workers)
        update["qos_profiles"] = {n: p.model_copy(update={"weight": p.share}) for n, p in self.qos_profiles.items()}
        return self.model_copy(update=update)

    @property
    def trace_only(self) -> bool:
        """The reference's trace mode (--io-trace-log): the same requests and tier decisions, no device I/O."""
        return self.io_trace_log is not None

    def size_bytes(self, size: float) -> int:
        """A size key's value in bytes (size_unit: GiB or GB)."""
        return int(size * SIZE_UNITS[self.size_unit])

    @property
    def ms_per_token(self) -> float:
        return self.generation.ms_per_token.get(self.generation_mode, 0.0)


# Keys whose None leaves the value to the run (the host's CUDA, the model's context length, the trace's block, a
# random seed): BenchConfig.as_run sets them to what ran before a results file records the config.
AUTO_KEYS = ("seed", "gpu_mem_gb", "io_workers", "max_context_tokens", "trace_block_tokens")

ENV_PREFIX = "KVTIER_"


def load_config(yaml_path: str | None, cli: dict, flag_paths: dict[str, tuple[str, ...]] | None = None) -> BenchConfig:
    """Defaults < the YAML file < KVTIER_<KEY> env < the flags in `cli` (by argparse dest; `flag_paths` maps a
    dest that sets a section key to its path). ConfigError with one line naming the flag, variable or file."""
    return load_settings(BenchConfig, config_path=yaml_path, env_prefix=ENV_PREFIX, flags=cli, flag_paths=flag_paths)
