"""CSV files, read by a spreadsheet or pandas directly (`pd.read_csv(path)`).

`kvtier bench`: the results document as one long-format CSV, `section,metric,value` (then pivot or filter by section).

`section` is the dotted path of the JSON object the figure sits in and `metric` its key, so
`doc[section...][metric] == value` (top-level scalars are in section `run`). Encoded histograms and the timeline are
left out (they are series, not figures); two derived figures are added per tier and operation, `gb` and `gbps`
(bytes / elapsed wall-clock time). Booleans are written `true`/`false`, a missing value (null) as an empty field.

`kvtier replay`: one row per request (REQUEST_COLUMNS, timestamps in ns since the run's start), and for a run in
rounds a second file beside it, `<name>.rounds.csv`, one row per round. A missing value is an empty field there too;
booleans are Python's `True`/`False`, as they always were in these files.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from kvconnector.units import GB

from ._common import OPS, elapsed_s, flatten, scalar_text
from .paths import atomic_path

__all__ = [
    "COLUMNS",
    "REQUEST_COLUMNS",
    "figures",
    "figures_frame",
    "rounds_csv_path",
    "write_csv",
    "write_requests_csv",
]

COLUMNS = ("section", "metric", "value")
_SKIP = ("histograms", "request_histograms", "timeline")
_FIRST = ("summary", "tiers", "block_device")


def figures(doc: dict) -> Iterator[tuple[str, str, Any]]:
    """(section, metric, value) for every figure of the document, summary first. A value is a number, string, boolean
    or None; a list or dict (a config list, say) is JSON text."""
    for key, value in doc.items():
        if key not in _SKIP and not isinstance(value, dict) and not _is_records(value):
            yield "run", key, scalar_text(value)
    keys = [k for k in _FIRST if k in doc] + [k for k in doc if k not in _FIRST]
    elapsed = elapsed_s(doc)
    for key in keys:
        value = doc[key]
        if key in _SKIP or not (isinstance(value, dict) or _is_records(value)):
            continue
        for path, leaf in flatten(value, key, _SKIP):
            section, _, metric = path.rpartition(".")
            yield section, metric, scalar_text(leaf)
        if key == "tiers":
            for name, t in value.items():
                for op in OPS:
                    if isinstance(t.get(op), dict) and "bytes" in t[op]:
                        nbytes = t[op]["bytes"]
                        yield f"tiers.{name}.{op}", "gb", nbytes / GB
                        yield f"tiers.{name}.{op}", "gbps", nbytes / GB / elapsed if elapsed else 0.0


def figures_frame(doc: dict):
    """`figures(doc)` as a pandas DataFrame, columns section, metric, value (dtype object: each value keeps its
    Python type). The CSV is this frame written out."""
    import pandas as pd  # imported when used: the run itself does not need it

    return pd.DataFrame(figures(doc), columns=list(COLUMNS))


def write_csv(doc: dict, path: str | os.PathLike) -> None:
    """Write the long-format CSV atomically (a temporary file in the same directory, then a rename)."""
    frame = figures_frame(doc)
    frame["value"] = frame["value"].map(_cell)
    with atomic_path(path, suffix=".csv.tmp") as tmp:
        frame.to_csv(tmp, index=False, lineterminator="\r\n")  # CRLF, as the csv module writes (RFC 4180)


REQUEST_COLUMNS = (
    "request_id",
    "session_id",
    "turn",
    "round",
    "success",
    "error_kind",
    "http_status",
    "prompt_tokens",
    "output_tokens",
    "max_tokens",
    "target_prompt_tokens",
    "ttft_ms",
    "tpot_ms",
    "e2el_ms",
    "send_lag_ms",
    "queue_ms",
    "scheduled_ns",
    "sent_ns",
    "first_token_ns",
    "last_chunk_ns",
)


def rounds_csv_path(path: str | os.PathLike) -> Path:
    """Where the per-round rows go: beside the per-request CSV, `<stem>.rounds.csv`."""
    p = Path(path)
    return p.with_name(p.stem + ".rounds.csv")


def write_requests_csv(
    rows: Iterable[dict[str, Any]], path: str | os.PathLike, rounds: list[dict[str, Any]] | None = None
) -> list[str]:
    """The per-request CSV (REQUEST_COLUMNS of each row, other keys ignored) and, when `rounds` has rows, the per-round
    CSV beside it (columns: the first round's keys). Each written atomically; returns the paths written."""
    with atomic_path(path, suffix=".csv.tmp") as tmp:
        with open(tmp, "w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            w.writerow(REQUEST_COLUMNS)
            w.writerows([row[c] for c in REQUEST_COLUMNS] for row in rows)
    written = [os.fspath(path)]
    if rounds:
        rpath = rounds_csv_path(path)
        with atomic_path(rpath, suffix=".csv.tmp") as tmp:
            with open(tmp, "w", newline="", encoding="utf-8") as fh:
                dw = csv.DictWriter(fh, fieldnames=list(rounds[0]))
                dw.writeheader()
                dw.writerows(rounds)
        written.append(str(rpath))
    return written


def _is_records(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(x, dict) for x in value)


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value
