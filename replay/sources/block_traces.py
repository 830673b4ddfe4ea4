"""Production KV traces that carry block hashes: each request lists the ids of its prompt's blocks, so the prefix
reuse of the real service is in the trace (equal leading ids = a prefix the cache could serve).

Formats read here (each as its publisher documents it):
- ``mooncake``: the Mooncake traces (kvcache-ai/Mooncake, FAST25-release/traces/*.jsonl and the older
  arxiv-trace/mooncake_trace.jsonl; Apache-2.0). One JSON object a line: ``timestamp`` (ms from the trace start),
  ``input_length``, ``output_length`` (tokens), ``hash_ids`` (remapped prefix block hashes, 512 tokens a block, the
  last block partial; the release's README and the FAST'25 paper's appendix A say so).
- ``bailian``: Alibaba's Qwen-Bailian traces (alibaba-edu/qwen-bailian-usagetraces-anon, qwen_*_blksz_16.jsonl;
  Apache-2.0). One JSON object a line: ``chat_id``, ``parent_chat_id`` (-1 for a session's first request),
  ``timestamp`` (seconds), ``input_length``, ``output_length``, ``type`` (text/search/image/file), ``turn``,
  ``hash_ids`` (salted SipHash ids of 16-token blocks). Sessions are metadata here: each request is sent as the trace
  has it, its prompt made from its own ids (which already cover the history it carries).
- ``weka``: the Weka / SemiAnalysis agentic-coding traces (callanjfox/kv-cache-tester ``traces/`` and Hugging Face
  semianalysisai/cc-traces-weka-*; Apache-2.0). ONE JSON document per file, one conversation with its API calls and
  sub-agents; a path is one such file or a directory of them (``*.json``, sorted by name), whose conversations all
  start at time 0, as users who arrive together. replay/sources/weka_trace.py reads them: sub-agents' times made
  absolute, and each call's session links (what it waits for when replayed closed loop).
- ``aiperf-mooncake``: AIPerf's Mooncake format, the superset its users write (``timestamp`` or ``delay``,
  ``session_id``, ``input_length`` or ``text_input``/``messages``, ``hash_ids`` optional):
  replay/sources/aiperf_mooncake.py says what is read. A name of its own, not ``mooncake``: a FAST'25 row without
  its hash ids stays an error there, not a request that silently claims no reuse.
- ``servegen``: ServeGen's offline traces (alibaba/ServeGen, data/offline/trace_a..c.jsonl; Apache-2.0). One JSON
  object a line: ``request_id``, ``type``, ``input_length``, ``hash_ids`` (16-token blocks, one id namespace across
  the files), ``output_length`` where a row has it. No times: a run paces the requests (``kvtier replay --users N``
  keeps N in flight), each at time 0 in the file's order.
- ``azure``: the Azure LLM inference traces (Azure/AzurePublicDataset; CC-BY-4.0), told apart by their header: 2023
  and the 2024 week (data/AzureLLMInferenceTrace_*.csv: ``TIMESTAMP``, ``ContextTokens``, ``GeneratedTokens``; the
  2024 times carry a zone) and the 2025 multimodal trace (AzureLMMInferenceTrace_multimodal.csv: ``TIMESTAMP``,
  ``NumImages``, ``ContextTokens``, ``GeneratedTokens``, ISO times). No prefix information, so no request shares a
  block with another (its plan is all misses), counted in 16-token blocks (vLLM's default).

Every row is checked; a bad one stops the load with one line naming file:line, as the BurstGPT source does: a missing
or non-numeric field, a count that is not a whole number >= 0, a timestamp earlier than the previous row's, hash ids
that are not integers, or more hash ids than ``input_length`` has blocks. Fewer ids than blocks is allowed (the
blocks without an id are never reusable).

``block_tokens`` rescales the trace's block: a 512-token block becomes N tokens and every length is scaled with it,
so a long-context trace fits a small model and the block structure is kept exactly (a prompt of k whole blocks and a
partial one still has k + 1 blocks). A block is at most ``MAX_BLOCK_TOKENS``.

What a load keeps is bounded by its options, each as the other sources read it: ``max_context_tokens`` cuts a request
whose prompt and answer exceed it (the prompt keeps up to the bound, the answer what is left, the ids past the
prompt's last block dropped) and counts it in the report's ``truncated``; ``max_requests`` keeps the first rows;
``until_s`` stops at the first row that arrives that long after the first (rows are in arrival order, so none
after it is sent within a window of that length); ``max_block_uses`` refuses a trace whose hash ids outgrow it, as
they are read (by default ``MAX_BLOCK_USES``), and a file past ``MAX_TRACE_BYTES`` is refused before a byte is
read unless ``max_requests`` or ``until_s`` says how much of it to take (``limit_flag`` names the driver's flag for
it in the refusal); ``should_stop`` is asked every few thousand rows, and when it answers true the load raises
``LoadStopped`` (a loader in a worker thread stopped by a signal).
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from replay.common.json_files import refuse_malformed, shown
from replay.sources.aiperf_mooncake import CHARS_PER_TOKEN, read_aiperf_mooncake
from replay.sources.base import (
    LoadReport,
    Turn,
    WorkloadError,
    bound_turn,
    parse_count,
    parse_number,
    read_lines,
)
from replay.sources.trace_request import TraceRequest, jsonl_rows, request_of, value_text
from replay.sources.weka_trace import read_weka

__all__ = [
    "FORMATS",
    "MAX_BLOCK_TOKENS",
    "SHARED_ID_FORMATS",
    "UNTIMED_FORMATS",
    "BlockTrace",
    "LoadStopped",
    "TraceRequest",
    "load_block_trace",
    "merge_traces",
]

# Each format's block size in tokens, as its publisher documents it (azure has none: vLLM's default block).
FORMATS: dict[str, int] = {
    "mooncake": 512,
    "aiperf-mooncake": 512,
    "bailian": 16,
    "weka": 64,
    "azure": 16,
    "servegen": 16,
}
# Formats whose rows carry no time: a run paces their requests itself (a closed loop, or a rate).
UNTIMED_FORMATS = frozenset({"servegen"})
# Formats whose hash ids are one namespace across a release's files (ServeGen's trace_a..c): traces merged keep
# them shared, where every other format's ids are remapped per file and kept apart.
SHARED_ID_FORMATS = frozenset({"servegen"})
# The largest block --trace-block-tokens may ask for: 2^20 tokens, bench's largest --block-size. Every length is
# scaled by block / native, so an unbounded block makes unbounded prompts; no engine's block comes near it.
MAX_BLOCK_TOKENS = 1 << 20
# Rows read between two questions to `should_stop` (a few milliseconds of parsing).
_CHECK_EVERY = 2048


class LoadStopped(Exception):
    """`should_stop` answered true: the load was abandoned (a signal arrived while a worker thread read the trace)."""


@dataclass(frozen=True, slots=True)
class BlockTrace:
    """A loaded trace: its requests in arrival order, the block size they are counted in, and what the load kept."""

    name: str
    requests: tuple[TraceRequest, ...]
    block_tokens: int
    report: LoadReport
    shared_ids: bool = False  # its ids are one namespace with other files' of its format (SHARED_ID_FORMATS)

    @property
    def has_block_ids(self) -> bool:
        """Whether any request names its blocks: without ids nothing is shared, so no reuse can be modelled."""
        return any(r.hash_ids for r in self.requests)


# What one run may hold of a block-hash trace. A block use (one per whole block of a request) costs about 60 bytes of
# memory and 6 microseconds to model (a 500 MB Mooncake-like trace: 4.4 GB, 6.5 minutes), so 3 x 10^7 of them is about
# 2 GB and 3 minutes; the uses are counted as the rows are read, whatever the file's size. Files past MAX_TRACE_BYTES
# are refused before a byte is read unless a bound on requests or time says how much of them to take.
MAX_BLOCK_USES = 30_000_000
MAX_TRACE_BYTES = 256 << 20


def _trace_bytes(path: str | os.PathLike) -> int:
    """The bytes a trace path holds (a Weka directory: its *.json files); 0 where it cannot be read (the load says
    why, with its own line)."""
    try:
        if os.path.isdir(path):
            return sum(e.stat().st_size for e in os.scandir(path) if e.name.endswith(".json") and e.is_file())
        return os.stat(path).st_size
    except OSError:
        return 0


def oversize(paths: Sequence[str | os.PathLike], limit_flag: str) -> str | None:
    """Why these traces are too large to read whole (None when they are not), and how to go on."""
    total = sum(_trace_bytes(p) for p in paths)
    if total <= MAX_TRACE_BYTES:
        return None
    return (
        f"{total / 1e6:,.0f} MB of traces, over the {MAX_TRACE_BYTES >> 20} MiB a run reads whole (at most "
        f"{MAX_BLOCK_USES:,} block uses, about 2 GB and 3 minutes); give {limit_flag} N to take the first N requests "
        "of each"
    )


def load_block_trace(
    path: str | os.PathLike,
    fmt: str = "mooncake",
    *,
    block_tokens: int | None = None,
    max_requests: int | None = None,
    max_context_tokens: int | None = None,
    until_s: float | None = None,
    max_block_uses: int | None = MAX_BLOCK_USES,
    should_stop: Callable[[], bool] | None = None,
    limit_flag: str = "--max-requests",
) -> BlockTrace:
    """Read a block-hash trace. `block_tokens` rescales the block (None: the format's own); the other options bound
    what is kept (the module's docstring). WorkloadError (one line, file:line) for a file or row that cannot be used,
    or a trace past `max_block_uses`; LoadStopped when `should_stop` said so."""
    if fmt not in FORMATS:
        raise WorkloadError(f"--format {fmt}: not a block-hash trace format (known: {', '.join(FORMATS)})")
    native = FORMATS[fmt]
    block = native if block_tokens is None else block_tokens
    if not 1 <= block <= MAX_BLOCK_TOKENS:
        raise WorkloadError(f"--trace-block-tokens {block}: must be 1 to {MAX_BLOCK_TOKENS:,}")
    if max_requests is None and until_s is None and (why := oversize([path], limit_flag)):
        raise WorkloadError(f"{os.fspath(path)}: {why}")
    report = LoadReport(source=fmt, tokenizer="trace token counts")
    requests = []
    uses = 0
    first_s = None

    def check() -> None:
        if should_stop is not None and should_stop():
            raise LoadStopped(str(path))

    # The readers name the line of what they find; anything a parser raises past them is still one line.
    with refuse_malformed(os.fspath(path), WorkloadError):
        for n, req in enumerate(_READERS[fmt](path, native, check)):
            if n % _CHECK_EVERY == 0:
                check()
            if max_requests is not None and len(requests) >= max_requests:
                break
            first_s = req.arrival_s if first_s is None else first_s
            if until_s is not None and req.arrival_s - first_s >= until_s:
                break
            req = _rescale(req, native, block) if block != native else req
            req = _bound(req, block, max_context_tokens, report)
            uses += min(len(req.hash_ids), req.input_tokens // block)
            if max_block_uses is not None and uses > max_block_uses:
                raise WorkloadError(
                    f"{path}: more than {max_block_uses:,} block uses by its request {len(requests) + 1:,}, more than "
                    f"this run may hold; give {limit_flag} N to take the first N requests"
                )
            requests.append(req)
    if not requests:
        raise WorkloadError(f"{path}: no request in this {fmt} trace")
    report.conversations = report.turns = len(requests)
    name = os.path.basename(os.fspath(path)).rsplit(".", 1)[0].replace("_trace", "")  # Mooncake: conversation
    return BlockTrace(name, tuple(requests), block, report, fmt in SHARED_ID_FORMATS)


def _rescale(req: TraceRequest, native: int, block: int) -> TraceRequest:
    # ceil keeps the block count: k whole blocks and a partial one stay k whole blocks and a partial one. A prompt
    # the trace gives as text keeps its length: the text is what is sent.
    return replace(
        req,
        input_tokens=req.input_tokens if req.text is not None else math.ceil(req.input_tokens * block / native),
        output_tokens=math.ceil(req.output_tokens * block / native),
    )


def _bound(req: TraceRequest, block: int, max_tokens: int | None, report: LoadReport) -> TraceRequest:
    """The request cut so that its prompt plus its answer fit `max_tokens` (replay/sources/base.py: bound_turn, as
    every source cuts), its ids cut to the prompt's blocks; counted in the report."""
    if max_tokens is None or req.input_tokens + req.output_tokens <= max_tokens:
        return req
    turn = bound_turn(Turn(req.input_tokens, req.output_tokens), max_tokens, report)
    ids = req.hash_ids[: -(-turn.input_tokens // block)]
    text = None if req.text is None else req.text[: turn.input_tokens * CHARS_PER_TOKEN]  # as its tokens were counted
    return replace(req, input_tokens=turn.input_tokens, output_tokens=turn.output_tokens, hash_ids=ids, text=text)


class _Clock:
    """Arrival times must not go back: a trace's rows are in arrival order."""

    def __init__(self, unit: str) -> None:
        self.unit, self.last = unit, 0.0

    def __call__(self, value: float, where: str) -> float:
        if value < self.last:
            raise WorkloadError(
                f"{where}: timestamp {value:g} {self.unit} is earlier than the previous row's {self.last:g} {self.unit}"
            )
        self.last = value
        return value


_AIPERF_ONLY = ("session_id", "delay", "text_input", "messages")


def _read_mooncake(path: str | os.PathLike, block: int, check: Callable[[], None]) -> Iterator[TraceRequest]:
    clock = _Clock("ms")
    fields = ("timestamp", "input_length", "output_length", "hash_ids")
    for where, row in jsonl_rows(path, "Mooncake", ()):
        missing = [f for f in fields if f not in row]
        if missing:
            # AIPerf's users write rows with fewer fields (a prompt's length or text, sessions, delays): say where
            # they are read, rather than claim block reuse the row does not carry
            superset = "input_length" in row or any(k in row for k in _AIPERF_ONLY)
            also = "; an AIPerf Mooncake row: --source aiperf-mooncake" if superset else ""
            raise WorkloadError(f"{where}: missing {', '.join(missing)} (a Mooncake row has {', '.join(fields)}{also})")
        ms = clock(parse_number(value_text(row["timestamp"]), where, "timestamp"), where)
        yield request_of(where, ms / 1000.0, row, "input_length", "output_length", block)


def _read_bailian(path: str | os.PathLike, block: int, check: Callable[[], None]) -> Iterator[TraceRequest]:
    clock = _Clock("s")
    fields = ("chat_id", "parent_chat_id", "timestamp", "input_length", "output_length", "hash_ids")
    for where, row in jsonl_rows(path, "Bailian", fields):
        s = clock(parse_number(value_text(row["timestamp"]), where, "timestamp"), where)
        yield request_of(where, s, row, "input_length", "output_length", block)


# The Azure traces' column sets, told apart by the header: 2023 (AzureLLMInferenceTrace_{conv,code}.csv) and the
# 2024 week (times with a zone, 2024-05-10 00:00:00.009930+00:00) have three columns; the 2025 multimodal trace
# (AzureLMMInferenceTrace_multimodal.csv, ISO times 2024-10-15T12:00:00.269) counts the images of each request too.
_AZURE_HEADERS = {
    ("TIMESTAMP", "ContextTokens", "GeneratedTokens"): "2023/2024",
    ("TIMESTAMP", "NumImages", "ContextTokens", "GeneratedTokens"): "2025 multimodal",
}


def _read_azure(path: str | os.PathLike, block: int, check: Callable[[], None]) -> Iterator[TraceRequest]:
    lines = read_lines(path, "Azure LLM inference trace (CSV)")
    reader = csv.reader(lines)
    # csv.Error (a field over csv's 128 KiB limit, which an unclosed quote soon makes) at the line the reader is at
    with refuse_malformed(lambda: f"{path}:{max(1, reader.line_num)}", WorkloadError):
        yield from _azure_rows(path, reader, block)


def _azure_rows(path: str | os.PathLike, reader, block: int) -> Iterator[TraceRequest]:
    header = next(reader, None)
    columns = tuple(h.strip() for h in header) if header else ()
    if columns not in _AZURE_HEADERS:
        found = shown(",".join(header)) if header else "nothing"
        expected = " or ".join(",".join(c) for c in _AZURE_HEADERS)
        raise WorkloadError(f"{path}:1: not an Azure LLM inference trace (found {found}; expected {expected})")
    clock = _Clock("s")
    start = None
    for row in reader:
        where = f"{path}:{reader.line_num}"
        if not row or all(not f.strip() for f in row):
            continue
        if len(row) != len(columns):
            raise WorkloadError(f"{where}: expected {len(columns)} fields, found {len(row)}")
        fields = dict(zip(columns, row, strict=True))
        stamp = fields["TIMESTAMP"].strip()
        try:
            when = datetime.fromisoformat(stamp)
        except ValueError:
            raise WorkloadError(f"{where}: TIMESTAMP {shown(stamp)} is not a date and time") from None
        if start is not None and (when.tzinfo is None) != (start.tzinfo is None):
            # no time to subtract: a time without a zone is in no zone we could compare with one that has a zone
            has = "has a time zone, the first row's has none" if when.tzinfo else "has none, the first row's has one"
            raise WorkloadError(f"{where}: TIMESTAMP {shown(stamp)} {has} (every row has one or none)")
        start = when if start is None else start
        s = clock((when - start).total_seconds(), where)
        if "NumImages" in fields:  # checked, not sent: the prompt's tokens (ContextTokens) are what a cache holds
            parse_count(fields["NumImages"], where, "NumImages")
        yield request_of(where, s, fields, "ContextTokens", "GeneratedTokens", block)


def _read_servegen(path: str | os.PathLike, block: int, check: Callable[[], None]) -> Iterator[TraceRequest]:
    # No times: every request at 0, in file order (a run paces them). No answer length unless a row has one.
    for where, row in jsonl_rows(path, "ServeGen offline", ("request_id", "input_length", "hash_ids")):
        counts = {"output_length": 0 if row.get("output_length") is None else row["output_length"]}
        yield request_of(where, 0.0, {**row, **counts}, "input_length", "output_length", block)


_READERS = {
    "mooncake": _read_mooncake,
    "aiperf-mooncake": read_aiperf_mooncake,
    "bailian": _read_bailian,
    "weka": read_weka,
    "azure": _read_azure,
    "servegen": _read_servegen,
}


def merge_traces(traces: Sequence[BlockTrace], name: str = "all") -> BlockTrace:
    """Several traces as one service would see them: requests interleaved by arrival, each trace's hash ids kept
    apart (ids are remapped per file, so id 7 of one trace is not id 7 of another) unless its format's ids are one
    namespace across files (BlockTrace.shared_ids). Same block size required."""
    sizes = {t.block_tokens for t in traces}
    if len(sizes) != 1:
        raise WorkloadError(f"traces with different block sizes ({sorted(sizes)} tokens) cannot be merged")
    dense: dict[tuple[int, int], int] = {}  # (trace, id) -> a new id unique across the traces
    tagged = []
    for i, t in enumerate(traces):
        scope = -1 if t.shared_ids else i  # a shared namespace: id 7 of one file is id 7 of the other
        for r in t.requests:
            ids = tuple(dense.setdefault((scope, h), len(dense)) for h in r.hash_ids)
            tagged.append((r.arrival_s, i, TraceRequest(r.arrival_s, r.input_tokens, r.output_tokens, ids)))
    tagged.sort(key=lambda x: (x[0], x[1]))  # stable: each trace keeps its own order at equal times
    report = LoadReport(source="+".join(t.report.source for t in traces), tokenizer="trace token counts")
    report.conversations = report.turns = len(tagged)
    shared = all(t.shared_ids for t in traces)
    return BlockTrace(name, tuple(r for _, _, r in tagged), sizes.pop(), report, shared)
