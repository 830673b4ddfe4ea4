"""`kvtier replay`: replay ShareGPT / BurstGPT / synthetic load against an OpenAI-compatible server.

The command: its configuration read (config.py), its outputs claimed, the run (run.py, which sets up with
prepare.py), its results written (results.py) and the exit status; or, under mpirun, one rank of the job (mpi_run.py).
"""

from __future__ import annotations

import asyncio
import signal
import sys

from kvconnector.errors import UserError

from ..common.cli import (
    Interrupted,
    command,
    exit_code,
    fail,
    signal_name,
    stop_signals_raise,
)
from ..mpi import world_size
from .config import PROG, ReplayConfig, load_config
from .driver import RunState
from .mpi_run import ReplaySteps, run_rank
from .results import check_output_paths, report, summarize, write_outputs, write_partial, write_run_outputs
from .run import run


@command("replay")
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if world_size() > 1:  # started by mpirun: this process is one rank of the job
        return run_rank(
            ReplaySteps(
                load=lambda: load_config(argv),
                check=check_output_paths,
                run=run,
                summarize=summarize,
                write=write_outputs,
                report=report,
            )
        )
    cfg = load_config(argv)  # a refusal raises a UserError: replay/cli.py says it in one line, exit 2
    with check_output_paths(cfg):
        return _run_and_write(cfg)


def _run_and_write(cfg: ReplayConfig) -> int:
    """The run, then its outputs. A refusal found while reading the source (a UserError) writes nothing; a bug
    (any other exception) writes what was measured, then is raised for replay/cli.py to log (exit 1)."""
    state = RunState()
    meta: dict = {}
    code = 0
    try:
        with stop_signals_raise():  # a signal before the event loop listens stops the run the same way
            meta = asyncio.run(run(cfg, state))
    except KeyboardInterrupt as exc:
        signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
        state.stop_signal = state.stop_signal or signum
        state.aborted = state.aborted or f"interrupted ({signal_name(signum)}): partial results"
    except UserError:
        raise
    except Exception as bug:
        state.aborted = state.aborted or f"internal error: {type(bug).__name__}: {bug}"
        write_partial(cfg, state, meta, bug)
    if state.aborted:
        code = exit_code(state.stop_signal) if state.stop_signal else 3
        print(f"{PROG}: run ended early: {state.aborted}", file=sys.stderr)
    try:
        summary = write_run_outputs(cfg, state, meta)
    except OSError as exc:
        return fail(PROG, f"cannot write results: {exc}", 1)
    return report(cfg, summary, code)


if __name__ == "__main__":  # as `kvtier ...`: logging and signals set up by the dispatcher (replay/cli.py)
    from replay.cli import main as kvtier

    sys.exit(kvtier(["replay", *sys.argv[1:]]))
