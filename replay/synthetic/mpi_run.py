"""`mpirun -n N kvtier bench ...`: one client per MPI rank, on one host or many, one merged result from rank 0.

No flag is needed: `kvtier bench` started by mpirun (OMPI_COMM_WORLD_SIZE, or PMI_SIZE for MPICH/Hydra and Intel
MPI, above 1) runs as rank r of n. Each rank runs its share of the job (`multiclient.share_config`): its share of
the users, requests and request rate, seed + r, its own cache subdirectory `<cache-dir>/rank-<r>`, and the CPU, GPU
and disk capacities split among the ranks of its host. `--num-clients` stays the way to run several processes on
one host without MPI.

Every rank takes the same collective steps in the same order, whatever happened to it, so that no rank waits for
one that has left:
1. its config (and, on rank 0, the output paths) checked; rank 0's seed broadcast; the verdicts gathered: a bad
   command line stops every rank before any I/O, rank 0 says why;
2. set-up of its share (preconditioning, ingest), then an allgather of set-up errors, the barrier: all windows
   start together, or none does when a rank failed to set up;
3. the window. A watcher thread per rank receives the others' messages on a duplicated communicator: their live
   figures (rank 0 shows the sum) and one DONE each when their window ends. A DONE that is not `completed` (a
   rank failed, e.g. its disk filled, or was interrupted) stops this rank at its next sample (half a second);
4. each rank waits for the other n-1 DONEs (no message is left in flight), then the results are gathered on
   rank 0, which merges them with `merge.merge_results` (the code of `kvtier merge` and `--num-clients`), keeps
   each rank's own document under `clients` (with its `rank`), writes every output, and broadcasts the exit code
   that every rank then returns: mpirun exits with it (1 when a rank failed, with the partial results written).

Interrupting: a SIGINT or SIGTERM to one rank's process ends that rank's window like any run; the others stop and
rank 0 writes the merged partial results (exit 130/143). Ctrl-C on mpirun itself makes Open MPI kill every rank
(SIGTERM, then SIGKILL a second later): no merged results then.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

from kvconnector.errors import ConfigError, KvtierError

from ..common.cli import Interrupted, stop_signals_raise
from ..common.leftovers import remove_empty
from ..mpi import RANK_ENV, Peers, env_int, first_error, launch_problem, recorded_stop_signals, world_size
from ..outputs.io_trace import tagged
from .bench import Bench
from .config import BenchConfig
from .finish import bench_fail, finish
from .lifecycle import Invocation, check_invocation, check_modes, check_output_paths, clean_up, set_up
from .merge import merge_results, print_sources
from .multiclient import share_config, sum_snapshots
from .view import LiveView


def rank_config(cfg, rank: int, size: int, local_size: int) -> dict:
    data = share_config(
        cfg, rank, size, os.path.join(cfg.cache_dir, f"rank-{rank}") if cfg.cache_dir else None, local_size
    )
    data["io_trace_log"] = tagged(cfg.io_trace_log, f"rank-{rank}") if cfg.io_trace_log else None
    data["io_op_log"] = tagged(cfg.io_op_log, f"rank-{rank}") if cfg.io_op_log else None
    return data


def run_rank(load_config: Callable[[], BenchConfig], inv: Invocation) -> int:
    """This process as one rank of `mpirun -n N kvtier bench ...` (see the module's docstring); `load_config` reads the
    command line's configuration (each rank reads its own, so a mistake is found by all and told once)."""
    rank_env = env_int(RANK_ENV, 0)
    try:
        check_invocation(inv, world_size())
        problem = launch_problem()
        if problem:
            raise ConfigError(problem)
    except ConfigError as exc:  # before MPI starts: every rank refuses, rank 0 says why
        return bench_fail(str(exc)) if rank_env == 0 else 2
    try:
        from mpi4py import MPI
    except ImportError:
        if rank_env == 0:
            bench_fail(
                f"started by mpirun ({world_size()} processes) but mpi4py is not installed: pip install 'kvtier[mpi]'"
            )
        return 2

    comm = MPI.COMM_WORLD
    local_size = comm.Split_type(MPI.COMM_TYPE_SHARED).Get_size()
    with recorded_stop_signals() as received:  # a signal between the steps: the rank stops at its window's start
        return _run(MPI, comm, local_size, load_config, inv, received)


def _run(MPI, comm, local_size: int, load_config, inv: Invocation, received: list[int]) -> int:
    rank, size = comm.Get_rank(), comm.Get_size()
    peers_comm = comm.Dup()
    # 1. the command line, checked by every rank; output paths by rank 0, which alone writes.
    err = cfg = None
    output, is_default = None, False
    try:
        cfg = load_config()
        check_modes(cfg, inv, size)
        if rank == 0:
            output, is_default, _ = check_output_paths(cfg)  # claimed until the rank exits
    except ConfigError as exc:
        err = (2, str(exc))
    seed = cfg.seed if cfg is not None and cfg.seed is not None else int(time.time()) % 2**31
    seed = comm.bcast(seed, root=0)
    failed = first_error(comm.allgather(err))
    if failed:
        return bench_fail(failed[1], failed[0]) if rank == 0 else failed[0]
    cfg = cfg.model_copy(update={"seed": seed})
    rank_cfg = type(cfg).model_validate(rank_config(cfg, rank, size, local_size))

    # 2. set-up of this rank's share (op logs at <path>.rank-<r>, on the rank's own host), then the barrier (an
    # allgather of set-up errors).
    bench = Bench(rank_cfg)
    made_dir = bool(rank_cfg.cache_dir) and not os.path.lexists(rank_cfg.cache_dir)
    op_logs: list = []
    phase_hook = None

    def clean_up_rank() -> None:
        clean_up(bench, op_logs)
        if made_dir:  # the rank's subdirectory, if this rank made it and nothing is left in it (--keep-cache)
            try:
                os.rmdir(rank_cfg.cache_dir)
            except OSError:
                pass

    try:
        with stop_signals_raise():
            op_logs, phase_hook = set_up(bench, rank_cfg, notes=rank == 0, progress=cfg.progress and rank == 0)
    except ConfigError as exc:
        err = (2, str(exc))
    except KvtierError as exc:
        err = (1, str(exc))
    except Interrupted as exc:
        err = (exc.exit_code, f"interrupted during set-up ({exc})")
    failed = first_error(comm.allgather(err))
    if failed:
        clean_up_rank()
        return bench_fail(f"{failed[1]}; no rank ran", failed[0]) if rank == 0 else failed[0]

    # 3. the window, all ranks together; a rank that ends other than completed stops the others.
    peers = Peers(peers_comm, MPI)
    peers.start()
    doc, run_error = None, None
    stopped_for: list[str] = []
    try:
        with LiveView(cfg.duration, enabled=cfg.progress and rank == 0) as view:

            def on_sample(snap: dict) -> None:
                peers.send_status(snap)
                if rank == 0:
                    total = sum_snapshots([snap, *peers.snaps.values()])
                    view.update(dict(total, t_s=snap["t_s"]))
                reason = peers.stop_reason or (
                    f"{signal.Signals(received[0]).name} before the window" if received else None
                )
                if reason and not stopped_for and snap["t_s"] < cfg.duration:
                    stopped_for.append(reason)
                    bench.driver.stop()

            doc = bench.run(on_sample=on_sample, phase_hook=phase_hook)
    except KvtierError as exc:
        run_error = str(exc)
    except Exception as exc:  # a bug: the other ranks must still hear that this one ended
        run_error = f"{type(exc).__name__}: {exc}"
    finally:
        status = doc["status"] if doc else "failed"
        peers.send_done(status, doc.get("error") if doc else run_error)
        clean_up_rank()
    if doc is not None and stopped_for:
        doc["notes"] = [*doc["notes"], f"rank {rank} stopped early: {stopped_for[0]}"]

    # 4. every DONE received, then the results to rank 0.
    peers.finish()
    parts = comm.gather({"doc": doc, "error": run_error}, root=0)
    code = _write_merged(cfg, parts, output, is_default) if rank == 0 else None
    code = comm.bcast(code, root=0)
    # Every rank has cleaned up by now (it joined the gather): a parent of the ranks' directories that this rank made
    # (--cache-dir's missing part) held another rank's directory when this rank cleaned up, and is empty only now.
    remove_empty(bench.made_dirs)
    return code


def _write_merged(cfg, parts: list[dict], output: str, is_default: bool) -> int:
    ranks = [r for r, p in enumerate(parts) if p["doc"] is not None]
    lost = [f"rank {r}: {p['error']}" for r, p in enumerate(parts) if p["doc"] is None]
    if not ranks:
        return bench_fail(f"no rank produced results ({'; '.join(lost)})", 1)
    doc = merge_results(
        [parts[r]["doc"] for r in ranks], [f"rank-{r}" for r in ranks], cfg, extra=[{"rank": r} for r in ranks]
    )
    if lost:
        doc["status"] = "failed"
        doc["error"] = "; ".join([*lost, *([doc["error"]] if doc.get("error") else [])])
    stops = [s.get("stop_signal") for s in doc["clients"] if s.get("stop_signal")]
    if stops:
        doc["stop_signal"] = stops[0]
    print_sources(doc)
    return finish(doc, cfg, output, is_default)
