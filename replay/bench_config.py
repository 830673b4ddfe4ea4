"""The one validated configuration of `kvtier bench`, fed by CLI flags (and, later, a YAML file).

Flag names follow the MLPerf Storage KV Cache benchmark where the concept is the same, so its users can switch.
Unknown keys are errors; every key is used by the run.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

GENERATION_MS_PER_TOKEN = {"none": 0.0, "fast": 2.0, "realistic": 30.0}


class UserProfile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    context_tokens: tuple[int, int]
    generate_tokens: tuple[int, int]
    think_time_s: tuple[float, float]
    weight: float = 1.0


# Context, generation and think-time ranges of the MLPerf KV Cache spec (section 4.1).
DEFAULT_PROFILES = {
    "chatbot": UserProfile(context_tokens=(512, 4096), generate_tokens=(50, 200), think_time_s=(0.1, 0.5)),
    "coding": UserProfile(context_tokens=(4096, 25000), generate_tokens=(100, 500), think_time_s=(0.2, 1.0)),
    "document": UserProfile(context_tokens=(4096, 16384), generate_tokens=(200, 800), think_time_s=(0.3, 1.5)),
}


class BenchConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # what is simulated
    model: str = "tiny-1b"
    kv_dtype: Literal["bf16", "fp16", "fp8", "int8", "fp32"] = "bf16"
    num_users: int = Field(100, ge=1, le=100_000)
    duration: float = Field(60.0, gt=0, le=7 * 24 * 3600)
    max_requests: int = Field(0, ge=0)
    request_rate: float = Field(0.0, ge=0)
    seed: int | None = None
    disable_multi_turn: bool = False
    end_conversation_probability: float = Field(0.2, ge=0, le=1)
    generation_mode: Literal["none", "fast", "realistic"] = "none"
    decode_batch_size: int = Field(32, ge=1)
    user_profiles: dict[str, UserProfile] = Field(default_factory=lambda: dict(DEFAULT_PROFILES))

    # tiers
    gpu_mem_gb: float | None = Field(None, ge=0, le=100_000)
    cpu_mem_gb: float = Field(4.0, ge=0, le=100_000)
    cache_dir: str | None = None
    storage_capacity_gb: float = Field(0.0, ge=0, le=10_000_000)
    io_mode: Literal["direct", "buffered"] = "direct"
    target_usage_ratio: float = Field(0.8, gt=0, le=1)
    large_entry_limit_ratio: float = Field(0.95, gt=0, le=1)
    promote_on_hit: bool = False

    # execution
    max_concurrent_allocs: int = Field(0, ge=0)
    io_workers: int = Field(8, ge=1, le=1024)
    random_buffer_mb: int = Field(256, ge=16, le=16384)

    # output
    output: str | None = None
    keep_cache: bool = False
    progress: bool = True

    @model_validator(mode="after")
    def _check(self) -> "BenchConfig":
        for name, p in self.user_profiles.items():
            for field in ("context_tokens", "generate_tokens", "think_time_s"):
                lo, hi = getattr(p, field)
                if lo < 0 or hi < lo:
                    raise ValueError(f"user profile {name}: {field} must be a range [low, high] with 0 <= low <= high")
            if p.context_tokens[0] < 1:
                raise ValueError(f"user profile {name}: context_tokens must be at least 1")
        if not self.user_profiles:
            raise ValueError("at least one user profile is needed")
        return self

    @property
    def ms_per_token(self) -> float:
        return GENERATION_MS_PER_TOKEN[self.generation_mode]
