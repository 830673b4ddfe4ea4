"""What a run of `kvtier replay` leaves: its output paths claimed before it starts, its summary, the results JSON and
the detail files (JSONL, CSV, plots, HTML), the closing tables; partial results when a bug ends it."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable

from ..outputs import replay_tables, write_jsonl, write_replay_plots, write_requests_csv
from ..outputs.paths import OutputClaim, claim_outputs, write_results
from .client import fd_limit_message
from .config import PROG, ReplayConfig
from .driver import RunState
from .report import build_summary, request_rows


def summarize(cfg: ReplayConfig, state: RunState, meta: dict) -> dict:
    return build_summary(
        state,
        meta,
        percentiles=cfg.percentiles,
        slo=cfg.slo,
        block_size=cfg.block_size,
        kv_bytes_per_token=cfg.kv_bytes_per_token,
        kv_bytes_metric=cfg.kv_bytes_metric,
    )


def write_run_outputs(cfg: ReplayConfig, state: RunState, meta: dict) -> dict:
    return write_outputs(cfg, summarize(cfg, state, meta), lambda warmup=False: request_rows(state, warmup=warmup))


def write_outputs(cfg: ReplayConfig, summary: dict, rows: Callable[..., Iterable[dict]]) -> dict:
    """The results file and the detail files; `rows(warmup=...)` gives the per-request rows (the warm-up requests'
    too when asked: the JSONL has them, the CSV and the plots do not)."""
    summary["results_path"], moved = write_results(cfg.output, summary)
    if moved:
        print(f"{PROG}: {moved}; results written to {summary['results_path']} instead", file=sys.stderr)
    if cfg.detail:
        write_jsonl(rows(warmup=True), cfg.detail)
    if cfg.csv:
        write_requests_csv(rows(), cfg.csv, summary.get("rounds"))
    if cfg.plots:
        summary["plots"] = write_replay_plots(summary, rows(), cfg.plots)
    if cfg.html_output:
        from ..outputs.html import write_html  # plotly only when asked

        try:
            write_html(summary, cfg.html_output, summary["results_path"])
        except OSError as exc:  # the results JSON holds it all: `kvtier report` makes the page from it later
            print(f"{PROG}: --html-output {cfg.html_output}: not written ({exc.strerror or exc})", file=sys.stderr)
    return summary


def check_output_paths(cfg: ReplayConfig) -> OutputClaim:
    """Check and claim every output before the run (`claim_outputs`); the claim holds until released or exit."""
    return claim_outputs(
        {"--output": cfg.output, "--detail": cfg.detail, "--csv": cfg.csv, "--html-output": cfg.html_output},
        {"--plots": cfg.plots},
        inputs=cfg.source_inputs(),
    )


def report(cfg: ReplayConfig, summary: dict, code: int) -> int:
    """The closing lines and tables of a written run; the exit code (1 when the run failed as a whole)."""
    if code == 0 and summary["run_failed"]:
        print(f"{PROG}: run failed: {summary['run_failed']}", file=sys.stderr)
        code = 1
    if (summary.get("errors_by_kind") or {}).get("client_limit"):  # not the server's fault: say what to raise
        n = summary["errors_by_kind"]["client_limit"]
        print(f"{PROG}: {n} requests failed on the client's side: {fd_limit_message()}", file=sys.stderr)
    if not cfg.quiet:
        from ..outputs.terminal import console

        out = console()
        for t in replay_tables(summary):
            out.print(t)
        out.print(f"results: {summary['results_path']}" + (f", {cfg.detail}" if cfg.detail else ""))
    return code


def write_partial(cfg: ReplayConfig, state: RunState, meta: dict, bug: BaseException):
    """Write what the run measured before `bug` ended it, then raise it with a note saying where."""
    try:
        summary = write_run_outputs(cfg, state, meta)
    except Exception as exc:  # the results could not be made either: the first bug is the one to report
        bug.add_note(f"no results written ({type(exc).__name__}: {exc})")
    else:
        bug.add_note(f"partial results in {summary['results_path']}")
    raise bug
