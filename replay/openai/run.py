"""One run of `kvtier replay` in its event loop: set-up (`prepare`), the window paced as asked, a stop signal heard
(partial results), the live line on stderr; or one MPI rank's share of a job (mpi_run.RankJob)."""

from __future__ import annotations

import asyncio
import os
import random
import sys
import time

from ..common.cli import (
    loop_stop_signals,
    signal_name,
)
from ..outputs.progress import LiveLine, stderr_is_terminal
from .config import PROG, ReplayConfig
from .driver import Driver, DriverOptions, RunState
from .prepare import prepare


async def _progress(state: RunState, stop: asyncio.Event, target: float | None) -> None:
    """The sent/done line on stderr until `stop` is set, every half second, erased at the end."""
    last_t, last_sent = time.perf_counter(), 0
    with LiveLine(transient=True) as line:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), 0.5)
            except TimeoutError:
                pass
            now = time.perf_counter()
            rate = (state.sent - last_sent) / (now - last_t) if now > last_t else 0.0
            last_t, last_sent = now, state.sent
            tgt = f" (target {target:g})" if target else ""
            line.show(
                f"sent {state.sent}/{state.scheduled_total}  in flight {state.in_flight}  done {state.done}  "
                f"errors {state.errors}  rate {rate:.1f}/s{tgt}"
            )


async def run(cfg: ReplayConfig, state: RunState, job=None) -> dict:
    """Set up, then the window; `job` is this process's rank of `mpirun -n N kvtier replay` (mpi_run.RankJob), which
    takes the rank's share of the plans and keeps the ranks in step, or None for a run of its own."""
    opts = DriverOptions(
        base_url=cfg.base_url,
        model=cfg.model,
        endpoint=cfg.endpoint,
        api_key=os.environ.get(cfg.api_key_env),
        max_concurrency=cfg.max_concurrency,
        think_time_ms=cfg.think_time_ms,
        request_timeout_s=cfg.request_timeout,
        request_max_time_s=cfg.request_max_time,
        ignore_eos=bool(cfg.ignore_eos or cfg.rounds),
        continuous_usage=not cfg.no_continuous_usage,
        metrics_urls=list(cfg.metrics_url),
        metrics_interval_s=cfg.metrics_interval,
        warmup_requests=cfg.warmup,
    )
    drv = Driver(opts, state)
    rng = random.Random(cfg.seed)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_signal(signum: int) -> None:
        state.stop_signal = state.stop_signal or signum
        drv.abort(f"interrupted ({signal_name(signum)}): partial results")

    with loop_stop_signals(loop, on_signal):  # the caller's handlers come back afterwards
        if job is not None and job.received:  # a signal before the event loop listened
            on_signal(job.received[0])
        return await _set_up_and_window(cfg, state, job, drv, rng, loop, stop)


async def _set_up_and_window(cfg: ReplayConfig, state: RunState, job, drv: Driver, rng, loop, stop) -> dict:
    meta: dict = {}
    async with drv.open_session():
        if job is None:  # a signal during set-up (the /tokenize probe) ends it at once, nothing sent
            prepared = await drv.unless_aborted(prepare(cfg, drv, rng, state))
            if prepared is None:
                return meta
            pacing, plans, offsets, traced, meta = prepared
            await drv.warmup(plans)
        else:  # this rank's share, warmed up, once every rank has set up
            pacing, plans, offsets, traced, meta = await job.set_up(prepare(cfg, drv, rng, state), drv)
        state.metrics_start = await drv.snapshot()
        if state.metrics_start is not None and state.metrics_start.errors:  # said once; the run goes on
            print(
                f"{PROG}: warning: --metrics-url: {'; '.join(state.metrics_start.errors)}; the run goes on without "
                "those metrics",
                file=sys.stderr,
            )
            if not state.metrics_start.values:
                meta["metrics_warning"] = f"no metrics read: {'; '.join(state.metrics_start.errors)}"
        scraper = asyncio.create_task(drv.scrape_loop()) if cfg.metrics_url else None
        show = not cfg.quiet and stderr_is_terminal()
        prog = asyncio.create_task(_progress(state, stop, meta.get("target_rate"))) if show else None
        if job is not None:
            job.start()  # the ranks' windows start together, after rank 0's first scrape
        watch = asyncio.create_task(job.watch(drv)) if job is not None else None
        window = loop.call_later(cfg.duration, drv.close_window) if cfg.duration else None
        try:
            if pacing == "rounds":
                await drv.run_rounds(plans, cfg.rounds)
            elif pacing == "think":
                await drv.run_linked(plans)
            elif pacing == "closed":
                await drv.run_closed_loop(plans, cfg.users)
            else:
                await drv.run_open_loop(plans, offsets, traced)
        finally:
            if window:
                window.cancel()
            stop.set()
            if prog:
                await prog
            if scraper:
                scraper.cancel()
                await asyncio.gather(scraper, return_exceptions=True)
            if watch is not None:
                watch.cancel()
                await job.done(state)  # every rank's window over before the last scrape
            if cfg.metrics_url and (not drv.aborted or state.window_closed):
                await drv.snapshot()
    meta["pacing"] = pacing
    return meta
