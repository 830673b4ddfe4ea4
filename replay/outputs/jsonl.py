"""Rows of dicts as JSON Lines (one JSON object a line), the detail file of `kvtier replay --detail`: every field of
every request, for pandas (`pd.read_json(path, lines=True)`) or jq."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from ..common.json_files import dumps_json
from .paths import atomic_path

__all__ = ["write_jsonl"]


def write_jsonl(rows: Iterable[dict[str, Any]], path: str | os.PathLike) -> None:
    """Write the rows atomically (a temporary file in the same directory, then a rename), one object a line."""
    with atomic_path(path, suffix=".jsonl.tmp") as tmp, open(tmp, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(dumps_json(row) + "\n")  # a non-finite float as null: JSON readers refuse NaN
