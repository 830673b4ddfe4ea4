"""The results document as one long-format CSV, `section,metric,value`, that a spreadsheet or pandas reads directly
(`pd.read_csv(path)`, then pivot or filter by section).

`section` is the dotted path of the JSON object the figure sits in and `metric` its key, so
`doc[section...][metric] == value` (top-level scalars are in section `run`). Encoded histograms and the timeline are
left out (they are series, not figures); two derived figures are added per tier and operation, `gb` and `gbps`
(bytes / elapsed wall-clock time). Booleans are written `true`/`false`, a missing value (null) as an empty field.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from kvconnector.units import GB

from ._common import OPS, elapsed_s, flatten, scalar_text
from .paths import atomic_path

__all__ = ["COLUMNS", "figures", "figures_frame", "write_csv"]

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


def _is_records(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(x, dict) for x in value)


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value
