"""The in-process driver: simulated users issue requests against the tiered store, with no inference engine.

A request, in order: (prefix caching) read the conversation's system-prompt KV, or write it on a miss; (RAG) read
its top-k document chunks as one burst; (multi-turn) read the previous turn's KV; (prefill) write the KV of the
tokens this turn adds (its input plus the previous answer); (decode) read it ceil(generate_tokens / batch size) times,
with simulated generation time between batches. --prefill-only skips decode; --decode-only only reads pre-populated
entries.

--prefix-model chained replaces all of that with sessions in lockstep rounds whose KV is a chain of blocks, reused up
to the first block missing from every tier (replay/synthetic/chained.py; one row per round in `RunOutcome.rounds`).

--request-model reference does what the MLPerf reference does instead, so the same flags give comparable numbers:
a request's entry holds its whole context (the source's context tokens), every earlier turn of the conversation is
read back, a request of 10,000 context tokens or more is prefill only (no decode), decode is one read plus
ceil(generate_tokens / batch size) more with the generation time after them (a missing entry is written again),
--max-concurrent-allocs bounds the prefill writes only, and the I/O pool has min(users, 500) threads (the
reference's request threads) unless --io-workers is given.

Users are asyncio tasks (thousands are cheap); storage operations run in a pool of `io_workers` threads (their system
calls release the GIL), most urgent first: higher QoS class, then earlier request. At the end of the window no new
operation starts: users are cancelled, operations not yet started are dropped, those in flight finish, and the elapsed
time runs until the last of them did, so bandwidth is bytes over the real time it took.

The window holds whatever the load: users start in batches that yield to the event loop (100,000 users do not hold
it for seconds before the first timer can fire), starting stops at the deadline, and nothing on the loop does work
proportional to a request's size (payloads are views made on the I/O thread, entries bounded by
`Workload.entry_tokens`). What still runs past the deadline is measured and reported (`RunOutcome.window`): how late
the loop reached the deadline, and how long cancelling users and finishing in-flight operations took.
"""

from __future__ import annotations

import asyncio
import math
import random
import signal
import time
from dataclasses import dataclass, field

import xxhash

from kvconnector.errors import KvtierError
from kvconnector.histogram import LatencyHistogram
from kvconnector.store import TieredStore

from ..common.cli import loop_stop_signals
from .autoscaler import Autoscaler
from .chained import ChainedRounds
from .config import BenchConfig
from .executor import PriorityExecutor
from .payload import RandomPayload
from .trace_blocks import TraceBlocks
from .workload import Session, User, Workload

# Users started per event-loop turn: small enough that a timer (the end of the window, a signal) waits at most a few
# milliseconds for its turn, large enough that 100,000 users start in well under a second of loop time.
SPAWN_BATCH = 500
# --request-model reference: requests with this many context tokens or more are prefill only (the reference's rule).
REFERENCE_PREFILL_ONLY_TOKENS = 10_000


def _hist() -> LatencyHistogram:
    return LatencyHistogram()


@dataclass
class ClassStats:
    """Per-QoS-class latencies. Service latency = end to end minus simulated generation: what storage and queueing
    cost the request, which is what the class's SLA is judged on."""

    requests: int = 0
    end_to_end: LatencyHistogram = field(default_factory=_hist)
    service: LatencyHistogram = field(default_factory=_hist)


@dataclass
class RequestStats:
    """Request-level measurements, kept as histograms and sums (no per-request lists)."""

    completed: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    end_to_end: LatencyHistogram = field(default_factory=_hist)
    storage_io: LatencyHistogram = field(default_factory=_hist)
    generation: LatencyHistogram = field(default_factory=_hist)
    queue_wait: LatencyHistogram = field(default_factory=_hist)
    multi_turn_hits: int = 0
    multi_turn_misses: int = 0
    decode_reads: int = 0
    decode_misses: int = 0
    decode_bytes_read: int = 0  # KV bytes the decode reads got (the MLPerf spec's decode_bytes_read_gb)
    prefill_bytes_written: int = 0  # KV bytes of stored prefill entries (the reference's prefill_bytes_written_gb)
    prefix_hits: int = 0
    prefix_misses: int = 0
    prefix_bytes_saved: int = 0
    rag_queries: int = 0
    rag_chunk_reads: int = 0
    rag_chunk_misses: int = 0
    rag_burst: LatencyHistogram = field(default_factory=_hist)
    by_profile: dict[str, int] = field(default_factory=dict)
    by_class: dict[str, ClassStats] = field(default_factory=dict)


@dataclass
class RunOutcome:
    status: str  # completed | interrupted | failed
    error: str | None
    start_ns: int
    end_ns: int
    requests: RequestStats
    timeline: list[dict]
    autoscaling: list[dict]
    # Share of the I/O workers' time spent in storage operations: near 1 means storage-bound.
    io_saturation: float = 0.0
    # How the run kept its --duration window: see SyntheticDriver._window_report.
    window: dict = field(default_factory=dict)
    # --prefix-model chained: one row per completed round (replay's per-round columns); empty otherwise.
    rounds: list[dict] = field(default_factory=list)
    # --source: measured and predicted per-tier hit rates of the block-hash trace; empty otherwise.
    trace: dict = field(default_factory=dict)
    # The first exception of the run that is neither a storage failure nor the user's: a bug. The run stopped there
    # (status failed); the caller writes what was measured, then raises it (replay/cli.py logs its traceback).
    bug: BaseException | None = None

    @property
    def elapsed_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


def system_prompt_key(text: str) -> str:
    return "sys/" + xxhash.xxh3_64_hexdigest(text.encode())


def rag_key(doc: int, chunk: int) -> str:
    return f"rag/d{doc}/c{chunk}"


class SyntheticDriver:
    def __init__(
        self,
        cfg: BenchConfig,
        store: TieredStore,
        bytes_per_token: int,
        workload: Workload,
        payload: RandomPayload,
        seed: int,
        on_sample=None,
        sample_interval_s: float = 0.5,
        prepopulated: list[str] | None = None,
        phase_hook=None,
    ) -> None:
        self.cfg = cfg
        self.store = store
        self.bytes_per_token = bytes_per_token
        self.workload = workload
        self.payload = payload
        self.seed = seed
        self.on_sample = on_sample
        self.sample_interval_s = sample_interval_s
        self.prepopulated = prepopulated or []
        # Called as phase_hook(name) on the I/O thread before each store call (the I/O trace log's request phase).
        self.phase_hook = phase_hook
        self.req = RequestStats()
        self.timeline: list[dict] = []
        self.autoscaling: list[dict] = []
        self._status = "completed"
        self._error: str | None = None
        self.bug: BaseException | None = None
        self.stop_signal: int | None = None  # SIGINT or SIGTERM when the run was interrupted
        self._next_slot = 0.0
        self._users: list[tuple[User, asyncio.Task]] = []
        self._next_user_id = 0
        self._rng = random.Random(seed ^ 0xD21)
        self._class_window: dict[str, LatencyHistogram] | None = None
        # Made here so that a block no tier can take is a usage error before the run starts.
        self.chained = ChainedRounds(self) if cfg.prefix_model == "chained" else None
        self.trace = TraceBlocks(self) if cfg.source else None

    # ---- public ----------------------------------------------------------------------------------------------------
    def run(self) -> RunOutcome:
        return asyncio.run(self._run())

    def snapshot(self) -> dict:
        """Cumulative figures for progress views and the timeline."""
        return {
            **(self.chained.progress() if self.chained is not None else {}),
            **(self.trace.progress() if self.trace is not None else {}),
            "requests": self.req.completed,
            "read_bytes": sum(s.read.nbytes for s in self.store.stats),
            "written_bytes": sum(s.write.nbytes for s in self.store.stats),
            "users": sum(1 for u, _ in self._users if not u.stop) if self._users else 0,
            "tiers": {u["tier"]: {"entries": u["entries"], "used_bytes": u["used_bytes"]} for u in self.store.usage()},
        }

    # ---- run loop --------------------------------------------------------------------------------------------------
    async def _run(self) -> RunOutcome:
        loop = asyncio.get_running_loop()
        # SIGINT and SIGTERM end the run alike (partial results); the caller's handlers come back afterwards.
        with loop_stop_signals(loop, self._interrupt):
            return await self._window(loop)

    async def _window(self, loop: asyncio.AbstractEventLoop) -> RunOutcome:
        # A class's key names its queue (fair) or is its priority (strict: the smaller key first).
        fair = self.cfg.qos_scheduler == "fair"
        self._qos_key = {n: (-p.priority, n) if fair else -p.priority for n, p in self.cfg.qos_profiles.items()}
        weights = {self._qos_key[n]: p.share for n, p in self.cfg.qos_profiles.items()} if fair else None
        self._pool = PriorityExecutor(self.cfg.effective_io_workers, weights)
        self._alloc = asyncio.Semaphore(self.cfg.max_concurrent_allocs) if self.cfg.max_concurrent_allocs else None
        self._done = asyncio.Event()
        self._sessions_open: set[asyncio.Task] = set()
        self.start_ns = time.perf_counter_ns()
        self._deadline_ns = self.start_ns + int(self.cfg.duration * 1e9)
        self._next_slot = time.monotonic()
        self._spawners: set[asyncio.Task] = set()
        self._users_started_ns: int | None = None
        background = [self._watched(self._sample())]
        if self.chained is not None:
            background.append(self._watched(self._chained_rounds()))
        elif self.trace is not None:
            background.append(self._watched(self._trace_blocks()))
        elif self.workload.timed:
            background.append(self._watched(self._dispatch_timed()))
        else:
            self._scale_to(self.cfg.num_users)
            if self.cfg.enable_autoscaling:
                background.append(self._watched(self._autoscale()))
        timed_out = False
        try:
            await asyncio.wait_for(self._done.wait(), timeout=self.cfg.duration)
        except TimeoutError:
            timed_out = True
        stop_ns = time.perf_counter_ns()
        tasks = [t for _, t in self._users] + list(self._sessions_open) + list(self._spawners) + background
        for t in tasks:
            t.cancel()
        if tasks:  # asyncio.wait, not gather: gather's per-child bookkeeping costs seconds for 100,000 users
            await asyncio.wait(tasks)
        cancelled_ns = time.perf_counter_ns()
        # Operations queued but not started are dropped; those in flight finish and count.
        await loop.run_in_executor(None, self._pool.shutdown)
        end_ns = time.perf_counter_ns()
        window = self._window_report(timed_out, stop_ns, cancelled_ns, end_ns, len(tasks))
        self._record_sample(end_ns)
        busy = self._pool.busy_ns() / max(1, self._pool.workers * (end_ns - self.start_ns))
        return RunOutcome(
            self._status,
            self._error,
            self.start_ns,
            end_ns,
            self.req,
            self.timeline,
            self.autoscaling,
            round(busy, 4),
            window,
            self.chained.rows if self.chained is not None else [],
            self.trace.report() if self.trace is not None else {},
            bug=self.bug,
        )

    def _window_report(self, timed_out: bool, stop_ns: int, cancelled_ns: int, end_ns: int, tasks: int) -> dict:
        """How long the run took beyond --duration, split by cause: the loop reaching the deadline late (too much
        work per loop turn), cancelling the users, and waiting for operations in flight to finish."""

        def s(ns: int) -> float:
            return round(ns / 1e9, 3)

        started = self._users_started_ns
        out = {
            "duration_s": self.cfg.duration,
            "ended_by": "duration"
            if timed_out
            else ("signal" if self._status == "interrupted" else "failure" if self._status == "failed" else "workload"),
            "users_requested": 0 if self.workload.timed else self.cfg.num_users,
            "users_started": self._next_user_id,
            "users_started_s": None if started is None else s(started - self.start_ns),
            "deadline_late_s": s(max(0, stop_ns - self.start_ns - int(self.cfg.duration * 1e9))) if timed_out else 0.0,
            "cancel_s": s(cancelled_ns - stop_ns),
            "in_flight_s": s(end_ns - cancelled_ns),
        }
        overrun = max(0.0, (end_ns - self.start_ns) / 1e9 - self.cfg.duration) if timed_out else 0.0
        out["overrun_s"] = round(overrun, 3)
        if overrun >= 0.5:
            parts = {
                "deadline_late_s": f"the event loop reached the deadline {out['deadline_late_s']} s late",
                "cancel_s": f"stopping {tasks} tasks took {out['cancel_s']} s",
                "in_flight_s": f"operations in flight took {out['in_flight_s']} s to finish",
            }
            worst = max(parts, key=lambda k: out[k])
            out["reason"] = parts[worst]
        if not self.workload.timed and not self.cfg.enable_autoscaling and self._next_user_id < self.cfg.num_users:
            out["reason"] = (
                f"only {self._next_user_id} of {self.cfg.num_users} users started within the window "
                f"(one event loop drives them all)" + (f"; {out['reason']}" if "reason" in out else "")
            )
        return out

    def _interrupt(self, signum: int = signal.SIGINT) -> None:
        if self._status == "completed":
            self._status = "interrupted"
            self.stop_signal = signum
        self._done.set()

    def stop(self) -> None:
        """End the window now, from the event loop's thread (e.g. in on_sample): status interrupted, no signal,
        partial results as for one. An MPI rank stops this way when another rank failed."""
        if self._status == "completed":
            self._status = "interrupted"
        self._done.set()

    def _fail(self, exc: BaseException) -> None:
        """End the run as failed: a storage failure (KvtierError, OSError) or, anything else, a bug (kept in
        `self.bug` for the caller to raise once the partial results are written)."""
        is_bug = not isinstance(exc, KvtierError | OSError)
        if self._status != "failed":
            self._status = "failed"
            self._error = f"internal error: {type(exc).__name__}: {exc}" if is_bug else str(exc)
        if is_bug and self.bug is None:
            self.bug = exc
        self._done.set()

    def _watched(self, coro) -> asyncio.Task:
        """A task of the run whose exception, should it end with one, fails the run (never lost with the task)."""
        task = asyncio.create_task(coro)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._fail(task.exception())

    def _now_s(self) -> float:
        return (time.perf_counter_ns() - self.start_ns) / 1e9

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

    # ---- users -----------------------------------------------------------------------------------------------------
    def _scale_to(self, n: int) -> None:
        """Really start or stop user workers until `n` are active (stopping ones finish their current request).
        New users start in batches of SPAWN_BATCH per loop turn (see _spawn)."""
        for t in self._spawners:  # a newer decision replaces a spawn still under way
            t.cancel()
        self._users = [(u, t) for u, t in self._users if not t.done()]
        active = [u for u, _ in self._users if not u.stop]
        for u in active[n:]:
            u.stop = True
        if n > len(active):
            task = self._watched(self._spawn(n - len(active)))
            self._spawners.add(task)
            task.add_done_callback(self._spawners.discard)
        elif self._users_started_ns is None:
            self._users_started_ns = time.perf_counter_ns()

    async def _spawn(self, count: int) -> None:
        for i in range(count):
            if i and i % SPAWN_BATCH == 0:
                await asyncio.sleep(0)  # let timers (the deadline), signals and running users have their turn
                if time.perf_counter_ns() >= self._deadline_ns:
                    return  # the window is over: users not started yet never will be (reported)
            user = self.workload.new_user(self._next_user_id)
            self._next_user_id += 1
            self._users.append((user, self._watched(self._user(user))))
        if self._users_started_ns is None:
            self._users_started_ns = time.perf_counter_ns()

    async def _user(self, user: User) -> None:
        try:
            # Past the deadline a user starts nothing new, so a loaded loop winds down instead of doing more work.
            while not user.stop and time.perf_counter_ns() < self._deadline_ns:
                session = self.workload.next_session(user)
                if session is None:  # the dataset is exhausted (--replay-cycles)
                    break
                await self._session(session, user)
            if self.workload.kind != "synthetic" and not any(not t.done() and u is not user for u, t in self._users):
                self._done.set()  # the last user finished the last cycle
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a storage failure or a bug: the run ends failed (`_fail` tells which)
            self._fail(exc)

    async def _chained_rounds(self) -> None:
        await self._drive(self.chained.run)

    async def _trace_blocks(self) -> None:
        await self._drive(self.trace.run)

    async def _drive(self, run) -> None:
        """Runs a mode that drives its own requests (chained rounds, a block-hash trace) as the run's one task."""
        self._users_started_ns = time.perf_counter_ns()
        self._next_user_id = self.cfg.num_users
        try:
            await run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a storage failure or a bug (never "completed" with rounds missing)
            self._fail(exc)

    async def _dispatch_timed(self) -> None:
        """Open loop: each session starts at its first turn's (scaled) trace time, its turns at theirs."""
        speed = self.cfg.trace_speedup
        base = None
        for session in self.workload.timed_sessions():
            first = session.conversation.turns[0].arrival_s or 0.0
            if base is None:
                base = first
            delay = (first + session.offset_s - base) / speed - self._now_s()
            if delay > 0:
                await asyncio.sleep(delay)
            task = self._watched(self._timed_session(session, base))
            self._sessions_open.add(task)
            task.add_done_callback(self._sessions_open.discard)
        while self._sessions_open:  # trace finished: end when its last session does
            await asyncio.gather(*list(self._sessions_open), return_exceptions=True)
        self._done.set()

    async def _timed_session(self, session: Session, base: float) -> None:
        try:
            await self._session(session, None, base)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a storage failure or a bug (`_fail` tells which)
            self._fail(exc)

    async def _session(self, session: Session, user: User | None, base: float | None = None) -> None:
        rng = user.rng if user else self._rng
        throughput = self.cfg.performance_profile == "throughput"
        prev_key, prev_output = None, 0
        reference = self.cfg.request_model == "reference"
        earlier: list[str] = []  # the session's keys so far (the reference re-reads every earlier turn)
        for i, turn in enumerate(session.conversation.turns):
            if user is not None:
                if user.stop or time.perf_counter_ns() >= self._deadline_ns:
                    return
                await asyncio.sleep(user.think_time(throughput))
            elif turn.arrival_s is not None:
                delay = (turn.arrival_s + session.offset_s - base) / self.cfg.trace_speedup - self._now_s()
                if delay > 0:
                    await asyncio.sleep(delay)
            key = f"{session.session_id}/t{i}"
            if reference:  # the request's whole context is its entry; every earlier turn is read back
                new_tokens = self.workload.entry_tokens(max(1, turn.input_tokens))
                reads = tuple(earlier)
            else:  # the tokens this turn adds (its input and the previous answer); the previous turn is read
                new_tokens = self.workload.entry_tokens(max(1, turn.input_tokens + prev_output))
                reads = (prev_key,) if prev_key is not None else ()
            await self._request(session, key, reads, new_tokens, turn.output_tokens, rng, first_turn=i == 0)
            prev_key, prev_output = key, turn.output_tokens
            earlier.append(key)

    # ---- autoscaling -----------------------------------------------------------------------------------------------
    async def _autoscale(self) -> None:
        cfg = self.cfg
        scaler = Autoscaler(cfg.autoscaler, cfg.autoscaler_mode, cfg.target_saturation)
        prev_busy, prev_tokens, prev_t = self._pool.busy_ns(), 0, self._now_s()
        # Per-class service latency of the current interval only, to judge SLAs as they are now.
        window = {c: LatencyHistogram() for c in cfg.qos_profiles}
        self._class_window = window
        while True:
            await asyncio.sleep(cfg.autoscaler.interval_s)
            now, busy = self._now_s(), self._pool.busy_ns()
            tokens = self.req.prompt_tokens + self.req.generated_tokens
            dt = max(now - prev_t, 1e-9)
            saturation = min(1.0, (busy - prev_busy) / 1e9 / (self._pool.workers * dt))
            throughput = (tokens - prev_tokens) / dt
            missed = [
                c for c, h in window.items() if h.count and h.percentile_ms(95) > cfg.qos_profiles[c].target_p95_ms
            ]
            users = sum(1 for u, _ in self._users if not u.stop)
            d = scaler.decide(now, users, throughput, saturation, missed)
            self.autoscaling.append(
                {
                    "t_s": round(now, 2),
                    "users": users,
                    "throughput_tokens_per_sec": round(throughput, 1),
                    "saturation": round(saturation, 3),
                    "action": d.action,
                    "reason": d.reason,
                    "next_users": d.users,
                }
            )
            if d.users != users:
                self._scale_to(d.users)
            prev_busy, prev_tokens, prev_t = busy, tokens, now
            for c in window:
                window[c] = LatencyHistogram()

    # ---- one request -----------------------------------------------------------------------------------------------
    async def _io(self, priority: tuple, phase: str, fn, *args):
        if self.phase_hook is None:
            return await self._pool.run(priority, fn, *args)
        hook = self.phase_hook

        def call():
            hook(phase)
            return fn(*args)

        return await self._pool.run(priority, call)

    async def _rate_limit(self) -> None:
        """Global request-rate cap: requests start at most `request_rate` per second, in slots."""
        if not self.cfg.request_rate:
            return
        now = time.monotonic()
        slot = max(now, self._next_slot)
        self._next_slot = slot + 1.0 / self.cfg.request_rate
        if slot > now:
            await asyncio.sleep(slot - now)

    async def _prefix(self, prio: tuple, session: Session, rng: random.Random) -> int:
        prompt = self.cfg.prefix_cache.system_prompts[session.system_prompt]
        key = system_prompt_key(prompt.text)
        nbytes = self.workload.entry_tokens(prompt.tokens) * self.bytes_per_token
        r = await self._io(prio, "prefix", self.store.get, key)
        if r.hit:
            self.req.prefix_hits += 1
            self.req.prefix_bytes_saved += nbytes
            return r.timing.total_ns
        self.req.prefix_misses += 1  # computed again and stored for the next conversation
        w = await self._io(prio, "prefix", self.store.put, key, self.payload.chunks(nbytes, rng))
        return r.timing.total_ns + w.timing.total_ns

    async def _rag(self, prio: tuple, rng: random.Random) -> int:
        rc = self.cfg.rag
        chunks = self.workload.rag_docs
        docs = len(chunks)
        # zipfian: retrieval favours some documents (1/rank), as real corpora do; uniform (random): any document.
        weights = [1 / (d + 1) for d in range(docs)] if rc.retrieval_distribution == "zipfian" else None
        picks = set()
        for _ in range(rc.top_k):
            d = rng.choices(range(docs), weights=weights)[0]
            picks.add((d, rng.randrange(chunks[d])))
        t0 = time.perf_counter_ns()
        results = await asyncio.gather(*(self._io(prio, "rag", self.store.get, rag_key(d, c)) for d, c in picks))
        storage = sum(r.timing.total_ns for r in results)
        for (d, c), r in zip(picks, results):
            if not r.hit:  # chunk KV evicted: recomputed and stored again
                self.req.rag_chunk_misses += 1
                w = await self._io(
                    prio,
                    "rag",
                    self.store.put,
                    rag_key(d, c),
                    self.payload.chunks(
                        self.workload.entry_tokens(rc.chunk_tokens_for(self.bytes_per_token)) * self.bytes_per_token,
                        rng,
                    ),
                )
                storage += w.timing.total_ns
        self.req.rag_queries += 1
        self.req.rag_chunk_reads += len(picks)
        self.req.rag_burst.record_ns(time.perf_counter_ns() - t0)
        return storage

    def _reference_prefill_only(self, context_tokens: int) -> bool:
        """The reference marks a request of REFERENCE_PREFILL_ONLY_TOKENS or more context tokens PREFILL: it is
        written and never decoded (--decode-only reads pre-populated entries whatever their size)."""
        return context_tokens >= REFERENCE_PREFILL_ONLY_TOKENS and not self.cfg.decode_only

    async def _reference_decode(
        self, prio: tuple, key: str, read_key: str, tokens: int, generate_tokens: int, rng: random.Random
    ) -> tuple[int, int, int, int, int]:
        """The reference's decode: one read of the entry, then ceil(generate_tokens / batch size) more, and the
        simulated generation time once after them; a missing entry is written again instead (not on a decode-only
        node). Returns (storage ns, generation ns, reads, misses, bytes read)."""
        cfg = self.cfg
        r = await self._io(prio, "decode", self.store.get, read_key)
        storage_ns, reads, misses, nbytes = r.timing.total_ns, 1, int(not r.hit), r.timing.nbytes
        if not r.hit:
            if not cfg.decode_only:
                chunks = self.payload.chunks(tokens * self.bytes_per_token, rng)
                w = await self._io(prio, "prefill", self.store.put, key, chunks)
                storage_ns += w.timing.total_ns
        else:
            for _ in range(max(1, math.ceil(generate_tokens / cfg.decode.batch_size))):
                r = await self._io(prio, "decode", self.store.get, read_key)
                storage_ns += r.timing.total_ns
                reads += 1
                misses += not r.hit
                nbytes += r.timing.nbytes
        gen_ns = 0
        if cfg.ms_per_token and generate_tokens > 0:
            g0 = time.perf_counter_ns()
            await asyncio.sleep(generate_tokens * cfg.ms_per_token / 1000)
            gen_ns = time.perf_counter_ns() - g0
        return storage_ns, gen_ns, reads, misses, nbytes

    async def _request(
        self,
        session: Session,
        key: str,
        prev_keys: tuple[str, ...],
        new_tokens: int,
        generate_tokens: int,
        rng: random.Random,
        first_turn: bool,
    ) -> None:
        cfg = self.cfg
        t_submit = time.perf_counter_ns()
        prio = (self._qos_key[session.qos], t_submit)
        await self._rate_limit()
        storage_ns = 0
        multi_turn_hits = multi_turn_misses = 0
        read_key = key
        prefill_bytes = 0
        reference = cfg.request_model == "reference"
        # kvtier: --max-concurrent-allocs bounds requests in their storage phase; the reference bounds the prefill
        # write only (and by default nothing: its request threads, min(users, 500), are the only bound).
        alloc = None if reference else self._alloc
        if alloc:
            await alloc.acquire()
        try:
            t_start = time.perf_counter_ns()
            if session.system_prompt is not None and first_turn and not cfg.decode_only:
                storage_ns += await self._prefix(prio, session, rng)
            if cfg.enable_rag and not cfg.decode_only and rng.random() < cfg.rag.probability:
                storage_ns += await self._rag(prio, rng)
            if cfg.decode_only:
                read_key = rng.choice(self.prepopulated)
            else:
                for prev_key in prev_keys:
                    r = await self._io(prio, "multi_turn", self.store.get, prev_key)
                    storage_ns += r.timing.total_ns
                    multi_turn_hits += r.hit
                    multi_turn_misses += not r.hit
                chunks = self.payload.chunks(new_tokens * self.bytes_per_token, rng)
                if reference and self._alloc:
                    async with self._alloc:
                        w = await self._io(prio, "prefill", self.store.put, key, chunks)
                else:
                    w = await self._io(prio, "prefill", self.store.put, key, chunks)
                storage_ns += w.timing.total_ns
                prefill_bytes = new_tokens * self.bytes_per_token if w.stored else 0
        finally:
            if alloc:
                alloc.release()
        gen_ns = 0
        batches = 0
        decode_misses = 0
        decode_bytes = 0
        if reference and not cfg.prefill_only and not self._reference_prefill_only(new_tokens):
            ns, gen_ns, batches, decode_misses, decode_bytes = await self._reference_decode(
                prio, key, read_key, new_tokens, generate_tokens, rng
            )
            storage_ns += ns
        elif not cfg.prefill_only and not reference:
            batches = max(1, math.ceil(generate_tokens / cfg.decode.batch_size))
            for b in range(batches):
                tokens = min(cfg.decode.batch_size, generate_tokens - b * cfg.decode.batch_size)
                if cfg.ms_per_token and tokens > 0:
                    g0 = time.perf_counter_ns()
                    await asyncio.sleep(tokens * cfg.ms_per_token / 1000)
                    gen_ns += time.perf_counter_ns() - g0
                r = await self._io(prio, "decode", self.store.get, read_key)
                storage_ns += r.timing.total_ns
                decode_misses += not r.hit
                decode_bytes += r.timing.nbytes
        self._record_request(
            session,
            t_submit,
            t_start,
            prompt_tokens=new_tokens,
            generated_tokens=generate_tokens,
            storage_ns=storage_ns,
            gen_ns=gen_ns,
            prefill_bytes=prefill_bytes,
            multi_turn=(multi_turn_hits, multi_turn_misses),
            decode=(batches, decode_misses, decode_bytes),
        )

    def _record_request(
        self,
        session: Session,
        t_submit: int,
        t_start: int,
        *,
        prompt_tokens: int,
        generated_tokens: int,
        storage_ns: int,
        gen_ns: int,
        prefill_bytes: int,
        multi_turn: tuple[int, int],
        decode: tuple[int, int, int] = (0, 0, 0),
    ) -> None:
        """Count one whole request (a request cut by the end of the window is not counted)."""
        cfg = self.cfg
        e2e = time.perf_counter_ns() - t_submit
        req = self.req
        req.completed += 1
        req.prompt_tokens += prompt_tokens
        req.generated_tokens += generated_tokens
        req.end_to_end.record_ns(e2e)
        req.storage_io.record_ns(storage_ns)
        req.generation.record_ns(gen_ns)
        req.queue_wait.record_ns(t_start - t_submit)
        req.decode_reads += decode[0]
        req.decode_misses += decode[1]
        req.decode_bytes_read += decode[2]
        req.prefill_bytes_written += prefill_bytes
        req.by_profile[session.profile] = req.by_profile.get(session.profile, 0) + 1
        cls = req.by_class.setdefault(session.qos, ClassStats())
        cls.requests += 1
        cls.end_to_end.record_ns(e2e)
        cls.service.record_ns(e2e - gen_ns)
        if self._class_window is not None and session.qos in self._class_window:
            self._class_window[session.qos].record_ns(e2e - gen_ns)
        req.multi_turn_hits += multi_turn[0]
        req.multi_turn_misses += multi_turn[1]
        if cfg.max_requests and req.completed >= cfg.max_requests:
            self._done.set()
