"""`kvtier report`: the HTML page of one or more result files."""

from __future__ import annotations

import argparse
import sys

from replay.common.cli import OneLineParser, fail

from ...common.cli import command
from .._common import distinct_files, run_labels
from ..paths import claim_outputs, os_reason
from .kinds import KIND_TITLES, ReportError, load_run
from .write import write_report

PROG = "kvtier report"

EPILOG = (
    """\
examples:
  # one run: summary table, interactive plots (CDF of latency per tier, throughput, occupancy), configuration
  kvtier report run.json -o run.html
  # two runs overlaid, with each figure's ratio to the first run
  kvtier report nvme.json nfs.json --labels nvme,nfs -o nvme-vs-nfs.html
  # a replay, a plan (its capacity sweep with --trace), a sweep's heat maps, a storage trace
  kvtier report replay.json -o replay.html
  kvtier report sweep.json -o sweep.html
  kvtier report trace.txt -o trace.html
  # a run of the MLPerf KV cache harness (kvtier mlperf run or mlpstorage): its run directory or its run summary;
  # the headline per Option, Options x trials x ranks, the rules' verdicts by rule ID (as kvtier check gives them)
  kvtier report /results/kv/closed/kv_cache/run/20260101_120000 -o mlperf.html

Kinds: """
    + "; ".join(KIND_TITLES.values())
    + """. Several files must be of one kind (kvtier bench, --trials and
merge results go together). The page is one file: plotly's JavaScript is inside it, nothing is fetched when it is
opened. A run that was cut short or failed its checks gets a banner at the top.

exit status: 0 written; 2 a bad argument or a file that is not a result the report knows (one line).
"""
)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog=PROG,
        description="One self-contained HTML report (tables, interactive plots) of kvtier result files.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "results",
        nargs="+",
        metavar="RESULT",
        help="result JSON files of one kind (or storage traces), or one MLPerf harness run directory or run summary",
    )
    p.add_argument("-o", "--output", required=True, help="the HTML file to write")
    p.add_argument("--labels", help="comma-separated run names, one per file (default: the file names)")
    p.add_argument("--title", help="the page's title (default: the kind and the labels)")
    return p


@command("report")
def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        try:
            distinct_files(a.results)
            labels = run_labels(a.labels, a.results)
        except ValueError as exc:
            raise ReportError(str(exc)) from None
        if a.title is not None and not a.title.strip():
            raise ReportError("--title is empty; leave it out for the kind and the labels")
        with claim_outputs({"--output": a.output}, inputs={p: p for p in a.results}):
            runs = [load_run(p) for p in a.results]
            for run, label in zip(runs, labels):
                run.label = label
            write_report(a.output, runs, a.title)
    except OSError as exc:
        return fail(PROG, f"cannot write {a.output}: {os_reason(exc)}", 1)
    print(f"report: {a.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
