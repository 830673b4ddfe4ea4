"""The MLPerf KV Cache reference implementation's config.yaml, read by `kvtier bench --config` as it is.

Most of the reference's keys are kvtier keys under another name: the config models accept both names (pydantic
aliases, see config.py), so an error names the key as the user wrote it. Two keys have another form and are
converted here before validation (`from_reference`): `generation_timing` (seconds per token, kvtier's
`generation.ms_per_token` is milliseconds) and `qos_distribution`'s two thresholds (kvtier: one share per class).
A model's `dtype` under `model_configs` sets kv_dtype unless kv_dtype is given.

The reference's internal safety limits (eviction recursion caps, GPU OOM retries, its saturation heuristics, its
cap on conversations kept in memory, the autoscaler's sample count) have nothing to act on in kvtier; they are
validated, kept in the results' config, and named in one note when a file sets them (`unused_key_notes`), never
silently dropped. `REFERENCE_KEYS` is the table of every reference key: its meaning there and here (the README's
table is written from it, and a test checks that each key of the reference-shaped fixture is in it).

This module imports nothing of config.py (config.py imports it), so it works on plain dicts and on the model
duck-typed.
"""

from __future__ import annotations

from numbers import Real

# model_configs.*.dtype -> kvtier's kv_dtype
DTYPES = {
    "float16": "fp16",
    "bfloat16": "bf16",
    "float32": "fp32",
    "fp16": "fp16",
    "bf16": "bf16",
    "fp32": "fp32",
    "fp8": "fp8",
    "int8": "int8",
}

QOS_THRESHOLD_KEYS = ("interactive_probability", "responsive_threshold")


def from_reference(data, default_ms_per_token: dict[str, float]):
    """The reference's forms of `generation_timing`, `qos_distribution` and a model's `dtype`, in kvtier's schema
    (modes that `generation_timing` leaves out keep `default_ms_per_token`, kvtier's defaults). Anything else is left
    for validation (an unknown key stays an error)."""
    if not isinstance(data, dict):
        return data
    data = dict(data)
    if "generation_timing" in data:
        timing = data.pop("generation_timing")
        if not isinstance(timing, dict):
            raise ValueError("generation_timing: expected a mapping of mode to seconds per token")
        gen = data.get("generation")
        if isinstance(gen, dict) and "ms_per_token" in gen:
            raise ValueError("give generation_timing (seconds per token) or generation.ms_per_token, not both")
        ms = {}
        for mode, seconds in timing.items():
            if not isinstance(seconds, Real) or isinstance(seconds, bool) or seconds < 0:
                raise ValueError(f"generation_timing.{mode}: expected seconds per token >= 0, got {seconds!r}")
            ms[mode] = seconds * 1000.0
        data["generation"] = {
            **(gen if isinstance(gen, dict) else {}),
            "ms_per_token": {**default_ms_per_token, **ms},
        }
    dist = data.get("qos_distribution")
    if isinstance(dist, dict) and any(k in dist for k in QOS_THRESHOLD_KEYS):
        others = sorted(set(dist) - set(QOS_THRESHOLD_KEYS))
        if others:
            raise ValueError(
                f"qos_distribution: give the reference's interactive_probability/responsive_threshold or one share "
                f"per class, not both (also got {', '.join(others)})"
            )
        p = dist.get("interactive_probability", 0.15)
        t = dist.get("responsive_threshold", 0.50)
        if not all(isinstance(v, Real) and not isinstance(v, bool) for v in (p, t)) or not 0 <= p <= t <= 1:
            raise ValueError(
                f"qos_distribution: need 0 <= interactive_probability <= responsive_threshold <= 1, got {p!r}, {t!r}"
            )
        # rand < p: interactive; p <= rand < t: responsive; else batch (the reference's draw).
        data["qos_distribution"] = {"interactive": p, "responsive": t - p, "batch": 1 - t}
    models = data.get("model_configs")
    model = data.get("model", "tiny-1b")
    if "kv_dtype" not in data and isinstance(models, dict) and isinstance(models.get(model), dict):
        dtype = models[model].get("dtype")
        if dtype in DTYPES:
            data["kv_dtype"] = DTYPES[dtype]
    return data


def is_large_model(cfg, spec) -> bool:
    """The reference's "large model" (its RAG document sizes): hidden_dim >= 8192 (known from model_configs) or
    >= 64 layers."""
    custom = cfg.model_configs.get(cfg.model)
    return spec.num_layers >= 64 or (custom is not None and custom.hidden_dim >= 8192)


def check_validation_limits(cfg) -> None:
    """validation_limits.*: the run's size within the bounds the file sets (ValueError naming the limit)."""
    vl = cfg.validation_limits
    checks = (
        ("num_users", cfg.num_users, "max_users", vl.max_users),
        ("duration", cfg.duration, "max_duration_seconds", vl.max_duration_seconds),
        ("gpu_mem_gb", cfg.gpu_mem_gb, "max_gpu_memory_gb", vl.max_gpu_memory_gb),
        ("cpu_mem_gb", cfg.cpu_mem_gb, "max_cpu_memory_gb", vl.max_cpu_memory_gb),
    )
    for key, value, limit_key, limit in checks:
        if limit is not None and value is not None and value > limit:
            raise ValueError(f"{key} {value:g} exceeds validation_limits.{limit_key} {limit:g}")


# Keys the reference reads that kvtier accepts without acting on them: section -> keys.
UNUSED = {
    "eviction": ("max_recursion_depth", "max_evictions_hard_cap", "max_evictions_min"),
    "gpu_backend": ("memory_fraction", "max_eviction_attempts", "free_memory_threshold"),
    "conversation": ("max_conversations",),
    "autoscaler": ("consecutive_samples_required",),
    "saturation_detection": (
        "read_latency_p95_threshold_ms",
        "write_latency_p95_threshold_ms",
        "queue_depth_threshold",
        "history_window_size",
    ),
}


def unused_key_notes(cfg) -> list[str]:
    """One note naming the reference keys the config sets that kvtier does not use (empty when none is set)."""
    keys = [
        f"{section}.{key}"
        for section, names in UNUSED.items()
        for key in names
        if getattr(getattr(cfg, section), key) is not None
    ]
    if not keys:
        return []
    return [
        "config keys of the MLPerf reference that kvtier accepts but does not use (its internal limits; see "
        "replay/synthetic/README.md, 'The reference's config.yaml'): " + ", ".join(keys)
    ]


# Every key of the reference's config.yaml: (key, what the reference does with it, what kvtier does with it).
# "same" = the same meaning under kvtier's name (in parentheses); README table rows are written from this.
REFERENCE_KEYS: list[tuple[str, str, str]] = [
    ("user_templates.*.context_range", "prompt tokens [min, max] of a user type", "same (context_tokens)"),
    ("user_templates.*.generation_range", "generated tokens [min, max]", "same (generate_tokens)"),
    ("user_templates.*.think_time_range", "seconds between a user's requests", "same (think_time_s)"),
    (
        "generation_timing.*",
        "listed, not read by its code (built-in 0, 2, 30 ms per token)",
        "used: seconds per token per --generation-mode, as generation.ms_per_token",
    ),
    (
        "qos_profiles.*.target_latency_p95_ms / target_latency_p99_ms",
        "SLA targets",
        "same (target_p95_ms, target_p99_ms)",
    ),
    (
        "qos_profiles.*.target_latency_p999_ms / target_latency_p9999_ms",
        "SLA targets at 99.9 / 99.99 %",
        "the SLA verdict also checks them",
    ),
    ("qos_profiles.*.priority", "higher first", "same; also sets the class's fair share (2^priority)"),
    (
        "qos_distribution.interactive_probability / responsive_threshold",
        "cumulative draw: interactive below the first, responsive below the second",
        "converted to shares interactive / responsive / batch",
    ),
    ("eviction.target_usage_ratio / large_entry_limit_ratio", "tier fill target; entries that skip a tier", "same"),
    (
        "eviction.max_recursion_depth / max_evictions_hard_cap / max_evictions_min",
        "safety caps on its recursive eviction",
        "accepted, noted, unused: kvtier's make-room loop has no recursion to cap",
    ),
    (
        "gpu_backend.*",
        "GPU tier from a fraction of device memory; OOM retries",
        "accepted, noted, unused: the GPU tier is exactly --gpu-mem-gb, allocated up front",
    ),
    (
        "prefix_cache.system_prompt_hit_probability",
        "share of requests with a common system prompt",
        "same (probability)",
    ),
    (
        "prefix_cache.min_prefix_length",
        "shortest prefix worth caching",
        "system prompts shorter than it are not cached",
    ),
    ("prefix_cache.max_prefix_entries", "prefix entries it keeps", "at most this many distinct system prompts cached"),
    ("rag.chunk_size_tokens / top_k_chunks / request_probability", "chunk size; chunks per query; query share", "same"),
    ("rag.max_chunk_bytes", "cap on one chunk's bytes", "same: a chunk's tokens are cut to fit"),
    ("rag.retrieval_distribution", "zipfian or uniform (random) chunk choice", "zipfian or uniform document choice"),
    ("rag.max_documents", "documents before it evicts (0 = no cap)", "caps --rag-num-docs (0 = no cap)"),
    (
        "rag.large_model_doc_tokens_min / large_model_doc_tokens_max / small_model_doc_tokens_min"
        " / small_model_doc_tokens_max",
        "document size range, large or small model",
        "same: chunks per document",
    ),
    (
        "conversation.max_conversations",
        "conversations it keeps state for",
        "accepted, noted, unused: one open conversation per user",
    ),
    ("conversation.max_turns_per_conv / end_conversation_probability", "turn cap; chance to end", "same"),
    (
        "autoscaler.min_users / max_users / scale_up_factor / scale_down_factor",
        "bounds and steps (its qos mode steps by a fixed 1.2 / 0.8)",
        "same: kvtier's qos mode steps by these factors",
    ),
    (
        "autoscaler.consecutive_samples_required",
        "read, not used by its code (it scales down after 2 samples above the band)",
        "accepted, noted, unused: one decision per autoscaler.interval_s",
    ),
    ("decode.batch_size", "tokens per decode read", "same"),
    (
        "sharegpt.max_context_tokens / max_generation_tokens",
        "listed, not read by its code (it cuts at 16,384 / 2,048)",
        "a turn's input / answer cut to them",
    ),
    ("sharegpt.chars_per_token_estimate", "listed, not read (it uses 4)", "chars per token without tiktoken data"),
    (
        "saturation_detection.*",
        "latency / queue-depth thresholds of its saturation guess",
        "accepted, noted, unused: saturation is the I/O workers' measured busy share",
    ),
    ("validation_limits.*", "bounds on the flags", "same: a value above one is an error (exit 2)"),
    ("model_configs.*.num_layers / kv_heads / kv_lora_rank / qk_rope_head_dim", "KV shape", "same"),
    (
        "model_configs.*.hidden_dim / num_heads / kv_dim_per_head",
        "head_dim = hidden_dim / num_heads unless given",
        "same",
    ),
    ("model_configs.*.dtype", "KV element type", "sets kv_dtype unless --kv-dtype is given"),
    ("model_configs.*.name / attention_type", "display name; mla or not", "result label; mla needs kv_lora_rank"),
]
