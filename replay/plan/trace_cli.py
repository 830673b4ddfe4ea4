"""`kvtier plan --trace`: the prefix hit rate a production block-hash trace gets from tiers of given sizes, and over a
sweep of cache capacities, from the trace alone (no server, no GPU; replay/plan/trace.py says what it models)."""

from __future__ import annotations

import argparse
import datetime as _dt
import math
import re
import sys
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from kvconnector.errors import ConfigError
from kvconnector.units import parse_size
from replay.models import DTYPE_BYTES, resolve_model

from ..common.cli import Interrupted, OneLineParser
from ..common.settings import documented, load_settings
from ..outputs.paths import claim_outputs
from ..outputs.provenance import provenance
from ..sources.base import WorkloadError
from ..sources.block_traces import FORMATS, MAX_BLOCK_TOKENS, MAX_BLOCK_USES, load_block_trace, merge_traces, oversize
from ..sources.trace_timing import DEFAULT_MAX_IDLE_S, TIMINGS, has_sessions, in_timing_order
from .trace import ReuseProfile, reuse_profile, sweep_capacities

PROG = "kvtier plan --trace"
ENV_PREFIX = "KVTIER_PLAN_"

EXAMPLES = """examples:
  # the Mooncake FAST'25 traces (git clone https://github.com/kvcache-ai/Mooncake; FAST25-release/traces/): hit rate
  # against cache capacity from 1e4 to 1e9 tokens, each trace and their union, with the paper's 3M-token local cache
  kvtier plan --trace conversation_trace.jsonl --trace synthetic_trace.jsonl --tier local=3e6 \\
      --capacity-sweep 1e4..1e9 --output mooncake.json --plots plots/
  # tiers in bytes: the KV size of a token from a model of the catalog; 64 GiB of DRAM over 2 TB of NVMe
  kvtier plan --trace conversation_trace.jsonl --model llama3.1-70b --tier dram=64GiB --tier nvme=2TB
  # the trace's 512-token blocks as 16-token blocks (every length scaled with them), the first 2,000 requests
  kvtier plan --trace conversation_trace.jsonl --trace-block-tokens 16 --max-requests 2000 --tier l1=1e5
  # Alibaba's Qwen-Bailian trace (16-token blocks); an Azure trace has no block hashes: every request misses
  kvtier plan --trace qwen_traceA_blksz_16.jsonl --format bailian --tier gpu=2e5 --tier cpu=2e6
  # a directory of Weka agentic-coding sessions (one JSON a session, sub-agents included)
  kvtier plan --trace cc-traces-weka/ --format weka --tier gpu=2e5 --capacity-sweep 1e3..1e8

--format: mooncake (kvcache-ai/Mooncake FAST25-release/traces, 512-token blocks), aiperf-mooncake (AIPerf's
mooncake_trace rows: timestamp or delay, session_id, input_length or text_input/messages, hash_ids optional; 512-token
blocks; a trace without hash_ids has no reuse to model, and the plan says so), servegen (alibaba/ServeGen
data/offline/trace_*.jsonl, 16-token blocks, no times: planned in file order; several --trace share their ids), bailian
(alibaba-edu/qwen-bailian-usagetraces-anon, 16-token blocks), weka (semianalysisai/cc-traces-weka-*, a JSON file per
session or a directory of them, 64-token blocks), azure (Azure/AzurePublicDataset
AzureLLMInferenceTrace_*.csv of 2023 and 2024, AzureLMMInferenceTrace_multimodal.csv of 2025, told apart by the
header: times and lengths only). replay/sources/block_traces.py says what is read and checked.

--tier NAME=SIZE, fastest first: SIZE in tokens (3e6, 3000000), or in bytes with a unit (64GiB, 2TB) when
--model or --kv-bytes-per-token gives the KV size of a token. The tiers are one exclusive LRU waterfall; a request's
hit stops at its first block missing from all of them. Each trace's hash ids are its own: with several --trace the
union ("all") interleaves them by arrival and keeps their ids apart.

What it prints: per trace the requests, prompt tokens, distinct blocks, the hit rate of each tier and of all of them,
the theoretical maximum (an infinite cache) and the share of it reached; then the hit rate at each capacity of the
sweep. --output writes all of it as JSON, --plots DIR/plan-trace.png (hit rate against capacity, log scale, a dashed
line at each tier's capacity).
Bounds: at most 256 MiB of traces unless --max-requests N takes the first N requests of each, and 3 x 10^7 block
uses in all (about 2 GB and 3 minutes), counted as the rows are read.
exit status: 0 done; 2 a usage error or a bad trace row (one line naming file:line, nothing written); 130/143 stopped.
"""

_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_SWEEP = re.compile(r"^\s*([0-9.eE+]+)\s*\.\.\s*([0-9.eE+]+)\s*$")


def _tier(v: Any) -> Any:
    if isinstance(v, str):
        name, sep, size = v.partition("=")
        if not sep or not _NAME.match(name.strip()):
            raise ValueError(f"expected NAME=SIZE like local=3e6 (tokens) or dram=64GiB, got {v!r}")
        return {"name": name.strip(), "size": size.strip()}
    return v


class TraceTier(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    size: str

    @property
    def in_bytes(self) -> bool:
        return self.size.rstrip().upper().endswith("B")


class TracePlanConfig(BaseModel):
    """Every option of `kvtier plan --trace`, validated once (defaults < YAML < KVTIER_PLAN_<KEY> < flags)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    trace: Annotated[list[str], Field(min_length=1)]
    format: Literal[tuple(FORMATS)] = "mooncake"  # type: ignore[valid-type]
    trace_block_tokens: int | None = Field(None, ge=1, le=MAX_BLOCK_TOKENS)
    max_requests: int | None = Field(None, ge=1)
    trace_timing: Literal[TIMINGS] = "timestamps"  # type: ignore[valid-type]
    max_idle_s: float = Field(DEFAULT_MAX_IDLE_S, gt=0)
    tiers: list[Annotated[TraceTier, BeforeValidator(_tier)]] = []
    capacity_sweep: str = "1e4..1e9"
    points_per_decade: int = Field(4, ge=1, le=50)
    model: str | None = None
    kv_dtype: Literal[tuple(DTYPE_BYTES)] = "bf16"  # type: ignore[valid-type]
    kv_bytes_per_token: Annotated[float, BeforeValidator(parse_size)] | None = None
    output: str | None = None
    plots: str | None = None
    html_output: str | None = None
    quiet: bool = False

    @model_validator(mode="after")
    def _check(self) -> TracePlanConfig:
        if self.model is not None and self.kv_bytes_per_token is not None:
            raise ValueError("give the KV size as --model M or as --kv-bytes-per-token SIZE, not both")
        if self.model is None and self.kv_dtype != type(self).model_fields["kv_dtype"].default:
            raise ValueError(f"--kv-dtype {self.kv_dtype} is read with --model M only (the KV size of its token)")
        if self.trace_timing != "think" and self.max_idle_s != type(self).model_fields["max_idle_s"].default:
            raise ValueError("--max-idle-s caps the pauses of --trace-timing think, not the trace's timestamps")
        names = [t.name for t in self.tiers]
        if len(set(names)) != len(names):
            raise ValueError(f"a tier name is given twice ({', '.join(names)})")
        self.sweep_bounds()
        return self

    def sweep_bounds(self) -> tuple[float, float]:
        m = _SWEEP.match(self.capacity_sweep)
        try:
            lo, hi = (float(m.group(1)), float(m.group(2))) if m else (math.nan, math.nan)
        except ValueError:
            lo = hi = math.nan
        if not (0 < lo < hi < math.inf):
            raise ValueError(
                f"--capacity-sweep {self.capacity_sweep!r}: expected LO..HI tokens, 0 < LO < HI (1e4..1e9)"
            )
        return lo, hi


def build_parser() -> argparse.ArgumentParser:
    ap = OneLineParser(
        prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter, description=__doc__, epilog=EXAMPLES
    )
    g = documented(ap.add_argument, TracePlanConfig)
    g("--trace", action="append", metavar="FILE", help="a block-hash trace (repeat for several and their union)")
    g("--format", choices=list(FORMATS), help="the trace's format")
    g("--trace-block-tokens", type=int, metavar="N", help="rescale the trace's block to N tokens (lengths follow)")
    g("--max-requests", type=int, metavar="N", help="the first N requests of each trace")
    g(
        "--trace-timing",
        choices=list(TIMINGS),
        help="the order modelled: the trace's timestamps, or think (each session's calls closed loop on an ideal "
        "server: its pauses after the recorded api_time of the call before, sub-agents joined)",
    )
    g(
        "--max-idle-s",
        type=float,
        metavar="S",
        help="with think: cap each pause at S seconds",
    )
    g("--tier", action="append", metavar="NAME=SIZE", dest="tiers", help="a tier, fastest first; repeat for more")
    g("--capacity-sweep", metavar="LO..HI", help="cache capacities to sweep, in tokens")
    g("--points-per-decade", type=int, metavar="N", help="sweep points per factor of 10")
    g("--model", metavar="M", help="KV bytes per token from a model (catalog name or config.json), for byte sizes")
    g("--kv-dtype", choices=list(DTYPE_BYTES), help="KV element type, with --model")
    g("--kv-bytes-per-token", metavar="SIZE", help="KV bytes per token, e.g. 320KiB (instead of --model)")
    g("--config", dest="config", metavar="FILE.yaml", help="options from a YAML file; flags win over it")
    g("--output", metavar="FILE", help="JSON: per trace its tiers, maximum and capacity curve")
    g("--plots", metavar="DIR", help="write DIR/plan-trace.png")
    g("--html-output", metavar="FILE", help="a self-contained HTML report (kvtier report's page): the capacity curve")
    g("--quiet", action="store_true", default=None, help="no tables")
    return ap


def load_config(argv: list[str], env_known_elsewhere: frozenset[str] = frozenset()) -> TracePlanConfig:
    """`env_known_elsewhere`: the session plan's settings, whose variables share the prefix (kvtier plan gives them)."""
    ns = build_parser().parse_args(argv)
    flags = {k: v for k, v in vars(ns).items() if v is not None and k != "config"}

    return load_settings(
        TracePlanConfig,
        config_path=ns.config,
        env_prefix=ENV_PREFIX,
        flags=flags,
        missing_hint=f" (see '{PROG} --help')",
        env_known_elsewhere=env_known_elsewhere,
    )


def _bytes_per_token(cfg: TracePlanConfig) -> float | None:
    if cfg.kv_bytes_per_token is not None:
        return cfg.kv_bytes_per_token
    if cfg.model is not None:
        return float(resolve_model(cfg.model).bytes_per_token(cfg.kv_dtype))
    return None


def tier_tokens(cfg: TracePlanConfig, bpt: float | None) -> list[tuple[str, float]]:
    out = []
    for t in cfg.tiers:
        if t.in_bytes:
            if bpt is None:
                raise ConfigError(f"--tier {t.name}={t.size}: a size in bytes needs --model or --kv-bytes-per-token")
            tokens = parse_size(t.size) / bpt
        else:
            try:
                tokens = float(t.size)
            except ValueError:
                raise ConfigError(
                    f"--tier {t.name}={t.size}: expected tokens (3e6) or bytes with a unit (64GiB)"
                ) from None
        if not (1 <= tokens < math.inf):
            raise ConfigError(f"--tier {t.name}={t.size}: holds {tokens:g} tokens, not a cache")
        out.append((t.name, tokens))
    return out


def trace_entry(
    profile: ReuseProfile, files: list[str], tiers: list[tuple[str, float]], caps: list[float], block_ids: bool = True
) -> dict:
    """One trace's figures. `block_ids`: whether its requests name their blocks; without, nothing is shared and its
    figures are all misses by construction, not a measure of reuse (the entry says so)."""
    if not profile.prompt_tokens:  # a hit rate is hit tokens over prompt tokens: none to plan
        raise WorkloadError(f"{', '.join(files)}: every prompt in this trace is 0 tokens, so it has no hit rate")
    rates = profile.tier_hit_rates([tok for _, tok in tiers]) if tiers else []
    total = sum(rates)
    top = profile.max_hit_rate
    return {
        "name": profile.name,
        "files": files,
        "requests": profile.requests,
        "prompt_tokens": profile.prompt_tokens,
        "block_tokens": profile.block_tokens,
        "unique_blocks": profile.unique_blocks,
        "unique_tokens": profile.unique_blocks * profile.block_tokens,
        "block_ids": block_ids,
        "max_hit_rate": top,
        "tiers": [{"name": n, "capacity_tokens": tok, "hit_rate": r} for (n, tok), r in zip(tiers, rates, strict=True)],
        "tiers_hit_rate": total if tiers else None,
        "share_of_max": (total / top if top else None) if tiers else None,
        "curve": [{"capacity_tokens": c, "hit_rate": profile.hit_rate(c)} for c in caps],
    }


def check_size(cfg: TracePlanConfig) -> None:
    """Refuse up front traces too large to model in one plan, all of them together (the bound and how to go on in
    the one line)."""
    if cfg.max_requests is None and (why := oversize(cfg.trace, "--max-requests")):
        raise ConfigError(f"--trace: {why}")


def timing_order(cfg: TracePlanConfig) -> str:
    """Which order the plan's cache sees the requests in, in words."""
    if cfg.trace_timing == "think":
        return (
            "think: each session's calls closed loop on an ideal server (a call takes its recorded api_time), "
            f"pauses capped at {cfg.max_idle_s:g} s, sub-agents joined"
        )
    return "timestamps: the trace's own arrival times"


def run(cfg: TracePlanConfig, argv: list[str]) -> dict:
    bpt = _bytes_per_token(cfg)
    tiers = tier_tokens(cfg, bpt)
    caps = sweep_capacities(*cfg.sweep_bounds(), cfg.points_per_decade)
    doc = {
        "kind": "kvtier plan --trace",
        "created_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "command": ["kvtier", "plan", *argv],
        "provenance": provenance(),
        "format": cfg.format,
        "kv_bytes_per_token": bpt,
        "capacities_tokens": caps,
        "trace_timing": cfg.trace_timing,
        "max_idle_s": cfg.max_idle_s if cfg.trace_timing == "think" else None,
        "order": timing_order(cfg),
        "traces": [],
        "status": "interrupted",
    }
    try:
        # A signal while the traces are read is as one while they are modelled: the traces done so far are written.
        traces = []
        budget = MAX_BLOCK_USES // (2 if len(cfg.trace) > 1 else 1)  # the union models every use once more
        for p in cfg.trace:
            trace = load_block_trace(
                p,
                cfg.format,
                block_tokens=cfg.trace_block_tokens,
                max_requests=cfg.max_requests,
                max_block_uses=budget,
            )
            budget -= sum(min(len(r.hash_ids), r.input_tokens // trace.block_tokens) for r in trace.requests)
            if cfg.trace_timing == "think" and not has_sessions(trace):
                raise WorkloadError(
                    f"{p}: --trace-timing think paces sessions' calls, and this {cfg.format} trace has none"
                )
            traces.append(in_timing_order(trace, cfg.trace_timing, cfg.max_idle_s))
        for t, path in zip(traces, cfg.trace, strict=True):
            doc["traces"].append(trace_entry(reuse_profile(t), [path], tiers, caps, t.has_block_ids))
        if len(traces) > 1:
            merged = merge_traces(traces)
            doc["traces"].append(trace_entry(reuse_profile(merged), list(cfg.trace), tiers, caps, merged.has_block_ids))
    except Interrupted as exc:
        exc.partial = doc  # type: ignore[attr-defined]
        raise
    doc["status"] = "done"
    return doc


def _write(cfg, doc: dict) -> int:
    from .report import write_outputs, write_trace_plot  # matplotlib only when writing

    plot = write_trace_plot if doc["traces"] else None
    return write_outputs(PROG, doc, cfg.output, cfg.plots, plot, cfg.html_output)


def main(argv: list[str], env_known_elsewhere: frozenset[str] = frozenset()) -> int:
    # A refusal raises a UserError (ConfigError, WorkloadError): replay/cli.py says it in one line, exit 2.
    cfg = load_config(argv, env_known_elsewhere)
    _bytes_per_token(cfg)  # a bad --model is a usage error before anything is read
    check_size(cfg)
    claim = claim_outputs(
        {"--output": cfg.output, "--html-output": cfg.html_output},
        {"--plots": cfg.plots},
        inputs={t: t for t in cfg.trace},
    )
    with claim:
        return _run_and_write(cfg, argv)


def _run_and_write(cfg, argv: list[str]) -> int:
    try:
        doc = run(cfg, argv)
    except Interrupted as exc:
        _write(cfg, exc.partial)  # type: ignore[attr-defined]
        print(f"{PROG}: interrupted ({exc}); wrote the traces done so far", file=sys.stderr)
        return exc.exit_code
    for entry in doc["traces"]:
        if not entry["block_ids"]:
            print(
                f"{PROG}: {', '.join(entry['files'])}: no block ids: no reuse model (every request a miss)",
                file=sys.stderr,
            )
    if not cfg.quiet:
        from ..outputs.terminal import console
        from .report import trace_tables

        out = console(min_width=100)
        for table in trace_tables(doc):
            out.print(table)
    return _write(cfg, doc)


__all__ = ["TracePlanConfig", "build_parser", "load_config", "main", "run"]
