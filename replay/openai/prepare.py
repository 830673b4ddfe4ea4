"""What a run of `kvtier replay` sends, made before its window: the source loaded (replay/sources/registry.py), the
prompts sized, the requests planned and their arrival times computed.

A block-hash trace is read in a worker thread, so the event loop hears SIGINT/SIGTERM while it reads (the thread is
told to stop and does within a few thousand rows); rows past the --duration window are not read; rows are cut to
--max-prompt-tokens as every dataset's are; and each prompt is made when it is sent (TurnPlan.make_text)."""

from __future__ import annotations

import asyncio
import math
import random
import sys
import threading

from replay.sources.base import WorkloadError
from replay.sources.registry import SOURCES
from replay.sources.target_hit_rate import target_trace
from replay.sources.trace_timing import has_sessions

from .config import ReplayConfig
from .driver import Driver, RunState
from .schedule import arrival_offsets_ns, trace_offsets_ns
from .workload import (
    TextMaker,
    linked_plans_from_block_trace,
    long_session_plans,
    plans_from_block_trace,
    plans_from_conversations,
    synthetic_plans,
)


async def prepare(cfg: ReplayConfig, drv: Driver, rng: random.Random, state: RunState):
    """Load the source, size the texts, compute the schedule. Returns (pacing, plans, offsets, traced, meta)."""
    maker = TextMaker(cfg.seed)
    source = SOURCES[cfg.source]
    needs_text = not source.has_text
    if needs_text:
        # Set-up must not outlast what the user allowed a request, nor the run window itself.
        budget_s = min(30.0, cfg.request_timeout, cfg.duration or math.inf)
        await maker.prepare(drv.session, cfg.base_url, cfg.model, timeout_s=budget_s)
        if maker.fallback_reason:
            print(
                f"kvtier replay: server tokenizer not used ({maker.fallback_reason}); prompt lengths are estimated "
                "at 4 characters per token",
                file=sys.stderr,
            )
    fixed = None if cfg.max_tokens == "dataset" else cfg.max_tokens
    meta: dict = {
        "source": cfg.source,
        "endpoint": cfg.endpoint,
        "model": cfg.model,
        "base_url": cfg.base_url,
        "seed": cfg.seed,
        "prompt_text_from": maker.mode if needs_text else "dataset text",
        "prompt_text_fallback_reason": maker.fallback_reason if needs_text else None,
    }
    convs = None
    path = cfg.source_inputs()[source.path_flag] if source.path_flag else None
    if source.has_text:  # conversations, taken in a shuffled order
        limit = cfg.concurrency * 4 if cfg.rounds else cfg.num_requests
        convs, report = source.load(path, max_requests=limit, max_context_tokens=cfg.max_prompt_tokens)
        meta["load_report"] = _load_report(report)
        order = list(range(len(convs)))
        rng.shuffle(order)
        convs = [convs[i] for i in order]
    if cfg.rounds:
        plans, cycled = await long_session_plans(
            convs,
            maker,
            rng,
            concurrency=cfg.concurrency,
            rounds=cfg.rounds,
            output_len=cfg.output_len,
            input_len=cfg.input_len,
            prefix_len=cfg.prefix_len,
        )
        meta["long_session"] = {
            "rounds": cfg.rounds,
            "concurrency": cfg.concurrency,
            "output_len": cfg.output_len,
            "cycled_turns": cycled,
        }
        return "rounds", plans, None, False, meta
    traced = False
    trace_offsets = None
    if source.timed and not source.block_trace:  # conversations at the input's times
        convs, report = source.load(path, max_requests=cfg.num_requests, max_context_tokens=cfg.max_prompt_tokens)
        meta["load_report"] = _load_report(report)
        stamps = [t.arrival_s or 0.0 for c in convs for t in c.turns]
        trace_offsets = trace_offsets_ns(stamps, cfg.trace_speedup, cfg.duration)
        traced = True
        meta["trace_speedup"] = cfg.trace_speedup
    if source.block_trace:
        if source.name == "hit-rate":
            trace_shape = cfg.hit_rate_shape()
            trace = target_trace(trace_shape, cfg.output_len)
        else:
            trace = await _load_block_trace(source, path, cfg)
        meta["load_report"] = {
            "requests": len(trace.requests),
            "block_tokens": trace.block_tokens,
            "max_prompt_tokens": cfg.max_prompt_tokens,
            "truncated": dict(trace.report.truncated),
        }
        meta["trace_speedup"] = cfg.trace_speedup if source.timed else None
        meta["trace_timing"] = cfg.trace_timing
        # a trace none of whose requests names its blocks shares nothing: no reuse is claimed for it
        meta["trace_block_ids"] = trace.has_block_ids
        if source.name == "hit-rate":
            meta["target_hit_rate"] = trace_shape.as_dict()
        if cfg.trace_timing == "think":
            if not has_sessions(trace):
                raise WorkloadError(
                    f"{path}: --trace-timing think paces sessions' calls, and this {cfg.source} trace has none"
                )
            meta["max_idle_s"] = cfg.max_idle_s
            plans = await linked_plans_from_block_trace(
                trace,
                maker,
                fixed_max_tokens=fixed,
                max_tokens_cap=cfg.max_tokens_cap,
                max_idle_s=cfg.max_idle_s,
                speedup=cfg.trace_speedup,
                duration_s=cfg.duration,
            )
            return "think", plans, None, True, meta
        # a trace without times (ServeGen offline) is paced as an untimed source is: --users, or a rate
        offsets = None
        if source.timed:
            offsets = trace_offsets_ns([r.arrival_s for r in trace.requests], cfg.trace_speedup, cfg.duration)
        plans = await plans_from_block_trace(
            trace, maker, fixed_max_tokens=fixed, max_tokens_cap=cfg.max_tokens_cap, trace_offsets_ns=offsets
        )
        traced = source.timed
    elif convs is not None:
        plans = await plans_from_conversations(
            convs,
            maker,
            rng,
            num_requests=cfg.num_requests,
            fixed_max_tokens=fixed,
            max_tokens_cap=cfg.max_tokens_cap,
            trace_offsets_ns=trace_offsets,
        )
    else:
        sessions = cfg.num_requests or 100
        sessions = max(1, math.ceil(sessions / cfg.turns))
        plans = await synthetic_plans(
            maker,
            rng,
            sessions=sessions,
            turns=cfg.turns,
            input_len=cfg.input_len,
            output_len=fixed or cfg.output_len,
            range_ratio=cfg.range_ratio,
            prefix_len=cfg.prefix_len,
            prefix_groups=cfg.prefix_groups,
        )
    if not plans:
        raise WorkloadError("the workload is empty after --num-requests/--duration")
    if cfg.users:
        return "closed", plans, None, False, meta
    if traced:
        offsets = [p.turns[0].arrival_offset_ns or 0 for p in plans]
    else:
        kind = cfg.arrival or ("gamma" if cfg.burstiness != 1.0 else "poisson")
        offsets = arrival_offsets_ns(len(plans), cfg.request_rate, kind, cfg.burstiness, cfg.seed, cfg.duration)
        plans = plans[: len(offsets)]
        meta["arrival"] = kind
        meta["target_rate"] = None if math.isinf(cfg.request_rate) else cfg.request_rate
        meta["burstiness"] = cfg.burstiness
    return "open", plans, offsets, traced, meta


async def _load_block_trace(source, path: str, cfg: ReplayConfig):
    """The trace as this run sends it, read in a worker thread that a cancellation (a signal during set-up) stops."""
    stop = threading.Event()
    options = {
        "block_tokens": cfg.trace_block_tokens,
        "max_requests": cfg.num_requests,
        "max_context_tokens": cfg.max_prompt_tokens,
        # a row this late after the first is past the window at this speed: neither it nor any later one is sent
        # (think: the pauses, capped, may bring a late row into the window; what cannot be is left out when planned)
        "until_s": cfg.duration * cfg.trace_speedup if cfg.duration and cfg.trace_timing == "timestamps" else None,
        "should_stop": stop.is_set,
        "limit_flag": "--num-requests",
    }
    try:
        return await asyncio.to_thread(source.load, path, **options)
    except asyncio.CancelledError:
        stop.set()
        raise


def _load_report(report) -> dict:
    return {
        "conversations": report.conversations,
        "turns": report.turns,
        "skipped": report.skipped,
        "truncated": report.truncated,
        "tokenizer": report.tokenizer,
    }
