"""Production KV traces that carry block hashes: each request lists the ids of its prompt's blocks, so the prefix
reuse of the real service is in the trace (equal leading ids = a prefix the cache could serve).

Formats read here:
- ``mooncake``: the Mooncake traces (kvcache-ai/Mooncake, FAST25-release/traces/*.jsonl and the older
  arxiv-trace/mooncake_trace.jsonl; Apache-2.0). One JSON object a line: ``timestamp`` (ms from the trace start),
  ``input_length``, ``output_length`` (tokens), ``hash_ids`` (remapped prefix block hashes, 512 tokens a block, the
  last block partial; the release's README and the FAST'25 paper's appendix A say so).

Every row is checked; a bad one stops the load with one line naming file:line, as the BurstGPT source does: a missing
or non-numeric field, a count that is not a whole number >= 0, a timestamp earlier than the previous row's, hash ids
that are not integers, or more hash ids than ``input_length`` has blocks. Fewer ids than blocks is allowed (the
blocks without an id are never reusable).

``block_tokens`` rescales the trace's block: a 512-token block becomes N tokens and every length is scaled with it,
so a long-context trace fits a small model and the block structure is kept exactly (a prompt of k whole blocks and a
partial one still has k + 1 blocks).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from replay.sources.base import LoadReport, WorkloadError, parse_count, parse_number, read_lines

__all__ = ["FORMATS", "BlockTrace", "TraceRequest", "load_block_trace", "merge_traces"]

# Each format's block size in tokens, as its publisher documents it.
FORMATS: dict[str, int] = {"mooncake": 512}


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a block-hash trace: when it arrives, its lengths, and the ids of its prompt's blocks."""

    arrival_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class BlockTrace:
    """A loaded trace: its requests in arrival order, the block size they are counted in, and what the load kept."""

    name: str
    requests: tuple[TraceRequest, ...]
    block_tokens: int
    report: LoadReport


def load_block_trace(
    path: str | os.PathLike,
    fmt: str = "mooncake",
    *,
    block_tokens: int | None = None,
    max_requests: int | None = None,
) -> BlockTrace:
    """Read a block-hash trace. `block_tokens` rescales the block (None: the format's own); `max_requests` keeps the
    first N rows. WorkloadError (one line, file:line) for a file or row that cannot be used."""
    if fmt not in FORMATS:
        raise WorkloadError(f"--format {fmt}: not a block-hash trace format (known: {', '.join(FORMATS)})")
    native = FORMATS[fmt]
    block = native if block_tokens is None else block_tokens
    if block < 1:
        raise WorkloadError(f"--trace-block-tokens {block}: must be at least 1")
    report = LoadReport(source=fmt, tokenizer="trace token counts")
    requests = []
    for req in _read_mooncake(path, native):
        if max_requests is not None and len(requests) >= max_requests:
            break
        requests.append(_rescale(req, native, block) if block != native else req)
    if not requests:
        raise WorkloadError(f"{path}: no request in this {fmt} trace")
    report.conversations = report.turns = len(requests)
    name = os.path.basename(os.fspath(path)).removesuffix(".jsonl").replace("_trace", "")  # Mooncake: conversation
    return BlockTrace(name, tuple(requests), block, report)


def _rescale(req: TraceRequest, native: int, block: int) -> TraceRequest:
    # ceil keeps the block count: k whole blocks and a partial one stay k whole blocks and a partial one.
    return TraceRequest(
        req.arrival_s,
        math.ceil(req.input_tokens * block / native),
        math.ceil(req.output_tokens * block / native),
        req.hash_ids,
    )


_MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


def _read_mooncake(path: str | os.PathLike, block: int) -> Iterator[TraceRequest]:
    previous_ms = 0.0
    for number, line in enumerate(read_lines(path, "Mooncake trace (JSONL)"), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{where}: not a JSON object ({exc.msg}); is this a Mooncake trace?") from None
        if not isinstance(row, dict):
            raise WorkloadError(f"{where}: expected a JSON object, found {type(row).__name__}")
        missing = [f for f in _MOONCAKE_FIELDS if f not in row]
        if missing:
            raise WorkloadError(
                f"{where}: missing {', '.join(missing)} (a Mooncake row has {', '.join(_MOONCAKE_FIELDS)})"
            )
        ms = parse_number(_text(row["timestamp"]), where, "timestamp")
        if ms < previous_ms:
            raise WorkloadError(f"{where}: timestamp {ms:g} ms is earlier than the previous row's {previous_ms:g} ms")
        previous_ms = ms
        inp = parse_count(_text(row["input_length"]), where, "input_length")
        out = parse_count(_text(row["output_length"]), where, "output_length")
        ids = _hash_ids(row["hash_ids"], where)
        if len(ids) > math.ceil(inp / block):
            raise WorkloadError(
                f"{where}: {len(ids)} hash_ids for input_length {inp}: at {block} tokens a block it has "
                f"{math.ceil(inp / block)} blocks"
            )
        yield TraceRequest(ms / 1000.0, inp, out, ids)


def _text(value) -> str:
    """A JSON value as the text the shared number checks read (a bool is not a number, whatever Python says)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return repr(value)
    return str(value)


def _hash_ids(value, where: str) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise WorkloadError(f"{where}: hash_ids must be a list of integers, found {type(value).__name__}")
    for v in value:
        if isinstance(v, bool) or not isinstance(v, int):
            raise WorkloadError(f"{where}: hash_ids holds {v!r}, not an integer")
    return tuple(value)


def merge_traces(traces: Sequence[BlockTrace], name: str = "all") -> BlockTrace:
    """Several traces as one service would see them: requests interleaved by arrival, each trace's hash ids kept
    apart (ids are remapped per file, so id 7 of one trace is not id 7 of another). Same block size required."""
    sizes = {t.block_tokens for t in traces}
    if len(sizes) != 1:
        raise WorkloadError(f"traces with different block sizes ({sorted(sizes)} tokens) cannot be merged")
    dense: dict[tuple[int, int], int] = {}  # (trace, id) -> a new id unique across the traces
    tagged = []
    for i, t in enumerate(traces):
        for r in t.requests:
            ids = tuple(dense.setdefault((i, h), len(dense)) for h in r.hash_ids)
            tagged.append((r.arrival_s, i, TraceRequest(r.arrival_s, r.input_tokens, r.output_tokens, ids)))
    tagged.sort(key=lambda x: (x[0], x[1]))  # stable: each trace keeps its own order at equal times
    report = LoadReport(source="+".join(t.report.source for t in traces), tokenizer="trace token counts")
    report.conversations = report.turns = len(tagged)
    return BlockTrace(name, tuple(r for _, _, r in tagged), sizes.pop(), report)
