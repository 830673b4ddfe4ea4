"""The steps of one `kvtier bench` run, the same for every way of running it.

1. check: the modes asked for go together (`check_modes`) and every output path is writable (`check_output_paths`),
   before anything runs;
2. prepare and set up (`set_up`): the store and workload built, preconditioning and ingest done, the op logs attached;
3. run: the window (`Bench.run`), with a live view;
4. write (`finish.finish`): every output, the summary, the exit code;
5. clean up (`clean_up`): the op logs closed, the run's cache files removed, whatever happened before.

`run_single` strings them together in this process. `trials.run_trials` calls it once per trial;
`multiclient.run_clients` starts N child processes that each run it; `mpi_run` runs the same steps in every rank with
collective operations between them. The CLI module parses and picks one of these.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from kvconnector.errors import ConfigError, KvtierError, UserError

from ..common.cli import Interrupted, stop_signals_raise
from ..outputs.io_trace import compression
from ..outputs.paths import OutputClaim, claim_outputs, default_results_path
from .bench import Bench
from .config import BenchConfig
from .finish import PROG, bench_fail, finish
from .op_logs import attach_op_logs, detach_op_logs
from .trial_paths import trial_outputs
from .view import STATUS_ENV, LiveView, SetupProgress


@dataclass(frozen=True)
class Invocation:
    """What this command asks beyond the run's configuration: how many times to run it, and whether to check it."""

    trials: int | None = None
    vary_seed: bool = False
    submission_check: bool = False


# Trials run one after another, each a whole run with its own results file: the spec asks for 3-5, and 1,000 runs of
# the shortest useful length (a minute) are most of a day; every trial's plan and output path is made up front.
MAX_TRIALS = 1000


def check_invocation(inv: Invocation, ranks: int = 1) -> None:
    """The checks that need no configuration (made before MPI starts, so a refusal costs nothing)."""
    if inv.trials is not None and not 1 <= inv.trials <= MAX_TRIALS:
        raise ConfigError(f"--trials {inv.trials}: give 1 to {MAX_TRIALS}")
    if ranks > 1 and (inv.trials or inv.submission_check):
        # Never ignored silently: a trial is one whole mpirun job.
        raise ConfigError(
            "--trials and --submission-check do not run under mpirun: start mpirun once per trial, "
            "then `kvtier check` the results files"
        )


def check_modes(cfg: BenchConfig, inv: Invocation, ranks: int = 1) -> None:
    """Every combination of modes that cannot run together, refused in one place (ranks: MPI processes)."""
    check_invocation(inv, ranks)
    if cfg.num_clients > 1 and cfg.num_users < cfg.num_clients:
        raise ConfigError(f"--num-clients {cfg.num_clients} needs at least as many users (--num-users {cfg.num_users})")
    if cfg.source:
        # A trace of block hashes is its own workload: one stream of requests at the trace's times, on one store.
        clash = [
            flag
            for flag, on in (
                ("--use-burst-trace", cfg.use_burst_trace),
                ("--prefix-model chained", cfg.prefix_model == "chained"),
                ("--decode-only", cfg.decode_only),
                ("--enable-rag", cfg.enable_rag),
                ("--enable-autoscaling", cfg.enable_autoscaling),
                ("--num-clients > 1", cfg.num_clients > 1 or ranks > 1),
                ("--request-rate (the trace's times set the arrivals; --trace-speedup scales them)", cfg.request_rate),
            )
            if on
        ]
        if clash:
            raise ConfigError(f"--source {cfg.source} replays the trace's own requests: not with {clash[0]}")
    if ranks > 1:
        if cfg.num_clients > 1:
            raise ConfigError("--num-clients runs processes on one host; under mpirun each rank is one client (-n)")
        if cfg.enable_latency_tracing:
            raise ConfigError("--enable-latency-tracing traces one process: not under mpirun")
        if cfg.num_users < ranks:
            raise ConfigError(f"{ranks} ranks need at least as many users (--num-users {cfg.num_users})")


def check_output_paths(cfg: BenchConfig, trials: int | None = None) -> tuple[str, bool, OutputClaim]:
    """Check and claim every output path before anything runs (`claim_outputs`: distinct, not an input, writable);
    return (results path, whether it is the default name, the claim, held until the process ends). Under --trials
    the files claimed are the ones the trials write (results, CSV, XLSX and op logs per trial)."""
    output = cfg.output or default_results_path()
    for flag, path in (("--io-trace-log", cfg.io_trace_log), ("--io-op-log", cfg.io_op_log)):
        try:
            compression(path or "")  # a compressed name is written compressed, or refused now
        except ValueError as exc:
            raise ConfigError(f"{flag} {exc}") from None
    files = {
        # a default name is taken with an exclusive link when written (a same-second run gets the next name)
        "--output": cfg.output,
        "--xlsx-output": cfg.xlsx_output,
        "--csv-output": cfg.csv_output,
        "--html-output": cfg.html_output,
        "--io-trace-log": cfg.io_trace_log,
        "--io-op-log": cfg.io_op_log,
    }
    if trials:
        # the trials' page is of the trials document, written once at the end
        files = {"--output": cfg.output, "--html-output": cfg.html_output, **trial_outputs(cfg, output, trials)}
    inputs = {"--dataset-path": cfg.dataset_path, "--validation-trace": cfg.validation_trace}
    if cfg.use_burst_trace:
        inputs["--burst-trace-path"] = cfg.burst_trace_path
    claim = claim_outputs(
        files,
        {"--plots": cfg.plots, "--enable-latency-tracing": trace_dir(output) if cfg.enable_latency_tracing else None},
        inputs=inputs,
    )
    if cfg.enable_latency_tracing:  # before the set-up, so a user without root hears it at once
        from tracing.session import TracingUnavailable, check_available

        try:
            check_available()
        except TracingUnavailable as exc:
            claim.release()
            raise ConfigError(f"--enable-latency-tracing: {exc}") from exc
    return output, cfg.output is None, claim


def set_up(bench: Bench, cfg: BenchConfig, notes: bool, progress: bool) -> tuple[list, object]:
    """Prepare and set up `bench` (its notes printed, its progress shown if asked); return its op logs and phase hook.
    Raises a UserError, a KvtierError or Interrupted; the caller cleans up in any case."""
    bench.prepare()
    if notes:
        for note in bench.notes:
            print(f"{PROG}: {note}", file=sys.stderr)
    with SetupProgress(enabled=progress) as setup_view:
        bench.set_up(on_progress=setup_view.update)
    return attach_op_logs(bench.store, cfg.io_trace_log, cfg.io_op_log)


def clean_up(bench: Bench, op_logs: list) -> None:
    detach_op_logs(bench.store, op_logs)
    bench.cleanup()


def run_single(cfg: BenchConfig, output: str, is_default: bool = False) -> int:
    """One run in this process, from set-up to exit code."""
    status_file = os.environ.get(STATUS_ENV)  # set when this process is one client of --num-clients
    bench = Bench(cfg)
    tracer = None
    op_logs: list = []
    try:
        # Outside the run's event loop (set-up, clean-up) SIGINT and SIGTERM raise Interrupted, so every path out
        # of here goes through the `finally` below and removes the run's files.
        with stop_signals_raise():
            try:
                op_logs, phase_hook = set_up(bench, cfg, notes=True, progress=cfg.progress)
                tracer = start_tracer(cfg, bench, output)
                with LiveView(cfg.duration, enabled=cfg.progress, status_file=status_file) as view:
                    doc = bench.run(on_sample=view.update, phase_hook=phase_hook)
                if tracer is not None:
                    doc["latency_tracing"] = stop_tracer(tracer)
                    tracer = None
            finally:
                if tracer is not None:  # the run broke off: never leave bpftrace attached
                    stop_tracer(tracer)
                clean_up(bench, op_logs)
    except UserError:
        raise  # a refusal found in set-up: the dispatcher says it in one line (exit 2)
    except KvtierError as exc:  # the store failed during set-up: nothing measured
        return bench_fail(str(exc), 1)
    except Interrupted as exc:  # during set-up: nothing measured yet
        return bench_fail(f"interrupted during set-up ({exc}); no results", exc.exit_code)
    return finish(doc, cfg, output, is_default, bench.bug)


def trace_dir(output: str) -> str:
    return os.path.splitext(output)[0] + "-trace"


def start_tracer(cfg: BenchConfig, bench: Bench, output: str):
    """bpftrace around the run, filtered to this process and the cache dir's device (--enable-latency-tracing)."""
    if not cfg.enable_latency_tracing:
        return None
    from tracing.session import TraceSession, TraceSessionError

    session = TraceSession(pid=os.getpid(), path=bench.run_dir, out_dir=trace_dir(output), job_name="kvtier-bench")
    try:
        session.start()
    except TraceSessionError as exc:
        raise ConfigError(f"--enable-latency-tracing: {exc}") from exc
    return session


def stop_tracer(session) -> dict:
    from tracing.session import TraceSessionError

    try:
        return session.stop()
    except TraceSessionError as exc:  # the run's own results still stand
        return {"error": str(exc)}
