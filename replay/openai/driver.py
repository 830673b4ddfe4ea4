"""The driver: sends session plans to the server on a precomputed schedule and collects request records.

Three ways to pace:
- open loop (default): the first turn of each session at its precomputed arrival offset (Poisson/gamma/constant, or the
  trace's timestamps); a later turn when the previous answer has arrived plus the think time (and, for traces, not
  before its own timestamp). The dispatcher sleeps to absolute deadlines ``t0 + offset``, so lateness never
  accumulates; each record keeps how late it was dispatched (send lag) and how long it then waited for a concurrency
  slot (client queue time) separately.
- closed loop (`users`): U users each run sessions back to back, with think time between turns.
- long sessions (`rounds`): C sessions advance one turn per round together; metrics are scraped between rounds, so
  each round gets its own row; the think time is a pause between rounds.
- linked sessions (an agentic trace under --trace-timing think): each conversation's calls go as the trace links
  them, a call its pause after the call it follows ended and once the sub-agents it joins have ended; a call is
  started only when what it waits for is over, so a run holds tasks for the calls due, not one per call.
Every multi-turn request sends the whole history with the server's own earlier answers appended.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp

from replay.openai.client import RequestRecord, RequestSpec, send_streaming
from replay.openai.server_metrics import Snapshot, scrape
from replay.openai.workload import SessionPlan, TurnPlan

T = TypeVar("T")

__all__ = ["Driver", "DriverOptions", "RunState"]

_CONNECTION_KINDS = ("connection",)


@dataclass
class DriverOptions:
    base_url: str
    model: str
    endpoint: str = "chat"  # chat | completions
    api_key: str | None = None
    max_concurrency: int | None = None
    think_time_ms: float = 0.0
    request_timeout_s: float = 600.0
    request_max_time_s: float = 1800.0
    ignore_eos: bool = False
    temperature: float | None = 0.0
    continuous_usage: bool = True
    session_header: str | None = "X-Session-ID"
    metrics_urls: list[str] = field(default_factory=list)
    metrics_interval_s: float = 5.0
    max_consecutive_connection_errors: int = 5
    warmup_requests: int = 0
    abort_grace_s: float = 2.0  # after Ctrl-C or a dead server, how long in-flight requests may still finish
    # Kept: the detail of each request's text answer only as long as its session needs it.
    start_lead_ms: float = 20.0


@dataclass
class RunState:
    """What the run produced; filled as it goes so an interrupted run still has it all."""

    records: list[RequestRecord] = field(default_factory=list)
    warmup_records: list[RequestRecord] = field(default_factory=list)
    t0_ns: int = 0
    end_ns: int = 0  # when the run's last request ended (set by the driver, also on an abort)
    sent: int = 0
    in_flight: int = 0
    done: int = 0
    errors: int = 0
    scheduled_total: int = 0
    aborted: str | None = None
    stop_signal: int | None = None  # SIGINT or SIGTERM, when one stopped the run
    window_closed: bool = False
    sessions_cut_by_error: int = 0
    turns_held_by_previous_answer: int = 0
    metrics_start: Snapshot | None = None
    metrics_last: Snapshot | None = None
    round_snapshots: list[tuple[int, int, int, Snapshot | None, Snapshot | None]] = field(default_factory=list)
    progress_target_rate: float | None = None


def render_completion_prompt(system: str | None, history: list[tuple[str, str]], user: str) -> str:
    parts = [system] if system else []
    for u, a in history:
        parts.append(f"User: {u}\nAssistant: {a}")
    parts.append(f"User: {user}\nAssistant:")
    return "\n\n".join(parts)


class Driver:
    def __init__(self, opts: DriverOptions, state: RunState | None = None):
        self.o = opts
        self.s = state or RunState()
        self._abort = asyncio.Event()
        self._consecutive_conn_errors = 0
        self.bug: BaseException | None = None  # the first exception of a request task: a bug (see _task)
        self._sem: asyncio.Semaphore | None = None
        self._next_id = 0
        self.session: aiohttp.ClientSession | None = None
        path = "/v1/chat/completions" if opts.endpoint == "chat" else "/v1/completions"
        self._url = opts.base_url.rstrip("/") + path
        self._timeout = aiohttp.ClientTimeout(
            total=opts.request_max_time_s, sock_connect=10, sock_read=opts.request_timeout_s
        )

    # ---------------------------------------------------------------- plumbing
    def open_session(self) -> aiohttp.ClientSession:
        headers = {"Authorization": f"Bearer {self.o.api_key}"} if self.o.api_key else {}
        # aiohttp would advertise gzip and deflate; the run reads the stream as it comes, so it asks for it plain.
        headers["Accept-Encoding"] = "identity"
        # One pool for the whole run; keep-alive connections are reused across requests and sessions.
        connector = aiohttp.TCPConnector(limit=self.o.max_concurrency or 0, keepalive_timeout=60, ttl_dns_cache=300)
        self.session = aiohttp.ClientSession(
            connector=connector, headers=headers, timeout=self._timeout, auto_decompress=False
        )
        return self.session

    def abort(self, reason: str) -> None:
        if self.s.aborted is None:
            self.s.aborted = reason
        self._abort.set()

    async def unless_aborted(self, aw: Awaitable[T]) -> T | None:
        """`aw`'s result, or None as soon as the run is aborted (Ctrl-C during set-up: the /tokenize probe waits for
        nothing more than the signal), `aw` then cancelled."""
        task = asyncio.ensure_future(aw)
        stop = asyncio.ensure_future(self._abort.wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            stop.cancel()
        if task.done():
            return task.result()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return None

    def close_window(self) -> None:
        """--duration reached: start nothing more; in-flight requests get `abort_grace_s`, as on an abort, but the
        run counts as complete (`window_closed`), not cut short."""
        if not self._abort.is_set():
            self.s.window_closed = True
            self._abort.set()

    @property
    def aborted(self) -> bool:
        return self._abort.is_set()

    def _payload(self, plan: SessionPlan, history: list[tuple[str, str]], text: str, turn: TurnPlan) -> dict[str, Any]:
        o = self.o
        if o.endpoint == "chat":
            msgs = [{"role": "system", "content": plan.system_prompt}] if plan.system_prompt else []
            for u, a in history:
                msgs.append({"role": "user", "content": u})
                msgs.append({"role": "assistant", "content": a})
            msgs.append({"role": "user", "content": text})
            p: dict[str, Any] = {"model": o.model, "messages": msgs}
        else:
            p = {"model": o.model, "prompt": render_completion_prompt(plan.system_prompt, history, text)}
        p["max_tokens"] = turn.max_tokens
        p["stream"] = True
        p["stream_options"] = (
            {"include_usage": True, "continuous_usage_stats": True} if o.continuous_usage else {"include_usage": True}
        )
        if o.temperature is not None:
            p["temperature"] = o.temperature
        if o.ignore_eos:
            p["ignore_eos"] = True
        return p

    async def _sleep_until(self, deadline_ns: int) -> None:
        # Plain sleeps (no task per wait); long ones in slices so an abort is noticed within 0.2 s.
        while not self._abort.is_set():
            delay = deadline_ns - time.perf_counter_ns()
            if delay <= 0:
                return
            await asyncio.sleep(min(delay / 1e9, 0.2))

    async def _send_turn(
        self,
        plan: SessionPlan,
        history: list[tuple[str, str]],
        turn: TurnPlan,
        text: str,
        turn_index: int,
        scheduled_ns: int,
        round_index: int | None = None,
        warmup: bool = False,
    ) -> RequestRecord:
        rid = self._next_id
        self._next_id += 1
        rec = RequestRecord(
            rid,
            plan.session_id,
            turn_index,
            round_index,
            warmup,
            turn.target_input_tokens,
            turn.max_tokens,
            scheduled_ns=scheduled_ns,
        )
        rec.dispatched_ns = time.perf_counter_ns()
        headers = {self.o.session_header: plan.session_id} if self.o.session_header else None
        spec = RequestSpec(
            rid,
            plan.session_id,
            turn_index,
            self._url,
            self._payload(plan, history, text, turn),
            headers,
            round_index,
            warmup,
            turn.target_input_tokens,
        )
        (self.s.warmup_records if warmup else self.s.records).append(rec)
        if self._sem is not None:
            try:
                await self._sem.acquire()
            except asyncio.CancelledError:
                rec.error_kind, rec.error = "cancelled", "run ended while waiting for a concurrency slot"
                raise
        try:
            rec.slot_ns = time.perf_counter_ns()
            if self.aborted:
                rec.error_kind, rec.error = "cancelled", "run ended before this request was sent"
                return rec
            self.s.sent += 1
            self.s.in_flight += 1
            try:
                await send_streaming(self.session, spec, rec, self._timeout)
            finally:
                self.s.in_flight -= 1
        finally:
            if self._sem is not None:
                self._sem.release()
        self.s.done += 1
        if not rec.success:
            self.s.errors += 1
            if rec.error_kind in _CONNECTION_KINDS or (rec.error_kind == "disconnected" and not rec.first_byte_ns):
                self._consecutive_conn_errors += 1
                if self._consecutive_conn_errors >= self.o.max_consecutive_connection_errors:
                    self.abort(
                        f"server unreachable: {self._consecutive_conn_errors} connection failures in a row "
                        f"({rec.error})"
                    )
        else:
            self._consecutive_conn_errors = 0
        return rec

    async def _run_session(self, plan: SessionPlan, first_deadline_ns: int, trace_t0_ns: int | None) -> None:
        history: list[tuple[str, str]] = []
        prev_done = 0
        for k, turn in enumerate(plan.turns):
            if self.aborted:
                return
            if k == 0:
                ready = first_deadline_ns
            else:
                ready = prev_done + int(self.o.think_time_ms * 1e6)
                if trace_t0_ns is not None and turn.arrival_offset_ns is not None:
                    own = trace_t0_ns + turn.arrival_offset_ns
                    if own < ready:
                        self.s.turns_held_by_previous_answer += 1
                    ready = max(ready, own)
            await self._sleep_until(ready)
            if self.aborted:
                return
            text = turn.text()  # made now, for a source that makes its prompts (TurnPlan.make_text)
            rec = await self._send_turn(plan, history, turn, text, k, ready)
            prev_done = time.perf_counter_ns()
            if not rec.success:
                if k + 1 < len(plan.turns):
                    self.s.sessions_cut_by_error += 1
                return  # the history would lack an answer: the rest of the session is not sent
            history.append((text, rec.output_text))
            rec.output_text = ""  # the history holds it now; the record need not

    # ---------------------------------------------------------------- warm-up and metrics
    async def warmup(self, plans: list[SessionPlan]) -> None:
        n = self.o.warmup_requests
        if n <= 0 or not plans:
            return
        tasks = []
        for i in range(n):
            plan = plans[i % len(plans)]
            wplan = SessionPlan(f"warmup-{i}", plan.turns[:1], plan.system_prompt)
            t = TurnPlan(f"warm-up {i}: " + plan.turns[0].text()[:200], min(plan.turns[0].max_tokens, 16), 0)
            tasks.append(self._send_turn(wplan, [], t, t.user_text, 0, time.perf_counter_ns(), warmup=True))
        await asyncio.gather(*tasks)

    async def scrape_loop(self) -> None:
        """Scrape the metrics endpoints every `metrics_interval_s` until the run is aborted (run it as a task)."""
        while not self._abort.is_set():
            try:
                await asyncio.wait_for(self._abort.wait(), self.o.metrics_interval_s)
            except TimeoutError:
                pass
            snap = await scrape(self.session, self.o.metrics_urls)
            if not snap.errors or snap.values:
                self.s.metrics_last = snap

    async def snapshot(self) -> Snapshot | None:
        if not self.o.metrics_urls:
            return None
        snap = await scrape(self.session, self.o.metrics_urls)
        if snap.values:
            self.s.metrics_last = snap
        return snap

    async def _finish(self, tasks) -> None:
        """Wait for every task; once the run is aborted, give in-flight requests `abort_grace_s`, then cancel them
        (their records say `cancelled`). A task that ended with an exception (a bug: requests record their errors,
        never raise) is raised here once every task is over, so the run's caller writes what was measured."""
        await self._wait_all(tasks)
        if self.bug is not None:
            raise self.bug

    def _task(self, coro) -> asyncio.Task:
        """A task of the run whose exception, should it end with one, is a bug: kept, and the run aborted."""
        task = asyncio.create_task(coro)
        task.add_done_callback(self._note_bug)
        return task

    def _note_bug(self, task: asyncio.Task) -> None:
        if task.cancelled() or task.exception() is None or self.bug is not None:
            return
        self.bug = task.exception()
        self.abort(f"internal error: {type(self.bug).__name__}: {self.bug}")

    async def _wait_all(self, tasks) -> None:
        pending = {t for t in tasks if not t.done()}
        if not pending:
            return
        stop = asyncio.ensure_future(self._abort.wait())
        try:
            while pending:
                done, _ = await asyncio.wait(pending | {stop}, return_when=asyncio.FIRST_COMPLETED)
                pending -= done
                if stop in done:
                    if pending:
                        _, pending = await asyncio.wait(pending, timeout=self.o.abort_grace_s)
                        for t in pending:
                            t.cancel()
                        await asyncio.gather(*pending, return_exceptions=True)
                    return
        finally:
            stop.cancel()

    # ---------------------------------------------------------------- the pacings
    def _ended(self) -> None:
        # The run's real end (its duration is t0 to here), whatever the records say: a request that timed out has no
        # chunk timestamp to measure it by.
        self.s.end_ns = time.perf_counter_ns()

    async def run_open_loop(self, plans: list[SessionPlan], first_offsets_ns: list[int], traced: bool) -> None:
        try:
            await self._open_loop(plans, first_offsets_ns, traced)
        finally:
            self._ended()

    async def run_closed_loop(self, plans: list[SessionPlan], users: int) -> None:
        try:
            await self._closed_loop(plans, users)
        finally:
            self._ended()

    async def run_linked(self, plans: list[SessionPlan]) -> None:
        try:
            self._sem = asyncio.Semaphore(self.o.max_concurrency) if self.o.max_concurrency else None
            self.s.scheduled_total = sum(len(p.turns) for p in plans)
            self.s.t0_ns = t0 = time.perf_counter_ns() + int(self.o.start_lead_ms * 1e6)
            await self._finish([self._task(self._linked_session(p, t0)) for p in plans])
        finally:
            self._ended()

    async def _linked_session(self, plan: SessionPlan, t0: int) -> None:
        """One conversation of linked calls (TurnPlan.after, joins, pause_ns): each started when the last of what it
        waits for ends; a call skipped (the run ended) still releases what waits for it."""
        turns = plan.turns
        waiting = [0] * len(turns)
        dependents: list[list[int]] = [[] for _ in turns]
        for k, t in enumerate(turns):
            for j in (t.after, *t.joins):
                if j >= 0:
                    waiting[k] += 1
                    dependents[j].append(k)
        ends = [0] * len(turns)
        tasks: set[asyncio.Task] = set()

        async def call(k: int) -> None:
            turn = turns[k]
            try:
                ready = (ends[turn.after] if turn.after >= 0 else t0) + turn.pause_ns
                ready = max([ready, *(ends[j] for j in turn.joins)])
                await self._sleep_until(ready)
                if not self.aborted:
                    text = turn.text()
                    rec = await self._send_turn(plan, [], turn, text, k, ready)
                    rec.output_text = ""  # the next call's prompt is made from the trace, not from this answer
            finally:
                ends[k] = time.perf_counter_ns()
            for d in dependents[k]:
                waiting[d] -= 1
                if not waiting[d]:
                    start(d)

        def start(k: int) -> None:
            task = self._task(call(k))
            tasks.add(task)

        for k in range(len(turns)):
            if not waiting[k]:
                start(k)
        try:
            while tasks:
                done, _ = await asyncio.wait(tasks)
                tasks.difference_update(done)
        except asyncio.CancelledError:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    async def run_rounds(self, plans: list[SessionPlan], rounds: int) -> None:
        try:
            await self._rounds(plans, rounds)
        finally:
            self._ended()

    async def _open_loop(self, plans: list[SessionPlan], first_offsets_ns: list[int], traced: bool) -> None:
        self._sem = asyncio.Semaphore(self.o.max_concurrency) if self.o.max_concurrency else None
        self.s.scheduled_total = sum(len(p.turns) for p in plans)
        self.s.t0_ns = t0 = time.perf_counter_ns() + int(self.o.start_lead_ms * 1e6)
        tasks: set[asyncio.Task] = set()
        order = sorted(range(len(plans)), key=lambda i: first_offsets_ns[i])
        for i in order:
            deadline = t0 + first_offsets_ns[i]
            await self._sleep_until(deadline)
            if self.aborted:
                break
            task = self._task(self._run_session(plans[i], deadline, t0 if traced else None))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await self._finish(list(tasks))

    async def _closed_loop(self, plans: list[SessionPlan], users: int) -> None:
        self._sem = None
        self.s.scheduled_total = sum(len(p.turns) for p in plans)
        self.s.t0_ns = t0 = time.perf_counter_ns() + int(self.o.start_lead_ms * 1e6)
        queue = deque(plans)

        async def user() -> None:
            ready = t0
            while queue and not self.aborted:
                plan = queue.popleft()
                await self._run_session(plan, ready, None)
                ready = time.perf_counter_ns() + int(self.o.think_time_ms * 1e6)

        await self._finish([self._task(user()) for _ in range(max(1, users))])

    async def _rounds(self, plans: list[SessionPlan], rounds: int) -> None:
        self._sem = asyncio.Semaphore(self.o.max_concurrency) if self.o.max_concurrency else None
        self.s.scheduled_total = sum(min(len(p.turns), rounds) for p in plans)
        self.s.t0_ns = time.perf_counter_ns() + int(self.o.start_lead_ms * 1e6)
        histories: dict[str, list[tuple[str, str]] | None] = {p.session_id: [] for p in plans}
        before = self.s.metrics_start

        async def one(plan: SessionPlan, r: int, start: int) -> None:
            hist = histories[plan.session_id]
            if hist is None or r >= len(plan.turns):
                return
            text = plan.turns[r].text()
            rec = await self._send_turn(plan, hist, plan.turns[r], text, r, start, round_index=r)
            if rec.success:
                hist.append((text, rec.output_text))
                rec.output_text = ""
            else:
                histories[plan.session_id] = None
                if r + 1 < min(len(plan.turns), rounds):
                    self.s.sessions_cut_by_error += 1

        for r in range(rounds):
            if self.aborted:
                break
            if r and self.o.think_time_ms:
                # the pause between rounds (think time): a cache's own timers (LMCache's once-a-second eviction) get
                # their share of a round, as in rounds of minutes, and the pause is no part of either round's wall
                await self._sleep_until(time.perf_counter_ns() + int(self.o.think_time_ms * 1e6))
                if self.aborted:
                    break
            start = max(time.perf_counter_ns(), self.s.t0_ns)
            await self._sleep_until(start)
            await self._finish([self._task(one(p, r, start)) for p in plans])
            end = time.perf_counter_ns()
            after = await self.snapshot()
            self.s.round_snapshots.append((r, start, end, before, after))
            before = after
