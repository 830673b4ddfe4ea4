"""The end of a `kvtier bench` run, single process or --num-clients: write every output, print the summary, and turn
the run's status into the exit code. Shared by synthetic/cli.py and synthetic/multiclient.py."""

from __future__ import annotations

import importlib
import signal
import sys

from ..common.cli import exit_code, fail
from ..outputs.paths import write_results
from .config import BenchConfig
from .view import print_summary

PROG = "kvtier bench"


def bench_fail(msg: str, code: int = 2) -> int:
    return fail(PROG, msg, code)


# Outputs made from the results document at the end: (config key, flag, module under outputs/, function).
EXTRA_OUTPUTS = (
    ("xlsx_output", "--xlsx-output", "xlsx", "write_xlsx"),
    ("csv_output", "--csv-output", "csv_out", "write_csv"),
    ("plots", "--plots", "plots", "write_plots"),
    ("html_output", "--html-output", "html", "write_html"),
)


def finish(doc: dict, cfg: BenchConfig, output: str, is_default: bool = False, bug: BaseException | None = None) -> int:
    """Write every requested output, print the summary, and turn the run's status into an exit code. The results
    JSON is written first and, if its path fails now, to the default location instead: finished work is not lost.
    `bug`: what ended the run if it was a bug; raised once everything is written, with a note saying where (the
    dispatcher, replay/cli.py, logs its traceback and exits 1)."""
    try:
        output, moved = write_results(output, doc, is_default=is_default)
    except OSError as exc:
        print_summary(doc, None)
        return bench_fail(f"{exc}; the results could not be saved (the summary above is all there is)", 1)
    if moved:
        print(f"kvtier bench: {moved}; results written to {output} instead", file=sys.stderr)
    extra, missing = [], []
    for key, flag, module, func in EXTRA_OUTPUTS:
        path = getattr(cfg, key)
        if not path:
            continue
        write = getattr(importlib.import_module(f"..outputs.{module}", __package__), func)  # lazy: matplotlib, openpyxl
        try:
            # the HTML page names the results file it shows
            written = write(doc, path, output) if key == "html_output" else write(doc, path)
        except OSError as exc:  # the JSON holds everything: the others are still written, then exit 1 (below)
            missing.append(f"{flag} {path}: not written ({exc.strerror or exc})")
            print(f"kvtier bench: {missing[-1]}", file=sys.stderr)
            continue
        extra.extend(written if isinstance(written, list) else [path])
    print_summary(doc, output, extra)
    if bug is not None:
        bug.add_note(f"partial results in {output}")
        raise bug
    if doc["status"] == "failed":
        err = doc["error"] or "unknown error"
        hint = " (filesystem full)" if "space" in err else ""
        return bench_fail(f"run failed{hint}: {err}; partial results in {output}", 1)
    if doc["status"] == "interrupted":
        name = doc.get("stop_signal") or "SIGINT"
        print(f"kvtier bench: interrupted ({name}); partial results in {output}", file=sys.stderr)
        return exit_code(signal.Signals[name])
    if missing:  # an output asked for and not made is never a success
        return bench_fail(
            f"{'; '.join(missing)}; the results are in {output} (kvtier report makes the page from them)", 1
        )
    return 0
