"""`mpirun -n N kvtier replay ...`: one load generator per MPI rank, on one host or many, one merged result on rank 0.

No flag is needed: started by mpirun (replay.mpi.world_size, the detection `kvtier bench` uses), each process is
rank r of n. Every rank reads the same command line and builds the same plans from the source (same --seed), then
keeps its share:
- sessions round robin by their index in the source (a session's turns stay on one rank, so its prefix reuse is the
  same as in one process; a single-turn source's requests are split the same way, one by one), each at the time the
  whole job's schedule gives it: the ranks together send the schedule one process would have sent;
- --max-concurrency, --users and --warmup are totals for the job, divided among the ranks (the first ranks take one
  more when they do not divide); --request-rate and --num-requests are the job's, since the schedule is;
- rank 0 alone scrapes --metrics-url (the server's counters are the job's) and writes every output.

Every rank takes the same collective steps in the same order, whatever happened to it, so that none waits for one
that has left:
1. the command line checked by every rank and the verdicts gathered, then the output paths by rank 0: a mistake on
   any rank is one line from rank 0 (naming the rank when the others did not make it) and exit 2 on every rank,
   before any request;
2. set-up (the source read, the prompts made, this rank's warm-up), then an allgather of set-up errors: a rank that
   cannot read its dataset stops the job before any window;
3. rank 0's first scrape, a barrier, and the windows start together. A rank whose window ends other than completed
   (a signal, the server gone) tells the others (replay.mpi.Peers), which stop within 0.1 s;
4. every rank waits for the others' ends (rank 0 then scrapes the last time), the per-rank summaries (and the
   per-request rows when --detail, --csv or --plots asks for them) are gathered on rank 0, merged (merge.py) and
   written; every rank exits with rank 0's exit code.

Interrupting: SIGINT or SIGTERM to one rank stops it like a run of its own, and the others with it; rank 0 writes the
merged partial results and every rank exits 128 + the signal. Ctrl-C on mpirun sends SIGTERM to every rank and, with
Open MPI, SIGKILL a second later: give the ranks time to write with `mpirun --mca odls_base_sigkill_timeout 10` (the
merged partial results are written; mpirun exits with its own status, 1 for Open MPI 4).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from kvconnector.errors import ConfigError, UserError
from replay.openai.driver import RunState
from replay.openai.merge import merge_ranks, rank_clock

from ..common.cli import exit_code, fail
from ..mpi import RANK_ENV, Peers, env_int, first_error, launch_problem, recorded_stop_signals, split, world_size

PROG = "kvtier replay"
WATCH_EVERY_S = 0.1


@dataclass(frozen=True)
class ReplaySteps:
    """What a rank does that a run of its own does too (replay/openai/cli.py puts them together)."""

    load: Callable[[], Any]  # the command line's ReplayConfig
    check: Callable[[Any], None]  # every output path writable (rank 0)
    run: Callable[..., Awaitable[dict]]  # run(cfg, state, job) -> meta
    summarize: Callable[[Any, RunState, dict], dict]  # one rank's summary
    write: Callable[..., dict]  # write(cfg, summary, rows) -> the summary as written
    report: Callable[[Any, dict, int], int]  # the closing tables -> exit code


class JobFailed(Exception):
    """A rank failed before the windows: every rank raises it, with the same (exit code, line)."""

    def __init__(self, code: int, line: str) -> None:
        super().__init__(line)
        self.code, self.line = code, line


def check_modes(cfg, size: int) -> None:
    """What cannot be divided among `size` ranks, refused in one line."""
    if cfg.rounds:
        raise ConfigError("--rounds advances every session in lock step, one scrape per round: not under mpirun")
    if cfg.max_concurrency is not None and cfg.max_concurrency < size:
        raise ConfigError(
            f"--max-concurrency {cfg.max_concurrency} is the job's total, divided among {size} ranks: give at least "
            f"{size}"
        )
    if cfg.users is not None and cfg.users < size:
        raise ConfigError(f"--users {cfg.users} is the job's total, divided among {size} ranks: give at least {size}")


def rank_config(cfg, rank: int, size: int):
    """Rank r's config: its share of the totals; the server's metrics scraped by rank 0 only; no live view."""
    return cfg.model_copy(
        update={
            "max_concurrency": split(cfg.max_concurrency, size, rank) if cfg.max_concurrency else None,
            "users": split(cfg.users, size, rank) if cfg.users else None,
            "warmup": split(cfg.warmup, size, rank),
            "metrics_url": list(cfg.metrics_url) if rank == 0 else [],
            "quiet": True,
        }
    )


class RankJob:
    """This rank's collective steps around the window (used by cli._run); `close` takes the steps a rank that broke
    off did not take, so the others are never left waiting."""

    def __init__(self, comm, mpi, received: list[int]) -> None:
        self.comm, self.mpi = comm, mpi
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.received = received
        self.peers = Peers(comm.Dup(), mpi)
        self.stopped_by: str | None = None  # another rank's end that stopped this one
        self._set_up = self._started = self._done = False

    def share(self, plans: list, offsets: list | None) -> tuple[list, list | None]:
        """Sessions round robin by index (the schedule's offsets with them)."""
        mine = range(self.rank, len(plans), self.size)
        return [plans[i] for i in mine], None if offsets is None else [offsets[i] for i in mine]

    def _verdict(self, err: tuple[int, str] | None) -> None:
        self._set_up = True
        failed = first_error(self.comm.allgather(err))
        if failed:
            raise JobFailed(*failed)

    async def set_up(self, prepared: Awaitable[tuple], drv) -> tuple:
        """The source read and planned (`prepared`), this rank's share kept and warmed up; then every rank's verdict."""
        err, out = None, None
        try:
            pacing, plans, offsets, traced, meta = await prepared
            plans, offsets = self.share(plans, offsets)
            await drv.warmup(plans)
            out = pacing, plans, offsets, traced, dict(meta, rank=self.rank, sessions=len(plans))
        except UserError as exc:
            err = (2, str(exc))
        except Exception as exc:  # a bug: the other ranks must still hear of it
            err = (1, f"{type(exc).__name__}: {exc}")
        self._verdict(err)
        return out

    def start(self) -> None:
        self._started = True
        self.comm.Barrier()
        self.peers.start()

    async def watch(self, drv) -> None:
        """Stop this rank's run when another rank's ended other than completed."""
        while self.peers.stop_reason is None:
            await asyncio.sleep(WATCH_EVERY_S)
        self.stopped_by = self.peers.stop_reason
        drv.abort(f"stopped early: {self.stopped_by}")

    def _send_done(self, state: RunState, error: str | None = None) -> None:
        self._done = True
        if error is not None or (state.aborted and self.stopped_by is None and not state.stop_signal):
            status = "failed"
        elif state.aborted:
            status = "interrupted"
        else:
            status = "completed"
        self.peers.send_done(status, error or state.aborted)

    async def done(self, state: RunState) -> None:
        """This rank's window is over: tell the others, wait for theirs (in a thread: signals are still heard)."""
        self._send_done(state)
        await asyncio.to_thread(self.peers.finish)

    def close(self, state: RunState, error: str) -> None:
        """After an error out of cli._run: the collective steps this rank has not taken yet, with the error."""
        if not self._set_up:
            self._verdict((1, error))
        if not self._started:
            self.start()
        if not self._done:
            self._send_done(state, error)
            self.peers.finish()


@contextlib.contextmanager
def _silent(quiet: bool):
    """argparse's own output (--help, a bad flag) is the same on every rank: rank 0's alone is shown."""
    if not quiet:
        yield
        return
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        yield


def run_rank(steps: ReplaySteps) -> int:
    """This process as one rank of `mpirun -n N kvtier replay ...` (see the module's docstring)."""
    rank_env = env_int(RANK_ENV, 0)
    err, cfg = None, None
    try:
        with _silent(rank_env != 0):
            cfg = steps.load()
    except SystemExit as exc:  # argparse (--help, a bad flag): rank 0's parser has said it; none leaves before it did
        err = (exc.code if isinstance(exc.code, int) else 2, "")
    except UserError as exc:  # a --config file or an environment variable may differ by host
        err = (2, str(exc))
    problem = launch_problem()
    if problem:
        if rank_env == 0:
            fail(PROG, problem)
        return 2
    try:
        from mpi4py import MPI
    except ImportError:
        if rank_env == 0:
            fail(PROG, f"started by mpirun ({world_size()} processes) but mpi4py is not installed: pip install mpi4py")
        return 2

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if cfg is not None:
        try:
            check_modes(cfg, size)
        except ConfigError as exc:
            err = (2, str(exc))
    failed = first_error(comm.allgather(err))
    if failed and not failed[1]:
        return failed[0]
    if failed is None:  # rank 0 alone writes: its output paths checked there, its verdict told to every rank
        if rank == 0:
            try:
                steps.check(cfg)
            except UserError as exc:
                failed = (2, str(exc))
        failed = comm.bcast(failed, root=0)
    if failed:
        return fail(PROG, failed[1], failed[0]) if rank == 0 else failed[0]

    with recorded_stop_signals() as received:  # a signal outside the event loop: the run stops at its start
        return _run(MPI, comm, cfg, steps, received)


def _run(MPI, comm, cfg, steps: ReplaySteps, received: list[int]) -> int:
    rank, size = comm.Get_rank(), comm.Get_size()
    rank_cfg = rank_config(cfg, rank, size)
    job = RankJob(comm, MPI, received)
    state, meta, run_error = RunState(), {}, None
    try:
        meta = asyncio.run(steps.run(rank_cfg, state, job))
    except JobFailed as exc:
        return fail(PROG, f"{exc.line}; no rank ran", exc.code) if rank == 0 else exc.code
    except Exception as exc:  # a bug: its rank still takes every collective step, the others still merge
        run_error = f"{type(exc).__name__}: {exc}"
        try:
            job.close(state, run_error)
        except JobFailed as failed:
            return fail(PROG, f"{failed.line}; no rank ran", failed.code) if rank == 0 else failed.code

    # 4. the per-rank results to rank 0; the rows placed on the clock of the first rank's start.
    wall_ns = time.time_ns() - time.perf_counter_ns()
    start_unix_ns = state.t0_ns + wall_ns if state.t0_ns else time.time_ns()
    first_start_ns = min(comm.allgather(start_unix_ns))
    part: dict = {"rank": rank, "error": run_error, "stopped_by": job.stopped_by, "stop_signal": state.stop_signal}
    try:
        part["summary"] = steps.summarize(rank_cfg, state, meta)
        part["clock"] = rank_clock(state, wall_ns)
        if cfg.detail or cfg.csv or cfg.plots:
            t0 = state.t0_ns - (start_unix_ns - first_start_ns)
            rows = state.warmup_records + state.records
            part["rows"] = [dict(r.to_json(t0), rank=rank) for r in rows]
    except Exception as exc:
        part.update(summary=None, error=run_error or f"{type(exc).__name__}: {exc}")
    parts = comm.gather(part, root=0)
    code = _write_merged(cfg, steps, parts) if rank == 0 else None
    return comm.bcast(code, root=0)


def _write_merged(cfg, steps: ReplaySteps, parts: list[dict]) -> int:
    kept = [p for p in parts if p.get("summary") is not None]
    lost = [f"rank {p['rank']}: {p['error']}" for p in parts if p.get("summary") is None]
    if not kept:
        return fail(PROG, f"no rank produced results ({'; '.join(lost)})", 1)
    summary = merge_ranks(kept, percentiles=cfg.percentiles, slo=cfg.slo)
    errors = [f"rank {p['rank']}: {p['error']}" for p in kept if p.get("error")]
    if lost or errors:
        summary["aborted"] = "; ".join([*lost, *errors, *([summary["aborted"]] if summary["aborted"] else [])])
    signals = [p["stop_signal"] for p in parts if p.get("stop_signal")]
    code = 0
    if signals:
        code = exit_code(signals[0])
    elif lost or errors:
        code = 1
    elif summary["aborted"]:
        code = 3
    if summary["aborted"]:
        print(f"{PROG}: run ended early: {summary['aborted']}", file=sys.stderr)
    rows = [row for p in kept for row in p.get("rows") or []]
    try:
        summary = steps.write(cfg, summary, lambda warmup=False: (r for r in rows if warmup or not r["warmup"]))
    except OSError as exc:
        return fail(PROG, f"cannot write results: {exc}", 1)
    return steps.report(cfg, summary, code)
