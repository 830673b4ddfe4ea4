"""A fake OpenAI-compatible streaming server with known, injected delays (a test and benchmark fixture).

It is a *fake* on purpose: it lets tests check that the replayer measures exactly the delays it was given, and lets
the overhead benchmark run with zero server cost. It streams `/v1/chat/completions` and `/v1/completions`, answers
`/tokenize`, `/detokenize`, `/health` and `/metrics` (vLLM's prefix-cache counter names, driven by a block-hash prefix
cache over whitespace "tokens", see below), and can inject faults (`FAULTS`): malformed SSE, a mid-stream disconnect,
any HTTP status (``http_500``, ``http_429``...), a stream without [DONE], a stream whose events lack the blank-line
separator, a response that hangs for `hang_s`; and a slow or hanging ``/tokenize`` (`tokenize_delay_s`).

The prefix cache is vLLM's in miniature: block k's hash covers blocks 0..k (chained), a prompt hits its full blocks up
to the first one not cached and never the block of its last token, and a finished request leaves the blocks of its
prompt and its answer (the answer as the next turn will send it back: after "<assistant>" in a chat, right after the
prompt in a completion), most recent last. `cache_tokens` (`--cache-tokens`) bounds it: past that many tokens of
blocks the least recently used blocks go first, which are the oldest sessions' chain heads, so replay's per-round hit
rate collapses once the sessions' working set exceeds it, as vLLM's does (kvtier plan models the same). 0 = no bound.

Use it in-process (`with FakeServer(cfg) as srv: srv.base_url`), which runs its own event loop in a thread, or as a
process: ``python -m replay.openai.fake_server --port 8123 --ttft-ms 0 --itl-ms 0`` (what the benchmark does, so the
server does not share the replayer's core).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web

from replay.common.ports import free_port

__all__ = ["FakeServer", "FakeServerConfig", "make_app"]

STATE_KEY: web.AppKey[_State] = web.AppKey("fake_state")  # set below, after _State
# "http_<status>" answers that status (http_500, http_404, http_429, ...); the others are named here.
FAULTS = ("malformed_sse", "disconnect", "http_500", "no_done", "no_blank_lines", "hang")


@dataclass
class FakeServerConfig:
    ttft_ms: float = 0.0  # delay before the first content chunk
    itl_ms: float = 0.0  # delay before each later content chunk
    tokens_per_chunk: int = 1  # tokens packed in one content chunk (the gap before it is `itl_ms * tokens_per_chunk`)
    role_chunk: bool = True  # chat: a role-only first chunk sent at once (must not count as a token)
    default_max_tokens: int = 16
    continuous_usage: bool = True  # honour stream_options.continuous_usage_stats
    block_size: int = 16  # the fake prefix cache's block size (in whitespace tokens)
    cache_tokens: int = 0  # the prefix cache's capacity in tokens (whole blocks, LRU); 0 = unbounded
    # request number (0-based, in arrival order) -> fault name from FAULTS or None
    fault_plan: Callable[[int], str | None] | None = None
    # the serializable form (works across processes): {fault name: every Nth request (1-based) gets it}
    fault_every: dict[str, int] = field(default_factory=dict)
    # word the fake "model" answers with; token i of an answer is f"{word}{i}"
    word: str = "tok"
    hang_s: float = 30.0  # the "hang" fault: seconds before the response starts (a client timeout should come first)
    tokenize_delay_s: float = 0.0  # /tokenize answers after this long (a large value = a hanging tokenizer)
    keep_bodies: int = 256  # how many of the latest request bodies (and their arrival times) are kept


@dataclass
class _State:
    requests: int = 0
    queries: int = 0
    hits: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    cached_blocks: OrderedDict = field(default_factory=OrderedDict)  # block hash -> None, least recent first
    evicted_blocks: int = 0
    recent_bodies: deque = field(default_factory=deque)  # for tests that check what was sent (bounded in make_app)
    recent_headers: deque = field(default_factory=deque)  # the same requests' headers
    recent_arrivals_ns: deque = field(default_factory=deque)  # the same requests' arrivals (perf_counter_ns)
    metrics_scrapes: int = 0  # GETs of /metrics (tests of the scrape interval)


async def _sleep_until(due: float, clock) -> None:
    """asyncio timers round up to whole milliseconds (epoll); sleep to 1.5 ms short, then yield until the deadline."""
    delay = due - clock()
    if delay > 0.0015:
        await asyncio.sleep(delay - 0.0015)
    while clock() < due:
        await asyncio.sleep(0)


def _prompt_text(body: dict) -> str:
    if "messages" in body:
        parts = []
        for m in body["messages"]:
            c = m.get("content")
            if isinstance(c, list):  # content parts
                c = " ".join(p.get("text", "") for p in c if isinstance(p, dict))
            parts.append(f"<{m.get('role', 'user')}> {c or ''}")
        return " ".join(parts)
    prompt = body.get("prompt", "")
    if isinstance(prompt, list):
        return " ".join(str(p) for p in prompt)
    return str(prompt)


def make_app(cfg: FakeServerConfig) -> web.Application:
    keep = cfg.keep_bodies
    state = _State(
        recent_bodies=deque(maxlen=keep), recent_headers=deque(maxlen=keep), recent_arrivals_ns=deque(maxlen=keep)
    )
    loop_time = time.perf_counter

    bs = cfg.block_size
    capacity = cfg.cache_tokens // bs if cfg.cache_tokens else None

    def chain(tokens: list[str]) -> list[bytes]:
        """The chained hashes of the full blocks of `tokens` (block k's hash covers blocks 0..k, like vLLM's)."""
        out, h = [], b""
        for i in range(0, len(tokens) - len(tokens) % bs, bs):
            h = hashlib.blake2b(h + " ".join(tokens[i : i + bs]).encode(), digest_size=8).digest()
            out.append(h)
        return out

    def remember(hashes: list[bytes]) -> None:
        """Blocks become the most recent (in chain order, so a chain's head is its oldest); LRU ones past the
        capacity are dropped."""
        cache = state.cached_blocks
        for h in hashes:
            cache[h] = None
            cache.move_to_end(h)
        while capacity is not None and len(cache) > capacity:
            cache.popitem(last=False)
            state.evicted_blocks += 1

    def prefix_lookup(tokens: list[str]) -> int:
        """Tokens of full blocks cached, up to the first missing one and never the last token's block; the prompt's
        blocks are then cached (the hit ones refreshed)."""
        hits = 0
        hashes = chain(tokens)
        for k, h in enumerate(hashes):
            if h not in state.cached_blocks or (k + 1) * bs >= len(tokens):
                break
            hits += bs
        remember(hashes)
        return hits

    async def completions(request: web.Request) -> web.StreamResponse:
        t_arrive = loop_time()
        arrival_ns = time.perf_counter_ns()
        n_req = state.requests
        state.requests += 1
        try:
            body = await request.json()
        except ValueError:
            return web.json_response({"error": {"message": "body is not JSON"}}, status=400)
        state.recent_bodies.append(body)
        state.recent_headers.append(dict(request.headers))
        state.recent_arrivals_ns.append(arrival_ns)
        fault = cfg.fault_plan(n_req) if cfg.fault_plan else None
        for name, every in cfg.fault_every.items():
            if every and (n_req + 1) % every == 0:
                fault = name
        if fault and fault.startswith("http_"):
            return web.json_response({"error": {"message": "injected failure"}}, status=int(fault[5:]))
        if fault == "hang":
            await asyncio.sleep(cfg.hang_s)
        chat = request.path.endswith("/chat/completions")
        tokens = _prompt_text(body).split()
        hits = prefix_lookup(tokens)
        state.queries += len(tokens)
        state.hits += hits
        state.prompt_tokens += len(tokens)
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or cfg.default_max_tokens)
        so = body.get("stream_options") or {}
        include_usage = bool(so.get("include_usage"))
        continuous = cfg.continuous_usage and bool(so.get("continuous_usage_stats"))
        model = body.get("model", "fake")
        rid = f"fake-{n_req}"

        # An event ends with a blank line; "no_blank_lines" ends each with one newline only (one endless event).
        sep = b"\n" if fault == "no_blank_lines" else b"\n\n"
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)

        def chunk(text: str | None, done_tokens: int, role: bool = False, finish: str | None = None) -> bytes:
            if chat:
                delta = {"role": "assistant", "content": ""} if role else {"content": text}
                choice = {"index": 0, "delta": delta, "finish_reason": finish}
                obj = {"id": rid, "object": "chat.completion.chunk", "model": model, "choices": [choice]}
            else:
                obj = {
                    "id": rid,
                    "object": "text_completion",
                    "model": model,
                    "choices": [{"index": 0, "text": text or "", "finish_reason": finish}],
                }
            if continuous:
                obj["usage"] = {
                    "prompt_tokens": len(tokens),
                    "completion_tokens": done_tokens,
                    "total_tokens": len(tokens) + done_tokens,
                }
            return b"data: " + json.dumps(obj).encode() + sep

        if chat and cfg.role_chunk:
            await resp.write(chunk(None, 0, role=True))
        sent = 0
        first = True
        # Delays are kept to absolute deadlines from the request's arrival, so timer slack never accumulates.
        due = t_arrive
        while sent < max_tokens:
            k = min(cfg.tokens_per_chunk, max_tokens - sent)
            due += (cfg.ttft_ms if first else cfg.itl_ms * k) / 1000
            await _sleep_until(due, loop_time)
            if fault == "disconnect" and sent >= max_tokens // 2:
                request.transport.close()  # drop the connection mid-stream
                return resp
            if fault == "malformed_sse" and not first:
                await resp.write(b"data: {not json\n\n")
                first = False
                sent += k
                continue
            text = "".join(f" {cfg.word}{sent + j}" for j in range(k))
            sent += k
            await resp.write(chunk(text, sent))
            first = False
        state.generation_tokens += sent
        # The answer's blocks stay cached too (vLLM keeps generated blocks), as the next turn's prompt will hold it.
        answer = [f"{cfg.word}{i}" for i in range(sent)]
        remember(chain(tokens + (["<assistant>"] if chat else []) + answer))
        if include_usage:
            u = {
                "prompt_tokens": len(tokens),
                "completion_tokens": sent,
                "total_tokens": len(tokens) + sent,
                "prompt_tokens_details": {"cached_tokens": hits},
            }
            await resp.write(b"data: " + json.dumps({"id": rid, "choices": [], "usage": u}).encode() + sep)
        if fault != "no_done":
            await resp.write(b"data: [DONE]" + sep)
        await resp.write_eof()
        return resp

    async def tokenize(request: web.Request) -> web.Response:
        if cfg.tokenize_delay_s:
            await asyncio.sleep(cfg.tokenize_delay_s)
        body = await request.json()
        toks = _prompt_text(body).split()
        ids = [int.from_bytes(hashlib.blake2b(t.encode(), digest_size=3).digest(), "little") for t in toks]
        return web.json_response({"count": len(ids), "tokens": ids, "max_model_len": 1 << 20})

    async def detokenize(request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"prompt": " ".join(f"w{t}" for t in body.get("tokens", []))})

    async def health(_request: web.Request) -> web.Response:
        return web.Response(text="")

    async def metrics(_request: web.Request) -> web.Response:
        state.metrics_scrapes += 1
        lines = [
            "# TYPE vllm:prefix_cache_queries_total counter",
            f'vllm:prefix_cache_queries_total{{model_name="fake"}} {state.queries}',
            "# TYPE vllm:prefix_cache_hits_total counter",
            f'vllm:prefix_cache_hits_total{{model_name="fake"}} {state.hits}',
            f'vllm:prompt_tokens_by_source_total{{model_name="fake",source="local_compute"}} '
            f"{state.queries - state.hits}",
            f'vllm:prompt_tokens_by_source_total{{model_name="fake",source="local_cache_hit"}} {state.hits}',
            'vllm:prompt_tokens_by_source_total{model_name="fake",source="external_kv_transfer"} 0',
            'vllm:num_preemptions_total{model_name="fake"} 0',
            f'vllm:request_success_total{{model_name="fake",finished_reason="length"}} {state.requests}',
            'vllm:num_requests_running{model_name="fake"} 0',
        ]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app[STATE_KEY] = state
    return app


class FakeServer:
    """Run the fake server on 127.0.0.1, in a background thread with its own event loop, or (process=True) in a
    child process so that it does not share the client's interpreter and core (for timing-sensitive checks)."""

    def __init__(self, cfg: FakeServerConfig | None = None, port: int | None = None, process: bool = False):
        self.cfg = cfg or FakeServerConfig()
        self.process = process
        self._proc: subprocess.Popen | None = None
        self.port = port or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self.app: web.Application | None = None

    @property
    def requests_seen(self) -> int:
        return self.app[STATE_KEY].requests if self.app else 0

    @property
    def recent_bodies(self) -> list[dict]:
        """Request bodies the server received (in-process mode only), oldest first."""
        return list(self.app[STATE_KEY].recent_bodies) if self.app else []

    @property
    def recent_headers(self) -> list[dict[str, str]]:
        """Headers of the requests in `recent_bodies` (in-process mode only), oldest first."""
        return list(self.app[STATE_KEY].recent_headers) if self.app else []

    @property
    def recent_arrivals_ns(self) -> list[int]:
        """When each request of `recent_bodies` arrived (time.perf_counter_ns, in-process mode only)."""
        return list(self.app[STATE_KEY].recent_arrivals_ns) if self.app else []

    @property
    def metrics_scrapes(self) -> int:
        """How many times /metrics was read (in-process mode only)."""
        return self.app[STATE_KEY].metrics_scrapes if self.app else 0

    def __enter__(self) -> FakeServer:
        if self.process:
            return self._start_process()
        self._thread = threading.Thread(target=self._run, name="fake-openai", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fake server did not start")
        return self

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
        self.app = make_app(self.cfg)
        # A client that gives up on a hanging response cancels its handler; shutdown waits 1 s, not aiohttp's 60.
        self._runner = web.AppRunner(self.app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        self._loop.run_until_complete(site.start())
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup())
        self._loop.close()

    def _start_process(self) -> FakeServer:
        if self.cfg.fault_plan is not None:
            raise ValueError("fault_plan (a callable) cannot cross processes: use fault_every")
        c = self.cfg
        cmd = [
            sys.executable,
            "-m",
            "replay.openai.fake_server",
            "--port",
            str(self.port),
            "--ttft-ms",
            str(c.ttft_ms),
            "--itl-ms",
            str(c.itl_ms),
            "--tokens-per-chunk",
            str(c.tokens_per_chunk),
            "--default-max-tokens",
            str(c.default_max_tokens),
            "--fault-every",
            json.dumps(c.fault_every),
            "--hang-s",
            str(c.hang_s),
            "--tokenize-delay-s",
            str(c.tokenize_delay_s),
            "--block-size",
            str(c.block_size),
            "--cache-tokens",
            str(c.cache_tokens),
        ]
        if not c.role_chunk:
            cmd.append("--no-role-chunk")
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
        from replay.common.leftovers import die_with_parent  # here: this file also runs alone, as the server's script

        # Dies with whoever started it (a killed test or benchmark leaves no server on the port).
        self._proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=die_with_parent()
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"fake server exited: {self._proc.stderr.read().decode()[-500:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        self._proc.kill()
        raise RuntimeError("fake server did not start within 20 s")

    def __exit__(self, *exc) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            return
        if self._loop:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread:
            self._thread.join(10)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="fake OpenAI-compatible streaming server with injected delays")
    ap.add_argument("--port", type=int, default=8123)
    ap.add_argument("--ttft-ms", type=float, default=0.0)
    ap.add_argument("--itl-ms", type=float, default=0.0)
    ap.add_argument("--tokens-per-chunk", type=int, default=1)
    ap.add_argument("--default-max-tokens", type=int, default=16)
    ap.add_argument("--no-role-chunk", action="store_true")
    ap.add_argument("--fault-every", default="{}", help='JSON, e.g. {"malformed_sse": 5}')
    ap.add_argument("--hang-s", type=float, default=30.0)
    ap.add_argument("--tokenize-delay-s", type=float, default=0.0)
    ap.add_argument("--block-size", type=int, default=16, help="prefix cache block, in whitespace tokens")
    ap.add_argument(
        "--cache-tokens", type=int, default=0, help="prefix cache capacity in tokens (LRU over blocks); 0 = unbounded"
    )
    args = ap.parse_args(argv)
    if args.block_size < 1 or args.cache_tokens < 0:
        ap.error("--block-size must be >= 1 and --cache-tokens >= 0")
    cfg = FakeServerConfig(
        ttft_ms=args.ttft_ms,
        itl_ms=args.itl_ms,
        tokens_per_chunk=args.tokens_per_chunk,
        default_max_tokens=args.default_max_tokens,
        role_chunk=not args.no_role_chunk,
        fault_every=json.loads(args.fault_every),
        hang_s=args.hang_s,
        tokenize_delay_s=args.tokenize_delay_s,
        block_size=args.block_size,
        cache_tokens=args.cache_tokens,
    )
    web.run_app(
        make_app(cfg),
        host="127.0.0.1",
        port=args.port,
        access_log=None,
        print=None,
        shutdown_timeout=1.0,
        handler_cancellation=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
