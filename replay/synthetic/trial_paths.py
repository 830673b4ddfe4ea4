"""Where each trial of `kvtier bench --trials N` writes: its results and every file output it was asked for, with a
`-trialI` suffix. Known before the first trial runs, so all of them are claimed up front (lifecycle.check_output_paths).
"""

from __future__ import annotations

import os

from .config import BenchConfig


def trial_path(output: str, i: int) -> str:
    stem, ext = os.path.splitext(output)
    return f"{stem}-trial{i}{ext or '.json'}"


def suffixed(path: str | None, i: int) -> str | None:
    if not path:
        return None
    stem, ext = os.path.splitext(path.rstrip(os.sep))
    return f"{stem}-trial{i}{ext}"


def trial_outputs(cfg: BenchConfig, output: str, trials: int) -> dict[str, str | None]:
    """The files the trials of `cfg` write, {what: path}: each trial's results and the outputs it was asked for."""
    files: dict[str, str | None] = {}
    for i in range(1, trials + 1):
        files[f"trial {i} results"] = trial_path(output, i)
        for key, flag in KEYED_OUTPUTS:
            files[f"trial {i} {flag}"] = suffixed(getattr(cfg, key), i)
    return files


# The per-trial file outputs: (config key, flag).
KEYED_OUTPUTS = (
    ("xlsx_output", "--xlsx-output"),
    ("csv_output", "--csv-output"),
    ("io_trace_log", "--io-trace-log"),
    ("io_op_log", "--io-op-log"),
)
