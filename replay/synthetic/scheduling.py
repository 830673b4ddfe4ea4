"""Who sends when in the in-process driver (mixed into SyntheticDriver): closed-loop users started in batches
that yield to the event loop, timed sessions at their trace times, the modes that drive their own requests
(chained rounds, a block-hash trace), and the autoscaler's decisions."""

from __future__ import annotations

import asyncio
import functools
import time

from kvconnector.histogram import LatencyHistogram

from .autoscaler import Autoscaler
from .workload import Session, User

# Users started per event-loop turn: small enough that a timer (the end of the window, a signal) waits at most a few
# milliseconds for its turn, large enough that 100,000 users start in well under a second of loop time.
SPAWN_BATCH = 500


class UserScheduling:
    """The users and sessions of SyntheticDriver, and the autoscaler's steps; each request goes to `_session`'s
    turns (request.py)."""

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
            request = functools.partial(
                self._request, session, key, reads, new_tokens, turn.output_tokens, rng, first_turn=i == 0
            )
            if self._queue is not None and user is not None:  # the reference's users do not wait for the answer
                t_submit = time.perf_counter_ns()
                prio = (-self.cfg.qos_profiles[session.qos].priority, t_submit)
                await self._queue.put(prio, functools.partial(request, t_submit=t_submit))
            else:
                await request()
            prev_key, prev_output = key, turn.output_tokens
            earlier.append(key)

    def _reference_queue_used(self) -> bool:
        """Synthetic users under --request-model reference put their requests on the reference's queue
        (request_queue.py) instead of waiting for each one."""
        return self.cfg.request_model == "reference" and self.workload.kind == "synthetic"

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
