"""Streaming requests to an OpenAI-compatible server: one frozen spec in, one record out, never an exception.

The record keeps raw monotonic timestamps (``time.perf_counter_ns``); TTFT, ITL, TPOT and E2E are derived afterwards
(`RequestRecord.derive`). SSE is parsed incrementally and in linear time (`_SSEReader`: each byte is scanned once,
only a partial line is kept between reads): events split across reads are joined, ``:`` comments (pings) skipped,
``[DONE]`` ends the stream; a stream that ends inside an event (no blank line after it) is `malformed_sse`. A chunk
that carries only the assistant role (no text) is not a token. When the server reports cumulative usage on every chunk
(``stream_options.continuous_usage_stats``, vLLM and SGLang do), a chunk holding k tokens spreads its gap over k
inter-token latencies; otherwise each content chunk counts as one token.
"""

from __future__ import annotations

import asyncio
import errno
import json
import resource
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

import aiohttp

__all__ = ["ERROR_KINDS", "RequestRecord", "RequestSpec", "api_root", "send_streaming"]

# Besides these, a non-200 answer is "http_<status>" (http_404, http_500, ...).
ERROR_KINDS = (
    "timeout",
    "connection",
    "disconnected",
    "malformed_sse",
    "stream_error",
    "incomplete_stream",
    "overlong_stream",
    "client_limit",
    "no_content",
    "cancelled",
    "other",
)

# One SSE event larger than this (no blank line to end it) is a broken stream, not something to buffer forever.
MAX_EVENT_BYTES = 16 << 20


def max_stream_tokens(max_tokens: int) -> int:
    """Content tokens read before a stream counts as `overlong_stream`: the asked max_tokens plus a margin (a
    server may count a final chunk or a stop string differently), so a stream that never ends is cut, not read on."""
    return max_tokens + max(16, max_tokens // 10)


def api_root(base_url: str) -> str:
    """The server root from a base URL given either way: ``http://h:p`` or the OpenAI SDK's ``http://h:p/v1``
    (trailing slash or not). Request paths (/v1/..., /tokenize) are appended to the root."""
    root = base_url.rstrip("/")
    return root[:-3] if root.endswith("/v1") else root


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """What to send: built by the driver just before the send (multi-turn history is known only then)."""

    request_id: int
    session_id: str
    turn_index: int
    url: str
    payload: dict[str, Any]
    headers: dict[str, str] | None = None
    round_index: int | None = None
    warmup: bool = False
    # The prompt length the workload asked for (the server's `usage` gives the real one).
    target_prompt_tokens: int = 0


@dataclass(slots=True)
class RequestRecord:
    """The outcome of one request. Timestamps are `perf_counter_ns` values; 0 means "did not happen"."""

    request_id: int
    session_id: str
    turn_index: int
    round_index: int | None = None
    warmup: bool = False
    target_prompt_tokens: int = 0
    max_tokens: int = 0
    scheduled_ns: int = 0  # the absolute deadline from the precomputed schedule (or the moment the turn became ready)
    dispatched_ns: int = 0  # when the driver woke up for it (send lag = dispatched - scheduled)
    slot_ns: int = 0  # when a concurrency slot was free (client queue time = slot - dispatched)
    sent_ns: int = 0
    first_byte_ns: int = 0
    first_token_ns: int = 0
    last_chunk_ns: int = 0
    chunk_ns: list[int] = field(default_factory=list)  # arrival of each content chunk
    chunk_tokens: list[int] = field(default_factory=list)  # tokens in each content chunk (1 when unknown)
    prompt_tokens: int | None = None  # from `usage`
    output_tokens: int | None = None
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens when the server reports it
    http_status: int = 0
    success: bool = False
    error_kind: str | None = None
    error: str | None = None
    output_text: str = ""

    # ---- derived metrics, in milliseconds (None when the request did not get that far) ----
    def ttft_ms(self) -> float | None:
        return (self.first_token_ns - self.sent_ns) / 1e6 if self.first_token_ns and self.sent_ns else None

    def e2el_ms(self) -> float | None:
        return (self.last_chunk_ns - self.sent_ns) / 1e6 if self.last_chunk_ns and self.sent_ns else None

    def n_output_tokens(self) -> int:
        if self.output_tokens is not None:
            return self.output_tokens
        return sum(self.chunk_tokens)

    def tpot_ms(self) -> float | None:
        n = self.n_output_tokens()
        if not self.first_token_ns or n < 2:
            return None
        return (self.last_chunk_ns - self.first_token_ns) / 1e6 / (n - 1)

    def itl_ns(self):
        """Inter-token gaps in ns: each gap between content chunks, split evenly over the tokens of the later chunk."""
        prev = 0
        for t, k in zip(self.chunk_ns, self.chunk_tokens):
            if prev:
                gap = (t - prev) // max(k, 1)
                for _ in range(max(k, 1)):
                    yield gap
            prev = t

    def send_lag_ms(self) -> float | None:
        return (self.dispatched_ns - self.scheduled_ns) / 1e6 if self.dispatched_ns and self.scheduled_ns else None

    def queue_ms(self) -> float | None:
        return (self.slot_ns - self.dispatched_ns) / 1e6 if self.slot_ns and self.dispatched_ns else None

    def to_json(self, t0_ns: int) -> dict[str, Any]:
        """Detail row: timestamps relative to the run start (ns) plus the derived figures."""

        def rel(v: int | None) -> int | None:
            return v - t0_ns if v else None

        return {
            "request_id": self.request_id,
            "session_id": self.session_id,
            "turn": self.turn_index,
            "round": self.round_index,
            "warmup": self.warmup,
            "success": self.success,
            "error_kind": self.error_kind,
            "error": self.error,
            "http_status": self.http_status,
            "target_prompt_tokens": self.target_prompt_tokens,
            "max_tokens": self.max_tokens,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "cached_tokens": self.cached_tokens,
            "scheduled_ns": rel(self.scheduled_ns),
            "dispatched_ns": rel(self.dispatched_ns),
            "slot_ns": rel(self.slot_ns),
            "sent_ns": rel(self.sent_ns),
            "first_byte_ns": rel(self.first_byte_ns),
            "first_token_ns": rel(self.first_token_ns),
            "last_chunk_ns": rel(self.last_chunk_ns),
            "chunk_ns": [t - t0_ns for t in self.chunk_ns],
            "chunk_tokens": self.chunk_tokens,
            "ttft_ms": _r(self.ttft_ms()),
            "tpot_ms": _r(self.tpot_ms()),
            "e2el_ms": _r(self.e2el_ms()),
            "send_lag_ms": _r(self.send_lag_ms()),
            "queue_ms": _r(self.queue_ms()),
        }


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 4)


def _fail(rec: RequestRecord, kind: str, msg: str) -> RequestRecord:
    rec.success = False
    rec.error_kind = kind
    rec.error = msg[:300]
    return rec


async def send_streaming(
    session: aiohttp.ClientSession, spec: RequestSpec, rec: RequestRecord, timeout: aiohttp.ClientTimeout | None = None
) -> RequestRecord:
    """POST `spec.payload` with streaming on and fill `rec`. Never raises (except `CancelledError`, re-raised after
    marking the record, so Ctrl-C and an aborted run still see what was in flight)."""
    clock = time.perf_counter_ns
    chat = "messages" in spec.payload
    text_parts: list[str] = []
    prev_completion = 0
    continuous = False
    reader = _SSEReader()
    try:
        rec.sent_ns = clock()
        async with session.post(spec.url, json=spec.payload, headers=spec.headers, timeout=timeout) as resp:
            rec.http_status = resp.status
            if resp.status != 200:
                # The start of the body is enough to say what went wrong; an error page can be any size.
                body = (await resp.content.read(2048)).decode(errors="replace")[:200]
                rec.first_byte_ns = clock()
                return _fail(rec, f"http_{resp.status}", f"HTTP {resp.status}: {body}")
            done = False
            # The run asks for identity; a server that compresses anyway is decoded (gzip or zlib "deflate").
            encoding = resp.headers.get("Content-Encoding", "identity").lower()
            inflate = zlib.decompressobj(32 + zlib.MAX_WBITS) if encoding in ("gzip", "x-gzip", "deflate") else None
            asked = spec.payload.get("max_tokens")
            token_cap = max_stream_tokens(asked) if isinstance(asked, int) and asked > 0 else None
            async for data in resp.content.iter_any():
                now = clock()
                if not rec.first_byte_ns:
                    rec.first_byte_ns = now
                if inflate is not None:
                    try:
                        data = inflate.decompress(data, MAX_EVENT_BYTES)
                    except zlib.error as exc:
                        return _fail(rec, "malformed_sse", f"Content-Encoding {encoding}: not decodable ({exc})")
                try:
                    events = reader.feed(data)
                except _SSEError as exc:
                    return _fail(rec, "malformed_sse", str(exc))
                for payload in events:
                    if payload == b"[DONE]":
                        done = True
                        break
                    try:
                        obj = json.loads(payload)
                    except ValueError:
                        return _fail(rec, "malformed_sse", f"undecodable SSE data: {payload[:80]!r}")
                    if not isinstance(obj, dict):
                        return _fail(rec, "malformed_sse", f"SSE data is not an object: {payload[:80]!r}")
                    if "error" in obj and not obj.get("choices"):
                        return _fail(rec, "stream_error", f"error event in stream: {str(obj['error'])[:200]}")
                    usage = obj.get("usage")
                    piece = _content(obj, chat)
                    if piece:
                        rec.last_chunk_ns = now
                        if not rec.first_token_ns:
                            rec.first_token_ns = now
                        rec.chunk_ns.append(now)
                        k = 1
                        if usage and usage.get("completion_tokens") is not None:
                            ct = int(usage["completion_tokens"])
                            k = max(ct - prev_completion, 1)
                            prev_completion = ct
                            continuous = True
                        rec.chunk_tokens.append(k)
                        text_parts.append(piece)
                        if token_cap is not None and max(prev_completion, len(rec.chunk_tokens)) > token_cap:
                            rec.output_text = "".join(text_parts)
                            return _fail(
                                rec,
                                "overlong_stream",
                                f"more than {token_cap} tokens streamed for max_tokens {asked}: stopped reading",
                            )
                    if usage:
                        if usage.get("prompt_tokens") is not None:
                            rec.prompt_tokens = int(usage["prompt_tokens"])
                        if usage.get("completion_tokens") is not None:
                            rec.output_tokens = int(usage["completion_tokens"])
                            if not piece and continuous:
                                prev_completion = rec.output_tokens
                        details = usage.get("prompt_tokens_details") or {}
                        if details.get("cached_tokens") is not None:
                            rec.cached_tokens = int(details["cached_tokens"])
                if done:
                    # Read the (empty) rest so the keep-alive connection goes back to the pool instead of closing.
                    await resp.content.read()
                    break
            if not done:
                left = reader.unterminated_bytes()
                if left:
                    return _fail(
                        rec,
                        "malformed_sse",
                        f"stream ended inside an SSE event: {left} bytes with no blank "
                        "line after them (events must be separated by a blank line)",
                    )
                ctype = resp.headers.get("Content-Type", "")
                if not rec.chunk_ns and "text/event-stream" not in ctype:
                    return _fail(
                        rec,
                        "malformed_sse",
                        f"the answer is not an event stream (Content-Type: {ctype or 'none'}): does the server stream?",
                    )
                return _fail(rec, "incomplete_stream", "stream ended without [DONE]")
    except asyncio.CancelledError:
        _fail(rec, "cancelled", "cancelled (run interrupted or aborted)")
        raise
    except TimeoutError:
        limit = timeout.total if timeout is not None else None
        if limit is not None and (clock() - rec.sent_ns) / 1e9 >= limit * 0.99:
            return _fail(rec, "timeout", f"not finished within the request's {limit:g} s (--request-max-time)")
        return _fail(rec, "timeout", "no data within the request timeout")
    except aiohttp.ClientConnectorError as exc:
        if getattr(exc.os_error, "errno", None) in (errno.EMFILE, errno.ENFILE):  # this process's limit, not the server
            return _fail(rec, "client_limit", fd_limit_message())
        return _fail(rec, "connection", f"cannot connect: {exc}")
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientOSError) as exc:
        return _fail(rec, "disconnected", f"connection dropped: {type(exc).__name__}: {exc}")
    except aiohttp.ClientError as exc:
        return _fail(rec, "other", f"{type(exc).__name__}: {exc}")
    except OSError as exc:
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            return _fail(rec, "client_limit", fd_limit_message())
        return _fail(rec, "other", f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # a request function never raises: anything else is recorded too
        return _fail(rec, "other", f"{type(exc).__name__}: {exc}")
    rec.output_text = "".join(text_parts)
    if not rec.first_token_ns:
        return _fail(rec, "no_content", "stream finished with no content token")
    rec.success = True
    return rec


def fd_limit_message() -> str:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return (
        f"this client is out of file descriptors (its limit, RLIMIT_NOFILE, is {soft}; hard limit {hard}): raise it "
        "with `ulimit -n` before the run, or send fewer requests at once (--max-concurrency, --concurrency, --users)"
    )


class _SSEError(ValueError):
    pass


class _SSEReader:
    """Splits a byte stream into the data of each SSE event, scanning each byte once: a read is searched for newlines
    from where the last one ended, and only an unfinished line is carried over (a growing buffer re-scanned on every
    read made a stream without blank lines quadratic). Lines end with LF or CRLF; a blank line ends an event;
    ``:`` comments and fields other than ``data`` are skipped; an event's data lines are joined with LF."""

    __slots__ = ("_data", "_line", "_pending")

    def __init__(self) -> None:
        self._line = bytearray()  # an unfinished line from earlier reads
        self._data: list[bytes] = []  # data lines of the event being read
        self._pending = 0  # bytes held in _data

    def feed(self, chunk: bytes) -> list[bytes]:
        """The data of each event completed by `chunk` (events without data lines are dropped)."""
        events: list[bytes] = []
        start = 0
        while True:
            nl = chunk.find(b"\n", start)
            if nl < 0:
                self._line += chunk[start:]
                break
            if self._line:
                self._line += chunk[start:nl]
                line = bytes(self._line)
                self._line.clear()
            else:
                line = chunk[start:nl]
            start = nl + 1
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if self._data:
                    events.append(self._data[0] if len(self._data) == 1 else b"\n".join(self._data))
                    self._data = []
                    self._pending = 0
            elif line.startswith(b"data:"):
                value = line[5:].lstrip(b" ")
                self._data.append(value)
                self._pending += len(value)
        if self._pending + len(self._line) > MAX_EVENT_BYTES:
            raise _SSEError(f"an SSE event grew past {MAX_EVENT_BYTES >> 20} MiB without a blank line to end it")
        return events

    def unterminated_bytes(self) -> int:
        """Bytes of event data that no blank line ended (a partial last line counts when it is a data line)."""
        partial = len(self._line) if self._pending or self._line.startswith(b"data:") else 0
        return self._pending + partial


def _content(obj: dict, chat: bool) -> str:
    choices = obj.get("choices")
    if not choices:
        return ""
    c = choices[0]
    if chat:
        delta = c.get("delta") or {}
        return (delta.get("content") or "") + (delta.get("reasoning_content") or delta.get("reasoning") or "")
    return c.get("text") or ""
