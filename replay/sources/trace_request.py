"""One request of a block-hash trace and the row checks every reader shares (a module of its own, so the format
readers in their own modules and replay/sources/block_traces.py import it without importing each other)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass

from replay.common.json_files import loads_json, refuse_malformed, shown
from replay.sources.base import WorkloadError, parse_count, read_lines

__all__ = ["TraceRequest", "jsonl_rows", "request_of", "value_text"]


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a block-hash trace: when it arrives, its lengths, and the ids of its prompt's blocks."""

    arrival_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...]
    # A call of a session (an agentic trace's conversation or sub-agent): what it waits for when replayed closed
    # loop (--trace-timing think), as indexes into the trace's requests, all earlier than its own. The defaults: a
    # request alone, at its arrival time.
    session: int = -1  # its session; -1: none
    after: int = -1  # the request whose end it follows; -1: the session's start (the run's)
    joins: tuple[int, ...] = ()  # the last calls of the sub-agents it waits for
    delay_s: float = 0.0  # the pause after `after` ended: its think time (or the time to a sub-agent's spawn)
    api_s: float | None = None  # how long the call took when recorded
    # The prompt's own text, for a trace that carries it (AIPerf's Mooncake rows with text_input or messages); None:
    # the prompt is made from the hash ids to input_tokens (input_tokens then estimated from the text).
    text: str | None = None


def request_of(where: str, ts_s: float, row: dict, inp: str, out: str, block: int) -> TraceRequest:
    input_tokens = parse_count(value_text(row[inp]), where, inp)
    output_tokens = parse_count(value_text(row[out]), where, out)
    ids = _hash_ids(row.get("hash_ids", []), where)
    if len(ids) > math.ceil(input_tokens / block):
        raise WorkloadError(
            f"{where}: {len(ids)} hash_ids for {inp} {input_tokens}: at {block} tokens a block it has "
            f"{math.ceil(input_tokens / block)} blocks"
        )
    return TraceRequest(ts_s, input_tokens, output_tokens, ids)


def value_text(value) -> str:
    """A JSON value as the text the shared number checks read (a bool is not a number, whatever Python says)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return repr(value)
    return str(value)


def _hash_ids(value, where: str) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise WorkloadError(f"{where}: hash_ids must be a list of integers, found {type(value).__name__}")
    for v in value:
        if isinstance(v, bool) or not isinstance(v, int):
            raise WorkloadError(f"{where}: hash_ids holds {shown(v)}, not an integer")
    return tuple(value)


def jsonl_rows(path: str | os.PathLike, fmt: str, fields: tuple[str, ...]) -> Iterator[tuple[str, dict]]:
    """The rows of a JSON-lines trace as (file:line, object), each checked to be an object with `fields`."""
    for number, line in enumerate(read_lines(path, f"{fmt} trace (JSONL)"), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        with refuse_malformed(where, WorkloadError):
            try:
                row = loads_json(line)
            except json.JSONDecodeError as exc:
                raise WorkloadError(f"{where}: not a JSON object ({exc.msg}); is this a {fmt} trace?") from None
        if not isinstance(row, dict):
            raise WorkloadError(f"{where}: expected a JSON object, found {type(row).__name__}")
        missing = [f for f in fields if f not in row]
        if missing:
            raise WorkloadError(f"{where}: missing {', '.join(missing)} (a {fmt} row has {', '.join(fields)})")
        yield where, row
