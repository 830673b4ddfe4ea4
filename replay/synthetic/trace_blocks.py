"""`kvtier bench --source FORMAT --dataset-path FILE` (a block-hash trace: mooncake, bailian, weka, ...): a production
trace of block hashes replayed block by block on the real tiered store, its measured per-tier hit rates beside what
`kvtier plan --trace` predicts.

The model is the plan's (replay/plan/trace.py), here with real entries, tiers and I/O:
- Each request starts at its arrival time (divided by --trace-speedup; 0 = no delay); with --trace-timing think a
  call of a session starts its pause (divided likewise, capped at --max-idle-s) after the call it follows ended and
  once the sub-agents it joins have ended (replay/sources/trace_timing.py), so slower tiers stretch the sessions.
  Block id h is the entry `trace/<h>` of block_tokens x the model's KV bytes per token: equal ids are equal
  prefixes, as in the trace.
- Look-up, compute and writes are one request at a time in the order requests start (one GPU, as chained.py says
  why), so the store sees the block uses in the plan's order. A request looks its blocks up in order and stops at
  the first one missing from every tier (later blocks are of no use without it, as vLLM and LMCache stop there too);
  never the block of the prompt's last token, which a server always computes. Hits are read from their tier.
- The rest is computed (simulated GPU time, generation.prefill_ms_per_token of the generation mode) and its blocks
  written (one already stored is left as it is); decode is simulated time, no store I/O.
The prediction is the plan's exclusive LRU waterfall over the same requests, in the order they ran, and each tier's
blocks at its target usage ratio. The store keeps a hit in its tier (no promotion) and does not refresh blocks past
the first miss, where the plan moves both to the top: with tiers that hold the trace both are exact, with small ones
they differ by a few points.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time

from kvconnector.errors import ConfigError

from ..plan.trace import reuse_profile
from ..sources.base import Conversation, Turn, WorkloadError
from ..sources.target_hit_rate import DEFAULT_BLOCK_TOKENS, TargetShape, shape_for, target_trace
from ..sources.trace_request import TraceRequest
from ..sources.trace_timing import pause_s
from .chained import RoundsDriver, check_block_fits, tier_blocks
from .workload import Session

__all__ = ["MAX_PENDING", "TraceBlocks", "trace_key"]

# Requests of the trace started and not yet done, at most: they queue on the one GPU lock in arrival order, so a few
# are enough to keep the store busy while the decode of earlier ones (simulated time, outside the lock) goes on.
MAX_PENDING = 256


def trace_key(hash_id: int) -> str:
    return f"trace/{hash_id}"


class TraceBlocks:
    """Drives the trace's requests on the driver's store, pool and accounting; `report()` is the results' `trace`
    section once `run()` returns (requests cut by the end of the window are not in it)."""

    def __init__(self, driver: RoundsDriver) -> None:
        self.d = driver
        cfg = driver.cfg
        made = cfg.source == "hit-rate"  # --target-hit-rate: the trace is made here, for the store's room
        block = cfg.trace_block_tokens or DEFAULT_BLOCK_TOKENS
        self.block = block if made else driver.workload.block_trace.block_tokens
        self.block_bytes = self.block * driver.bytes_per_token
        check_block_fits(
            driver,
            self.block_bytes,
            f"--source {cfg.source}: one {self.block}-token block",
            "give --trace-block-tokens smaller or more room",
        )
        self.shape: TargetShape | None = None  # the sessions made for --target-hit-rate
        if made:
            try:
                self.shape = shape_for(
                    cfg.target_hit_rate,
                    cfg.cache_tokens or sum(self.tier_tokens()),  # by default the room of the store it measures
                    block_tokens=self.block,
                    prompt_tokens=cfg.input_len,
                    requests=cfg.max_requests or None,
                )
            except WorkloadError as exc:
                raise ConfigError(str(exc)) from None
            driver.workload.block_trace = target_trace(self.shape, cfg.output_len)
        self.trace = driver.workload.block_trace
        self.done = 0  # requests completed
        self._ran: list[int] = []  # the requests that did their store I/O, in the order they did (the lock's)
        self._completed: set[int] = set()
        self._ended: dict[int, asyncio.Event] = {}  # --trace-timing think: a call's end, for the calls that wait on it
        self._end_s: dict[int, float] = {}
        self.prompt_tokens = 0
        self.hit_tokens: dict[str, int] = {}
        self._gpu = asyncio.Lock()  # FIFO: waiters get it in the order they asked
        self._rng = random.Random(driver.workload.seed ^ 0x7B)  # payload offsets
        self._qos = sorted(driver.cfg.qos_distribution)[0]  # the trace has no classes: all requests in one

    def progress(self) -> dict:
        return {"trace_requests": self.done}

    def tier_tokens(self) -> list[int]:
        """What each tier holds for the plan, in tokens (chained.tier_blocks, as the chained rounds' predictor)."""
        return [n * self.block for n in tier_blocks(self.d, self.block_bytes)]

    async def run(self) -> None:
        d, speed = self.d, self.d.cfg.trace_speedup
        start = time.perf_counter()
        t0 = self.trace.requests[0].arrival_s
        pending: set[asyncio.Task] = set()
        try:
            await self._start_each(pending, speed, start, t0)
            await asyncio.gather(*pending)
        finally:  # cancelled (the window ended) or failed: no request of the trace outlives the run
            for t in pending:
                t.cancel()
        d._done.set()

    async def _start_each(self, pending: set[asyncio.Task], speed: float, start: float, t0: float) -> None:
        d = self.d
        think = d.cfg.trace_timing == "think"
        for i, req in enumerate(self.trace.requests):
            if time.perf_counter_ns() >= d._deadline_ns:
                break
            if speed and not (think and req.session >= 0):
                delay = (req.arrival_s - t0) / speed - (time.perf_counter() - start)
                if delay > 0:
                    await asyncio.sleep(delay)
            # At most MAX_PENDING requests exist at once: a trace without delays (--trace-speedup 0) does not make
            # one task per row before the first runs, and the window's end and a signal get their turn.
            while len(pending) >= MAX_PENDING:
                done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                pending -= done
                for t in done:
                    t.result()  # a storage failure or a bug ends the run (the caller fails it)
            # A linked call waits in its task for what it follows: those are earlier in the file, so they were
            # started before it and the bound above cannot hold back what it waits for.
            work = self._linked(i, req, speed, start) if think and req.session >= 0 else self._request(i, req)
            pending.add(asyncio.create_task(work))
            await asyncio.sleep(0)

    async def _linked(self, i: int, req: TraceRequest, speed: float, start: float) -> None:
        """--trace-timing think: a call of a session, its pause after the call it follows ended and once the
        sub-agents it joins have ended."""
        for j in (req.after, *req.joins):
            if j >= 0:
                await self._ended.setdefault(j, asyncio.Event()).wait()
        ready = self._end_s[req.after] if req.after >= 0 else start
        if speed:
            ready += pause_s(req, self.d.cfg.max_idle_s) / speed
        ready = max([ready, *(self._end_s[j] for j in req.joins)])
        if (delay := ready - time.perf_counter()) > 0:
            await asyncio.sleep(delay)
        await self._request(i, req)
        self._end_s[i] = time.perf_counter()
        self._ended.setdefault(i, asyncio.Event()).set()

    async def _request(self, i: int, req) -> None:
        d, cfg, bs = self.d, self.d.cfg, self.block
        conv = Conversation(f"trace-{i}", [Turn(req.input_tokens, req.output_tokens, req.arrival_s)])
        session = Session(conv.conversation_id, conv, "trace", self._qos, None)
        t_submit = time.perf_counter_ns()
        prio = (d._qos_key[session.qos], t_submit)
        storage_ns = gen_ns = written = hits = 0
        by_tier: dict[str, int] = {}
        ms = cfg.generation.prefill_ms_per_token.get(cfg.generation_mode, 0.0)
        async with self._gpu:
            t_start = time.perf_counter_ns()
            ids = req.hash_ids[: req.input_tokens // bs]  # whole blocks: a trailing partial one is never kept
            usable = sum(1 for k in range(len(ids)) if (k + 1) * bs < req.input_tokens)
            for k in range(usable):  # the prefix up to its first missing block, never the last token's block
                g = await d._io(prio, "multi_turn", d.store.get, trace_key(ids[k]))
                storage_ns += g.timing.total_ns
                if not g.hit:
                    break
                hits += 1
                by_tier[g.tier] = by_tier.get(g.tier, 0) + bs
            computed = req.input_tokens - hits * bs
            if ms and computed:
                g0 = time.perf_counter_ns()
                await asyncio.sleep(computed * ms / 1000)
                gen_ns += time.perf_counter_ns() - g0
            for k in range(hits, len(ids)):  # the recompute: every block from the first miss on
                w = await d._io(
                    prio, "prefill", d.store.put, trace_key(ids[k]), d.payload.chunks(self.block_bytes, self._rng)
                )
                storage_ns += w.timing.total_ns
                written += self.block_bytes if w.stored else 0
            self._ran.append(i)
        out = req.output_tokens
        if cfg.ms_per_token and out > 0 and not cfg.prefill_only:
            g0 = time.perf_counter_ns()
            await asyncio.sleep(out * cfg.ms_per_token / 1000)
            gen_ns += time.perf_counter_ns() - g0
        d._record_request(
            session,
            t_submit,
            t_start,
            prompt_tokens=req.input_tokens,
            generated_tokens=out,
            storage_ns=storage_ns,
            gen_ns=gen_ns,
            prefill_bytes=written,
            multi_turn=(int(hits > 0), int(hits == 0 and usable > 0)),
        )
        self.done += 1
        self._completed.add(i)
        self.prompt_tokens += req.input_tokens
        for tier, n in by_tier.items():
            self.hit_tokens[tier] = self.hit_tokens.get(tier, 0) + n

    def report(self) -> dict:
        """Measured and predicted hit rate per tier over the requests that completed, in the order they ran."""
        ran = tuple(self.trace.requests[i] for i in self._ran if i in self._completed)
        done = dataclasses.replace(self.trace, requests=ran)
        capacities = self.tier_tokens()
        # None where the requests done had no prompt token: no hit rate, measured or predicted
        predicted = reuse_profile(done).tier_hit_rates(capacities) if self.done else [None] * len(capacities)
        total = self.prompt_tokens

        def rate(n: int) -> float | None:
            return round(n / total, 6) if total else None

        def rounded(p: float | None) -> float | None:
            return None if p is None else round(p, 6)

        tiers = [
            {
                "tier": t.name,
                "capacity_tokens": cap,
                "hit_rate": rate(self.hit_tokens.get(t.name, 0)),
                "predicted_hit_rate": rounded(p),
            }
            for t, cap, p in zip(self.d.store.tiers, capacities, predicted, strict=True)
        ]
        return {
            "source": self.d.cfg.source,
            "path": self.d.cfg.dataset_path,
            "block_tokens": self.block,
            "block_bytes": self.block_bytes,
            "trace_timing": self.d.cfg.trace_timing,
            "max_idle_s": self.d.cfg.max_idle_s if self.d.cfg.trace_timing == "think" else None,
            "requests": self.done,
            "prompt_tokens": total,
            "hit_rate": rate(sum(self.hit_tokens.values())),
            "predicted_hit_rate": None if None in predicted else rounded(sum(predicted)),
            "tiers": tiers,
            "target_hit_rate": None
            if self.shape is None
            else {
                **self.shape.as_dict(),
                # the plan's rate for the turns done: a window that ended early ran more first turns, which miss
                "planned_hit_rate_of_completed": rounded(self.shape.first(self.done).hit_rate),
                "measured_hit_rate": rate(sum(self.hit_tokens.values())),
            },
        }
