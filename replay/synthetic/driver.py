"""The in-process driver: simulated users issue requests against the tiered store, with no inference engine.

One request = (multi-turn) a read of the conversation's previous turn, one prefill write of the turn's KV, then
ceil(generate_tokens / decode_batch_size) decode reads of it, with simulated generation time between batches.

Users are asyncio tasks (thousands are cheap); storage operations run in a pool of `io_workers` threads (whose system
calls release the GIL), earliest request first. At the end of the window no new operation starts: user tasks are cancelled, operations not yet
started are dropped, those in flight finish, and the elapsed time runs until the last of them did, so bandwidth is
bytes over the real time it took.
"""

from __future__ import annotations

import asyncio
import math
import random
import signal
import time
from dataclasses import dataclass, field

from kvconnector.errors import KvtierError
from kvconnector.histogram import LatencyHistogram
from kvconnector.store import TieredStore

from ..bench_config import BenchConfig
from ..sources.synthetic_users import SyntheticUser
from .executor import PriorityExecutor
from .payload import RandomPayload


@dataclass
class RequestStats:
    """Request-level measurements, kept as histograms and sums (no per-request lists)."""

    completed: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    end_to_end: LatencyHistogram = field(default_factory=LatencyHistogram)
    storage_io: LatencyHistogram = field(default_factory=LatencyHistogram)
    generation: LatencyHistogram = field(default_factory=LatencyHistogram)
    queue_wait: LatencyHistogram = field(default_factory=LatencyHistogram)
    multi_turn_hits: int = 0
    multi_turn_misses: int = 0
    decode_reads: int = 0
    decode_misses: int = 0
    by_profile: dict[str, int] = field(default_factory=dict)


@dataclass
class RunOutcome:
    status: str  # completed | interrupted | failed
    error: str | None
    start_ns: int
    end_ns: int
    requests: RequestStats
    timeline: list[dict]

    @property
    def elapsed_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


class _Stop(Exception):
    pass


class SyntheticDriver:
    def __init__(self, cfg: BenchConfig, store: TieredStore, bytes_per_token: int, users: list[SyntheticUser],
                 payload: RandomPayload, on_sample=None, sample_interval_s: float = 0.5) -> None:
        self.cfg = cfg
        self.store = store
        self.bytes_per_token = bytes_per_token
        self.users = users
        self.payload = payload
        self.on_sample = on_sample
        self.sample_interval_s = sample_interval_s
        self.req = RequestStats()
        self.timeline: list[dict] = []
        self._status = "completed"
        self._error: str | None = None
        self._next_slot = 0.0

    # ---- public ----------------------------------------------------------------------------------------------------
    def run(self) -> RunOutcome:
        return asyncio.run(self._run())

    def snapshot(self) -> dict:
        """Cumulative figures for progress views and the timeline."""
        read = sum(s.read.nbytes for s in self.store.stats)
        written = sum(s.write.nbytes for s in self.store.stats)
        return {
            "requests": self.req.completed,
            "read_bytes": read,
            "written_bytes": written,
            "tiers": {u["tier"]: {"entries": u["entries"], "used_bytes": u["used_bytes"]} for u in self.store.usage()},
        }

    # ---- run loop --------------------------------------------------------------------------------------------------
    async def _run(self) -> RunOutcome:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._pool = PriorityExecutor(self.cfg.io_workers)
        self._alloc = asyncio.Semaphore(self.cfg.max_concurrent_allocs) if self.cfg.max_concurrent_allocs else None
        self._done = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, self._interrupt)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
                pass
        seed = self.cfg.seed if self.cfg.seed is not None else random.randrange(2**32)
        self.start_ns = time.perf_counter_ns()
        self._next_slot = time.monotonic()
        tasks = [asyncio.create_task(self._user(u, random.Random(seed * 1_000_003 + u.user_id))) for u in self.users]
        sampler = asyncio.create_task(self._sample())
        try:
            await asyncio.wait_for(self._done.wait(), timeout=self.cfg.duration)
        except asyncio.TimeoutError:
            pass
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # Operations queued but not started are dropped; those in flight finish and count.
        await loop.run_in_executor(None, self._pool.shutdown)
        end_ns = time.perf_counter_ns()
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)
        self._record_sample(end_ns)
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.remove_signal_handler(sig)
            except (NotImplementedError, RuntimeError, ValueError):
                pass
        return RunOutcome(self._status, self._error, self.start_ns, end_ns, self.req, self.timeline)

    def _interrupt(self) -> None:
        if self._status == "completed":
            self._status = "interrupted"
        self._done.set()

    def _fail(self, exc: BaseException) -> None:
        if self._status != "failed":
            self._status, self._error = "failed", str(exc)
        self._done.set()

    async def _sample(self) -> None:
        while True:
            await asyncio.sleep(self.sample_interval_s)
            self._record_sample(time.perf_counter_ns())

    def _record_sample(self, now_ns: int) -> None:
        snap = self.snapshot()
        snap["t_s"] = round((now_ns - self.start_ns) / 1e9, 3)
        self.timeline.append(snap)
        if self.on_sample:
            self.on_sample(snap)

    async def _io(self, priority: tuple, fn, *args):
        return await self._pool.run(priority, fn, *args)

    async def _rate_limit(self) -> None:
        """Global request-rate cap: requests start at most `request_rate` per second, in slots."""
        if not self.cfg.request_rate:
            return
        now = time.monotonic()
        slot = max(now, self._next_slot)
        self._next_slot = slot + 1.0 / self.cfg.request_rate
        if slot > now:
            await asyncio.sleep(slot - now)

    async def _user(self, user: SyntheticUser, rng: random.Random) -> None:
        try:
            for conv in user.conversations(rng, not self.cfg.disable_multi_turn, self.cfg.end_conversation_probability):
                prev_key = None
                for i, turn in enumerate(conv.turns):
                    await asyncio.sleep(user.think_time(rng))
                    key = f"{conv.conversation_id}_turn_{i}"
                    await self._request(user, key, prev_key, turn.input_tokens, turn.output_tokens, rng)
                    prev_key = key
        except asyncio.CancelledError:
            raise
        except KvtierError as exc:
            self._fail(exc)
        except OSError as exc:
            self._fail(exc)

    async def _request(self, user: SyntheticUser, key: str, prev_key: str | None, context_tokens: int,
                       generate_tokens: int, rng: random.Random) -> None:
        cfg = self.cfg
        t_submit = time.perf_counter_ns()
        prio = (0, t_submit)  # earlier requests' operations first
        await self._rate_limit()
        storage_ns = 0
        multi_turn_hit = None
        if self._alloc:
            await self._alloc.acquire()
        try:
            t_start = time.perf_counter_ns()
            if prev_key is not None:
                r = await self._io(prio, self.store.get, prev_key)
                storage_ns += r.timing.total_ns
                multi_turn_hit = r.hit
            chunks = self.payload.chunks(context_tokens * self.bytes_per_token, rng)
            w = await self._io(prio, self.store.put, key, chunks)
            storage_ns += w.timing.total_ns
        finally:
            if self._alloc:
                self._alloc.release()
        gen_ns = 0
        decode_misses = 0
        batches = max(1, math.ceil(generate_tokens / cfg.decode_batch_size))
        for b in range(batches):
            tokens = min(cfg.decode_batch_size, generate_tokens - b * cfg.decode_batch_size)
            if cfg.ms_per_token:
                g0 = time.perf_counter_ns()
                await asyncio.sleep(max(tokens, 0) * cfg.ms_per_token / 1000)
                gen_ns += time.perf_counter_ns() - g0
            r = await self._io(prio, self.store.get, key)
            storage_ns += r.timing.total_ns
            decode_misses += not r.hit
        # Only whole requests are counted; a request cut by the end of the window is not.
        req = self.req
        req.completed += 1
        req.prompt_tokens += context_tokens
        req.generated_tokens += generate_tokens
        req.end_to_end.record_ns(time.perf_counter_ns() - t_submit)
        req.storage_io.record_ns(storage_ns)
        req.generation.record_ns(gen_ns)
        req.queue_wait.record_ns(t_start - t_submit)
        req.decode_reads += batches
        req.decode_misses += decode_misses
        req.by_profile[user.profile] = req.by_profile.get(user.profile, 0) + 1
        if multi_turn_hit is True:
            req.multi_turn_hits += 1
        elif multi_turn_hit is False:
            req.multi_turn_misses += 1
        if cfg.max_requests and req.completed >= cfg.max_requests:
            self._done.set()
