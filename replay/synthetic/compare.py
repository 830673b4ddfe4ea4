"""`kvtier compare`: the key figures of several `kvtier bench` results side by side, each run against the first."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from kvconnector.errors import UserError
from kvconnector.units import GB

from ..common.cli import OneLineParser, fail
from ..common.json_files import dumps_json
from ..outputs._common import default_labels, sla_verdict_text
from ..outputs.paths import atomic_path, claim_outputs
from ..outputs.results_file import ResultsFileError, load_results_file

EXAMPLES = """\
examples:
  kvtier compare results/nvme.json results/sata.json
  kvtier compare a.json b.json c.json --labels baseline,fp8,no-cpu-tier
  kvtier compare before.json after.json --json compare.json

Ratios are each run's value divided by the first run's: 2.00x is twice the first run's figure. Coloured green when
it is better (more throughput, less latency), red when worse, for differences over 5%.

exit status: 0 done; 2 bad arguments, a file that is not a kvtier bench result, or a --json path that cannot be
written (checked before anything is read; one line on stderr, nothing written); 130/143 on SIGINT/SIGTERM.
"""


class CompareError(UserError):
    """A user error: one line, exit status 2."""


# A row: (metric, unit, extractor, better) with better = "higher", "lower" or None (no direction, e.g. elapsed).
Row = tuple[str, str, Callable[[dict], Any], str | None]


def _get(*path: str) -> Callable[[dict], Any]:
    def get(doc: dict) -> Any:
        v: Any = doc
        for p in path:
            if not isinstance(v, dict) or p not in v:
                return None
            v = v[p]
        return v

    return get


def _verdict(cls: str) -> Callable[[dict], Any]:
    def get(doc: dict) -> Any:
        c = _get("summary", "qos_metrics", cls)(doc)
        return sla_verdict_text(c) if isinstance(c, dict) else None

    return get


def _tier_gbps(name: str, op: str) -> Callable[[dict], Any]:
    def get(doc: dict) -> Any:
        o = ((doc.get("tiers") or {}).get(name) or {}).get(op)
        elapsed = (doc.get("summary") or {}).get("elapsed_time")
        if not o or "bytes" not in o or not elapsed:
            return None
        return o["bytes"] / GB / elapsed

    return get


def rows_for(docs: list[dict]) -> list[Row]:
    rows: list[Row] = [
        ("status", "", _get("status"), None),
        ("elapsed", "s", _get("summary", "elapsed_time"), None),
        ("requests completed", "", _get("summary", "total_requests"), None),  # depends on the duration
        ("requests/s", "1/s", _get("summary", "requests_per_second"), "higher"),
        ("tokens/s", "tokens/s", _get("summary", "avg_throughput_tokens_per_sec"), "higher"),
        ("tokens / storage I/O s", "tokens/s", _get("summary", "storage_throughput_tokens_per_sec"), "higher"),
        ("storage tier tokens/s", "tokens/s", _get("summary", "storage_tier_tokens_per_sec"), "higher"),
        ("end-to-end p50", "ms", _get("summary", "end_to_end_latency_ms", "p50"), "lower"),
        ("end-to-end p95", "ms", _get("summary", "end_to_end_latency_ms", "p95"), "lower"),
        ("end-to-end p99", "ms", _get("summary", "end_to_end_latency_ms", "p99"), "lower"),
        ("storage I/O p95", "ms", _get("summary", "storage_io_latency_ms", "p95"), "lower"),
    ]
    tiers: list[str] = []
    for d in docs:
        tiers += [t for t in d.get("tiers") or {} if t not in tiers]
    for t in tiers:
        for op in ("read", "write"):
            rows.append((f"{t} {op} GB/s", "GB/s", _tier_gbps(t, op), "higher"))
            rows.append((f"{t} {op} p99", "ms", _get("tiers", t, op, "latency_ms", "p99"), "lower"))
    rows += [
        ("cache hit rate", "", _get("summary", "cache_stats", "cache_hit_rate"), "higher"),
        ("block device read GB/s", "GB/s", _get("block_device", "read_gbps"), "higher"),
        ("block device write GB/s", "GB/s", _get("block_device", "write_gbps"), "higher"),
    ]
    if any(_get("summary", "prefix_cache_stats")(d) for d in docs):
        rows.append(("prefix cache hit rate", "", _get("summary", "prefix_cache_stats", "hit_rate"), "higher"))
    classes: list[str] = []
    for d in docs:
        classes += [c for c in (_get("summary", "qos_metrics")(d) or {}) if c not in classes]
    for c in classes:
        rows.append(
            (f"QoS {c} service p99", "ms", _get("summary", "qos_metrics", c, "service_latency_ms", "p99"), "lower")
        )
        rows.append((f"QoS {c} SLA", "", _verdict(c), None))
    return rows


def ratio(value: Any, base: Any) -> float | None:
    if isinstance(value, bool) or isinstance(base, bool):
        return None
    if not isinstance(value, (int, float)) or not isinstance(base, (int, float)) or base == 0:
        return None
    return value / base


def build_table(docs: list[dict], labels: list[str], paths: list[str]) -> dict:
    """The comparison as data: runs, and per metric the values and each run's ratio to the first (None for the
    first run, for text, and where the first run's value is 0 or missing)."""
    table_rows = []
    for metric, unit, get, better in rows_for(docs):
        values = [get(d) for d in docs]
        table_rows.append(
            {
                "metric": metric,
                "unit": unit,
                "better": better,
                "values": values,
                "ratios": [None] + [ratio(v, values[0]) for v in values[1:]],
            }
        )
    return {"runs": [{"label": lab, "path": p} for lab, p in zip(labels, paths)], "rows": table_rows}


def _fmt(value: Any, unit: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if unit == "" and 0 <= value <= 1:
            return f"{value:.1%}"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:,.2f}" if abs(value) >= 1 else f"{value:.3f}"
    return str(value)


def _ratio_text(r: float | None, better: str | None) -> str:
    if r is None:
        return "-"
    text = f"{r:.2f}x"
    if better and abs(r - 1) > 0.05:
        good = (r > 1) == (better == "higher")
        return f"[{'green' if good else 'red'}]{text}[/]"
    return text


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
        unit = row["unit"] if row["unit"] not in ("", "1/s", "tokens/s", "GB/s") else ""
        cells = [f"{row['metric']} ({unit})" if unit else row["metric"]]
        for i, v in enumerate(row["values"]):
            cells.append(_fmt(v, row["unit"]))
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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    claim = claim_outputs({"--json": args.json_out}, inputs={p: p for p in args.results})
    with claim:
        return _compare(args)


def _compare(args: argparse.Namespace) -> int:
    try:
        docs = [load_result(p) for p in args.results]
        if args.labels is not None:
            labels = [s.strip() for s in args.labels.split(",")]
            if len(labels) != len(args.results):
                raise CompareError(f"--labels has {len(labels)} names for {len(args.results)} files")
            if not all(labels):  # 'a,' or ',b': a column with no name
                raise CompareError(f"--labels {args.labels!r}: name {labels.index('') + 1} is empty")
            twice = sorted({x for x in labels if labels.count(x) > 1})
            if twice:  # two columns of one name: the table and its JSON could not tell them apart
                raise CompareError(f"--labels {args.labels!r}: {twice[0]!r} names two columns")
        else:
            labels = default_labels(args.results)
        table = build_table(docs, labels, args.results)
        if args.json_out:
            try:
                with atomic_path(args.json_out, suffix=".json.tmp") as tmp, open(tmp, "w", encoding="utf-8") as fh:
                    fh.write(dumps_json(table, indent=2) + "\n")
            except OSError as exc:
                raise CompareError(f"--json {args.json_out}: {exc.strerror or exc}") from None
    except CompareError as exc:
        return fail("kvtier compare", str(exc))
    from rich.console import Console

    Console().print(render(table))
    if args.json_out:
        print(f"table: {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
