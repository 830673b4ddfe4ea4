"""`kvtier report`: the HTML page of result files (replay/outputs/html/), or of a run of the MLPerf KV cache harness
(a run directory, or its `kvcache_run_summary_<datetime>.json`).

One entry for both, here above the two, as `kvtier check` (replay/check.py): the page is a sink, which knows nothing
of the MLPerf harness package (tests/test_layers.py), so the run is read by that package (replay/mlperf/
report_doc.py: summary, rank files, the rules' verdicts) into a plain document, handed to the page as a result of
kind `kvtier mlperf run`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from .common.cli import command, fail
from .common.json_files import loads_json, open_regular
from .outputs.html.cli import PROG, build_parser
from .outputs.html.cli import main as report_files

SUMMARY_NAME = "kvcache_run_summary_"


def _is_summary_file(path: str) -> bool:
    """A run summary, by its name or, for one renamed, by its keys (read only when it is a small regular file)."""
    if Path(path).name.startswith(SUMMARY_NAME):
        return True
    try:
        if not os.path.isfile(path) or os.path.getsize(path) > 1 << 20:
            return False
        with open_regular(path) as fh:
            doc = loads_json(fh.read().decode("utf-8-sig"))
    except (OSError, ValueError, UnicodeDecodeError):
        return False  # the page's own reading says what is wrong with it
    from .mlperf.report_doc import is_run_summary

    return is_run_summary(doc)


@command("report")
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = build_parser().parse_args(argv)
    runs = [p for p in a.results if os.path.isdir(p) or _is_summary_file(p)]
    if not runs:
        return report_files(argv)
    return report_run(a, runs)


def report_run(a, runs: list[str]) -> int:
    from kvconnector.errors import UserError

    from .mlperf.report_doc import report_doc
    from .outputs._common import default_labels
    from .outputs.html.kinds import run_from_doc
    from .outputs.html.write import write_report
    from .outputs.paths import claim_outputs, os_reason

    if len(a.results) != 1:
        raise UserError(f"{runs[0]}: a harness run is reported alone (give one RUN_DIR or its run summary)")
    path = a.results[0]
    if a.labels is not None and (not a.labels.strip() or "," in a.labels):
        raise UserError(f"--labels {a.labels!r}: one name for the one run")
    if a.title is not None and not a.title.strip():
        raise UserError("--title is empty; leave it out for the kind and the label")
    try:
        with claim_outputs({"--output": a.output}, inputs={} if os.path.isdir(path) else {path: path}):
            doc = report_doc(path)
            label = a.labels.strip() if a.labels else default_labels([path.rstrip("/") or path])[0]
            write_report(a.output, [run_from_doc(doc, path, label)], a.title)
    except OSError as exc:
        return fail(PROG, f"cannot write {a.output}: {os_reason(exc)}", 1)
    print(f"report: {a.output}")
    return 0


if __name__ == "__main__":  # as `kvtier ...`: logging and signals set up by the dispatcher (replay/cli.py)
    from replay.cli import main as kvtier

    sys.exit(kvtier(["report", *sys.argv[1:]]))
