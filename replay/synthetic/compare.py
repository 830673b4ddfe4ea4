"""`kvtier compare`: the key figures of several `kvtier bench` results side by side, each run against the first."""

from __future__ import annotations

import argparse
import sys

from kvconnector.errors import UserError

from ..common.cli import OneLineParser, command, fail
from ..common.json_files import dumps_json
from ..outputs._common import distinct_files, run_labels
from ..outputs.compare_rows import (
    bench_rows,
    format_ratio,
    format_value,
    metric_label,
    ratio,
    ratio_verdict,
    value_at,
)
from ..outputs.paths import atomic_path, claim_outputs
from ..outputs.results_file import ResultsFileError, load_results_file
from ..outputs.terminal import console as terminal_console

EXAMPLES = """\
examples:
  kvtier compare results/nvme.json results/sata.json
  kvtier compare a.json b.json c.json --labels baseline,fp8,no-cpu-tier
  kvtier compare before.json after.json --json compare.json

Ratios are each run's value divided by the first run's: 2.00x is twice the first run's figure. Coloured green when
it is better (more throughput, less latency), red when worse, for differences over 5%. Values are shown as
`kvtier report` shows them (4 significant digits, shares as percentages); in --json a unit "%" marks a share, kept
as a fraction (0.25 is 25%).

exit status: 0 done; 2 bad arguments, a file that is not a kvtier bench result, or a --json path that cannot be
written (checked before anything is read; one line on stderr, nothing written); 130/143 on SIGINT/SIGTERM.
"""


class CompareError(UserError):
    """A user error: one line, exit status 2."""


def build_table(docs: list[dict], labels: list[str], paths: list[str]) -> dict:
    """The comparison as data: runs, and per metric the values and each run's ratio to the first (None for the
    first run, for text, and where the first run's value is 0 or missing)."""
    table_rows = []
    for row in bench_rows(docs):
        values = [value_at(d, row.get) for d in docs]
        table_rows.append(
            {
                "metric": row.metric,
                "unit": row.unit,
                "better": row.better,
                "values": values,
                "ratios": [None] + [ratio(v, values[0]) for v in values[1:]],
            }
        )
    return {"runs": [{"label": lab, "path": p} for lab, p in zip(labels, paths)], "rows": table_rows}


def _ratio_text(r: float | None, better: str | None):
    from rich.text import Text

    verdict = ratio_verdict(r, better)
    return Text(format_ratio(r), style={"good": "green", "bad": "red"}.get(verdict or "", ""))


def render(table: dict):
    from rich.table import Table

    runs = table["runs"]
    t = Table(
        title=f"kvtier compare (ratio: each run / {runs[0]['label']})",
        caption="block device figures count the whole device, other processes' I/O included",
    )
    t.add_column("metric", no_wrap=True)
    for i, run in enumerate(runs):
        t.add_column(run["label"], justify="right", overflow="fold")
        if i:
            t.add_column("ratio", justify="right", no_wrap=True)
    for row in table["rows"]:
        cells = [metric_label(row["metric"], row["unit"])]
        for i, v in enumerate(row["values"]):
            cells.append(format_value(v, row["unit"]))
            if i:
                cells.append(_ratio_text(row["ratios"][i], row["better"]))
        t.add_row(*cells)
    return t


def load_result(path: str) -> dict:
    """A `kvtier bench` results file, validated (replay/outputs/results_file.py), or CompareError."""
    try:
        return load_results_file(path)
    except ResultsFileError as exc:
        raise CompareError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="kvtier compare",
        description="Side-by-side table of kvtier bench result JSON files, with each run's ratio to the first.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "results", nargs="+", metavar="RESULT.json", help="results of `kvtier bench` (the first is the base)"
    )
    p.add_argument("--labels", help="comma-separated column names, one per file (default: the file names)")
    p.add_argument("--json", metavar="OUT", dest="json_out", help="also save the table (values and ratios) as JSON")
    return p


@command("compare")
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    claim = claim_outputs({"--json": args.json_out}, inputs={p: p for p in args.results})
    with claim:
        return _compare(args)


def _compare(args: argparse.Namespace) -> int:
    try:
        docs = [load_result(p) for p in args.results]
        try:
            distinct_files(args.results)
            labels = run_labels(args.labels, args.results)
        except ValueError as exc:
            raise CompareError(str(exc)) from None
        table = build_table(docs, labels, args.results)
        if args.json_out:
            try:
                with atomic_path(args.json_out, suffix=".json.tmp") as tmp, open(tmp, "w", encoding="utf-8") as fh:
                    fh.write(dumps_json(table, indent=2) + "\n")
            except OSError as exc:
                raise CompareError(f"--json {args.json_out}: {exc.strerror or exc}") from None
    except CompareError as exc:
        return fail("kvtier compare", str(exc))
    terminal_console().print(render(table))
    if args.json_out:
        print(f"table: {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
