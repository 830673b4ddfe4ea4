"""BurstGPT traces (HPMLL/BurstGPT CSV files) as timed conversations.

Columns are read by header name, so both layouts work:
- original: ``Timestamp, Model, Request tokens, Response tokens, Total tokens, Log Type``
- newer:    the same plus ``Session ID`` and ``Elapsed time``.

Each row is one request. ``Turn.arrival_s`` is the row's ``Timestamp`` (seconds from the trace start). Rows sharing a
``Session ID`` become the turns of one `Conversation`, in timestamp order; without that column every row is its own
single-turn conversation. Failed requests (``Response tokens`` = 0) are skipped and counted as ``failed_request``.

``Request tokens`` is the whole prompt the user sent. Within a session it already contains the earlier turns, so the
tokens a turn *adds* are its request tokens minus the previous turn's request + response tokens; when that difference
is not positive (the trace's client trimmed its context) the turn is taken as a fresh prompt of its full size, counted
as ``context_reset`` in the report's ``skipped`` map (nothing is dropped; the key records the interpretation).

Numbers must be finite and non-negative, token counts whole: anything else is a bad row, reported as file:line. A row
whose request + response exceeds ``max_context_tokens`` (what the model can hold) is cut to it and counted in the
report's ``truncated`` map, so one absurd row cannot make one absurd request.
"""

from __future__ import annotations

import csv
import glob as globmod
import os
from pathlib import Path

from replay.common.json_files import refuse_malformed, shown
from replay.sources.base import Conversation, LoadReport, Turn, WorkloadError, parse_count, parse_number, read_lines

__all__ = ["load_burstgpt", "resolve_trace_paths"]

_REQUIRED = ("Timestamp", "Request tokens", "Response tokens")


def resolve_trace_paths(path_or_dir_or_glob: str | os.PathLike) -> list[Path]:
    """A file, a directory (its *.csv files) or a glob pattern -> sorted list of CSV files, or WorkloadError."""
    text = str(path_or_dir_or_glob)
    p = Path(text)
    if p.is_file():
        return [p]
    if p.is_dir():
        files = sorted(p.glob("*.csv"))
        if not files:
            raise WorkloadError(f"{p}: directory holds no *.csv BurstGPT file")
        return files
    if any(ch in text for ch in "*?["):
        files = sorted(Path(f) for f in globmod.glob(text) if Path(f).is_file())
        if not files:
            raise WorkloadError(f"{text}: glob matches no file")
        return files
    raise WorkloadError(f"{p}: BurstGPT trace not found")


def load_burstgpt(
    path_or_dir_or_glob: str | os.PathLike,
    max_requests: int | None = None,
    *,
    models: tuple[str, ...] | None = None,
    log_types: tuple[str, ...] | None = None,
    max_context_tokens: int | None = None,
) -> tuple[list[Conversation], LoadReport]:
    """Read one or more BurstGPT CSV files into conversations ordered by the arrival of their first turn.

    max_requests: keep only the first N usable rows (in file order, across files).
    models / log_types: keep only rows whose ``Model`` / ``Log Type`` is in the tuple (others counted as filtered).
    Several files are concatenated as they are: their timestamps are taken as given (the public files share one clock).
    max_context_tokens: rows whose request + response tokens exceed it are cut to it (counted as truncated).
    """
    files = resolve_trace_paths(path_or_dir_or_glob)
    report = LoadReport(source="burstgpt", tokenizer="trace token counts")
    rows: list[tuple[float, str | None, int, int, int]] = []  # (timestamp_s, session, request, response, order)
    order = 0
    for path in files:
        for ts, session, req, resp in _read_file(path, report, models, log_types):
            if max_requests is not None and len(rows) >= max_requests:
                break
            if max_context_tokens is not None and req + resp > max_context_tokens:
                report.truncate("over_max_context_tokens")
                req = min(req, max_context_tokens)
                resp = min(resp, max_context_tokens - req)
            rows.append((ts, session, req, resp, order))
            order += 1
    if not rows:
        raise WorkloadError(
            f"{files[0] if len(files) == 1 else str(path_or_dir_or_glob)}: no usable BurstGPT row "
            f"(skipped: {report.skipped or 'none'})"
        )

    sessions: dict[str, list[tuple[float, int, int, int]]] = {}
    singles: list[tuple[float, int, int, int]] = []
    for ts, session, req, resp, o in rows:
        if session is None:
            singles.append((ts, req, resp, o))
        else:
            sessions.setdefault(session, []).append((ts, req, resp, o))

    conversations: list[tuple[float, int, Conversation]] = []
    for ts, req, resp, o in singles:
        conv = Conversation(conversation_id=f"row-{o}", turns=(Turn(req, resp, arrival_s=ts),))
        conversations.append((ts, o, conv))
    for sid, items in sessions.items():
        items.sort()
        turns = []
        prev_context = 0
        for i, (ts, req, resp, _o) in enumerate(items):
            new_tokens = req - prev_context if i else req
            if i and new_tokens <= 0:
                report.skip("context_reset")
                new_tokens = req
            turns.append(Turn(new_tokens, resp, arrival_s=ts))
            prev_context = req + resp
        conversations.append(
            (items[0][0], items[0][3], Conversation(conversation_id=f"session-{sid}", turns=tuple(turns)))
        )
    conversations.sort(key=lambda t: (t[0], t[1]))
    out = [c for _, _, c in conversations]
    report.conversations = len(out)
    report.turns = len(rows)
    return out, report


def _read_file(path: Path, report: LoadReport, models, log_types):
    lines = read_lines(path, "BurstGPT CSV")
    reader = csv.reader(lines)
    # csv.Error (a field over csv's 128 KiB limit, which an unclosed quote soon makes) at the line the reader is at
    with refuse_malformed(lambda: f"{path}:{max(1, reader.line_num)}", WorkloadError):
        yield from _rows(path, reader, report, models, log_types)


def _rows(path: Path, reader, report: LoadReport, models, log_types):
    header = next(reader, None)
    if header is None:
        raise WorkloadError(f"{path}: empty file (expected a BurstGPT CSV header)")
    names = [name.strip() for name in header]
    twice = sorted({n for n in names if n and names.count(n) > 1})
    if twice:  # which of the two would be read is a guess: the file is refused instead
        raise WorkloadError(f"{path}:1: column {shown(twice[0])} appears {names.count(twice[0])} times in the header")
    col = {name: i for i, name in enumerate(names)}
    missing = [c for c in _REQUIRED if c not in col]
    if missing:
        raise WorkloadError(
            f"{path}:1: not a BurstGPT header, missing column(s) {', '.join(missing)} "
            f"(found: {shown(', '.join(col)) if col else 'nothing'})"
        )
    i_ts, i_req, i_resp = col["Timestamp"], col["Request tokens"], col["Response tokens"]
    i_sess, i_model, i_log = col.get("Session ID"), col.get("Model"), col.get("Log Type")
    width = len(header)
    for row in reader:
        line = reader.line_num
        if not row or all(not f.strip() for f in row):
            continue
        if len(row) != width:
            raise WorkloadError(f"{path}:{line}: expected {width} fields, found {len(row)}")
        where = f"{path}:{line}"
        ts = parse_number(row[i_ts], where, "Timestamp")
        req = parse_count(row[i_req], where, "Request tokens")
        resp = parse_count(row[i_resp], where, "Response tokens")
        if models is not None and i_model is not None and row[i_model].strip() not in models:
            report.skip("filtered_model")
            continue
        if log_types is not None and i_log is not None and row[i_log].strip() not in log_types:
            report.skip("filtered_log_type")
            continue
        if resp == 0:
            report.skip("failed_request")
            continue
        if req == 0:
            report.skip("empty_request")
            continue
        session = None
        if i_sess is not None:
            s = row[i_sess].strip()
            session = s if s and s.lower() not in ("nan", "none", "-1") else None
        yield ts, session, req, resp
