"""AIPerf's Mooncake format (``--custom-dataset-type mooncake_trace``; ai-dynamo/aiperf,
src/aiperf/dataset/loader/models.py, ``MooncakeTrace``; Apache-2.0): what AIPerf's users write, a superset of the
FAST'25 files' four fields. One JSON object a line:

- the prompt, exactly one of: ``input_length`` (tokens; the prompt is made to it, from ``hash_ids`` when the row has
  them), ``text_input`` (the prompt's text) or ``messages`` (OpenAI chat messages: each a ``role`` and a text
  ``content``; their texts are sent, in order, as one prompt: roles and tools are not replayed). ``hash_ids`` only
  with ``input_length``, as AIPerf requires; a text row's tokens are estimated at 4 characters a token.
  ``payload`` rows (a request body AIPerf sends verbatim) are refused: kvtier sends prompts, not bodies.
- ``output_length`` (tokens), optional: without it the answer's length is not in the trace (``--max-tokens N``
  sets it; else a request asks for 1 token).
- times, optional, in milliseconds: ``timestamp`` (from the trace's start) and ``delay`` (the pause before the row,
  after the previous row of its session ended). A row without a timestamp is placed at its session's previous row's
  time plus its delay (a session's first row: at its delay from the start), the times an infinitely fast server
  would give; the rows are then replayed in that order (equal times keep the file's order).
- ``session_id`` (text), optional: rows with the same id are one session, sent one after another in file order
  under ``--trace-timing think`` (each its delay after the previous row ended; a timed row without a delay, its
  distance in time from the previous row); a row without one stands alone at its time, as AIPerf gives each such
  row a session of its own.

Blocks are 512 tokens, the FAST'25 files' and AIPerf's default. A trace none of whose rows carries ``hash_ids``
claims no block reuse: its prompts share nothing, and `kvtier plan --trace` says it models none.

Refused, one line naming file:line: a row with no prompt or two, ``hash_ids`` without ``input_length``, a time that
is not a number >= 0, a ``session_id`` that is not text, a message without a role or with a content that is not text,
and a timestamp before the previous row of its session.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from dataclasses import replace

from replay.common.json_files import shown
from replay.sources.base import WorkloadError, parse_number

from .trace_request import TraceRequest, jsonl_rows, request_of, value_text

__all__ = ["CHARS_PER_TOKEN", "read_aiperf_mooncake"]

# A text row's tokens, estimated: the estimate kvtier uses wherever no tokenizer counts (replay/openai/workload.py).
CHARS_PER_TOKEN = 4
_PROMPTS = ("input_length", "text_input", "messages", "payload")
# Rows read between two questions to `check` (the whole file is read before the first row is yielded: rows are
# ordered by their times, which delays make known only once their session is read).
_CHECK_EVERY = 2048


def read_aiperf_mooncake(path: str | os.PathLike, block: int, check: Callable[[], None]) -> Iterator[TraceRequest]:
    """Every row on its time, in time order, each with its session's links (TraceRequest.session, after, delay_s)
    as indexes into what is yielded."""
    rows: list[TraceRequest] = []
    sessions: dict[str, int] = {}
    last: dict[int, int] = {}  # session -> position of its previous row
    for n, (where, row) in enumerate(jsonl_rows(path, "AIPerf Mooncake", ())):
        if n % _CHECK_EVERY == 0:
            check()
        req = _prompt(where, row, block)
        ts = _ms(row, "timestamp", where)
        delay = _ms(row, "delay", where)
        sid = row.get("session_id")
        if sid is not None and not isinstance(sid, str):
            raise WorkloadError(f"{where}: session_id {shown(sid)} is not text")
        session = -1 if sid is None else sessions.setdefault(sid, len(sessions))
        prev = last.get(session, -1) if session >= 0 else -1
        prev_t = rows[prev].arrival_s if prev >= 0 else 0.0
        if ts is not None:
            t = ts
            if prev >= 0 and t < prev_t:
                raise WorkloadError(
                    f"{where}: timestamp {t * 1000:g} ms is before the previous row of session {shown(sid)} "
                    f"({prev_t * 1000:g} ms)"
                )
        else:
            t = prev_t + (delay or 0.0)
        pause = delay if delay is not None else t - prev_t
        rows.append(replace(req, arrival_s=t, session=session, after=prev, delay_s=pause))
        if session >= 0:
            last[session] = len(rows) - 1
    order = sorted(range(len(rows)), key=lambda i: (rows[i].arrival_s, i))
    index = {pos: k for k, pos in enumerate(order)}
    for pos in order:
        r = rows[pos]
        yield replace(r, after=index[r.after] if r.after >= 0 else -1)


def _ms(row: dict, key: str, where: str) -> float | None:
    """A time in milliseconds, as seconds; None when the row has none."""
    if row.get(key) is None:
        return None
    return parse_number(value_text(row[key]), where, key) / 1000.0


def _prompt(where: str, row: dict, block: int) -> TraceRequest:
    given = [k for k in _PROMPTS if row.get(k) is not None]
    if len(given) != 1:
        found = ", ".join(given) if given else "none"
        raise WorkloadError(
            f"{where}: a row has exactly one of input_length, text_input, messages (found {found}); "
            "is this an AIPerf Mooncake trace?"
        )
    if given == ["payload"]:
        raise WorkloadError(f"{where}: a payload row is a request body AIPerf sends as it is; kvtier sends prompts")
    if row.get("hash_ids") is not None and given != ["input_length"]:
        raise WorkloadError(f"{where}: hash_ids need input_length (the blocks of a prompt made to that length)")
    counts = {"output_length": 0 if row.get("output_length") is None else row["output_length"]}
    if given == ["input_length"]:
        return request_of(where, 0.0, {**row, **counts}, "input_length", "output_length", block)
    text = row["text_input"] if given == ["text_input"] else _messages_text(row["messages"], where)
    if not isinstance(text, str):
        raise WorkloadError(f"{where}: text_input is {type(text).__name__}, not text")
    tokens = math.ceil(len(text) / CHARS_PER_TOKEN)
    req = request_of(where, 0.0, {"input_length": tokens, **counts}, "input_length", "output_length", block)
    return replace(req, text=text)


def _messages_text(messages, where: str) -> str:
    if not isinstance(messages, list) or not messages:
        raise WorkloadError(f"{where}: messages must be a non-empty list of chat messages")
    texts = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m:
            raise WorkloadError(f"{where}: messages[{i}] is not a chat message with a role")
        content = m.get("content")
        if isinstance(content, list):  # content parts: their texts
            parts = [_part_text(p) for p in content]
            if any(not isinstance(p, str) for p in parts):
                raise WorkloadError(f"{where}: messages[{i}].content holds a part that is not text")
            content = "\n".join(parts)
        if not isinstance(content, str):
            raise WorkloadError(f"{where}: messages[{i}].content is {type(content).__name__}, not text")
        texts.append(content)
    return "\n".join(texts)


def _part_text(part) -> str | None:
    """A content part's text; None for a part that is not text (an image, audio)."""
    return part.get("text") if isinstance(part, dict) and part.get("type", "text") == "text" else None
