"""The in-process driver: simulated users issue requests against the tiered store, with no inference engine.

Here: the run's window (start, deadline, stop on a signal or a failure, the samples); users and sessions are
scheduled by scheduling.py, each request simulated by request.py, measured in stats.py.

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
import random
import signal
import time

from kvconnector.errors import KvtierError
from kvconnector.histogram import LatencyHistogram
from kvconnector.store import TieredStore

from ..common.cli import loop_stop_signals
from .chained import ChainedRounds
from .config import BenchConfig
from .executor import PriorityExecutor
from .payload import RandomPayload
from .request import SimulatedRequest
from .request_queue import RequestQueue
from .scheduling import UserScheduling
from .stats import RequestStats, RunOutcome
from .trace_blocks import TraceBlocks
from .workload import User, Workload


class SyntheticDriver(UserScheduling, SimulatedRequest):
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
        self._queue: RequestQueue | None = None  # the reference's request queue (request_queue.py), when used

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
            if self._reference_queue_used():
                self._queue = RequestQueue(self.cfg.effective_io_workers, self._fail)
                background += [self._watched(self._queue.work()) for _ in range(self._queue.workers)]
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
        if self._queue is not None:
            window["request_queue"] = self._queue.report()
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
