"""`kvtier replay` when the server misbehaves: failed runs, base URLs, a hanging /tokenize, broken SSE framing.

Every case runs the real CLI (or the real streaming client) against the fake server on 127.0.0.1 with the fault
injected there (replay/openai/fake_server.py `FAULTS`, `hang_s`, `tokenize_delay_s`).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import aiohttp
import pytest

from replay.cli import main as kvtier
from replay.openai import client
from replay.openai.client import RequestRecord, RequestSpec, send_streaming
from replay.openai.fake_server import FakeServer, FakeServerConfig


def main(argv: list[str]) -> int:
    """`kvtier replay ARGV`: through the dispatcher, which answers a refusal (exit 2, one line) and a bug."""
    return kvtier(["replay", *argv])


SMALL = ("--source", "synthetic", "--input-len", "4", "--output-len", "4")


def _run(base_url: str, tmp_path: Path, *extra: str, quiet: bool = True) -> tuple[int, dict]:
    out = tmp_path / "out.json"
    rc = main(
        ["--base-url", base_url, "--model", "fake", "--output", str(out), *(["--quiet"] if quiet else []), *extra]
    )
    return rc, (json.loads(out.read_text()) if out.exists() else {})


# ---------------------------------------------------------------- 1. a failed run says so
@pytest.mark.parametrize(
    "fault, kind", [("http_500", "http_500"), ("malformed_sse", "malformed_sse"), ("hang", "timeout")]
)
def test_run_where_every_request_fails_exits_1_with_errors_by_kind(fault, kind, tmp_path, capsys):
    with FakeServer(FakeServerConfig(fault_every={fault: 1}, hang_s=20)) as srv:
        t = time.monotonic()
        rc, s = _run(srv.base_url, tmp_path, *SMALL, "--num-requests", "6", "--request-timeout", "0.5", quiet=False)
        wall_s = time.monotonic() - t
    out, err = capsys.readouterr()
    assert rc == 1, err
    assert s["completed"] == 0 and s["errors_by_kind"] == {kind: 6}
    assert s["run_failed"].startswith(f"6 of 6 requests failed ({kind} 6)")
    assert f"run failed: 6 of 6 requests failed ({kind} 6)" in err and "Traceback" not in err
    assert f"errors: {kind} 6" in out  # the closing table says it too
    # The run's real wall time, not the span of timestamps the failed requests happened to get.
    assert s["duration_s"] <= wall_s
    if kind == "timeout":
        assert s["duration_s"] >= 0.45


@pytest.mark.parametrize("every, rc_expected", [({"http_500": 2}, 0), ({"http_500": 3, "http_503": 2}, 1)])
def test_exit_status_rule_more_failed_than_completed(every, rc_expected, tmp_path):
    with FakeServer(FakeServerConfig(fault_every=every)) as srv:
        rc, s = _run(srv.base_url, tmp_path, *SMALL, "--num-requests", "12")
    # 6 of 12 failed: not more than completed, exit 0; 8 of 12 (multiples of 2 or 3): exit 1.
    assert rc == rc_expected and s["failed"] == (6 if rc_expected == 0 else 8)
    assert (s["run_failed"] is None) == (rc_expected == 0)


@pytest.mark.slow
def test_window_cancellations_are_not_failures_but_nothing_completed_is(tmp_path):
    # Requests take 4 s; the window closes at 0.3 s and the 2 s grace cancels them: nothing completed, exit 1.
    with FakeServer(FakeServerConfig(ttft_ms=5, itl_ms=2000, default_max_tokens=3)) as srv:
        rc, s = _run(srv.base_url, tmp_path, *SMALL, "--num-requests", "3", "--duration", "0.3")
    assert rc == 1 and s["window_closed"] and s["errors_by_kind"] == {"cancelled": 3}
    assert s["run_failed"] == "no request completed (cancelled 3)"
    assert s["duration_s"] >= 2.0  # the grace the requests were given is part of the run


# ---------------------------------------------------------------- 2. base URL with or without /v1
@pytest.mark.parametrize("suffix", ["/v1", "/v1/", "/"])
def test_base_url_with_the_sdks_v1_suffix(suffix, tmp_path):
    with FakeServer() as srv:
        rc, s = _run(srv.base_url + suffix, tmp_path, *SMALL, "--num-requests", "4")
        seen = srv.requests_seen
    assert rc == 0 and s["completed"] == 4 and seen == 4
    assert s["base_url"] == srv.base_url
    assert s["prompt_text_from"] == "server:/tokenize"  # /tokenize found at the root, not under /v1


def test_wrong_base_url_path_exits_1_with_a_hint(tmp_path, capsys):
    with FakeServer() as srv:
        rc, s = _run(srv.base_url + "/api", tmp_path, *SMALL, "--num-requests", "3")
    err = capsys.readouterr().err
    assert rc == 1 and s["errors_by_kind"] == {"http_404": 3}
    assert "check --base-url" in err


def test_endpoint_url_as_base_url_is_a_usage_error(tmp_path, capsys):
    rc, _ = _run("http://127.0.0.1:9/v1/chat/completions", tmp_path, *SMALL)
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "server root" in err


# ---------------------------------------------------------------- 3. a hanging /tokenize
@pytest.mark.parametrize("flag, value", [("--request-timeout", "1"), ("--duration", "1")])
def test_hanging_tokenize_is_bounded_by_timeout_and_window(flag, value, tmp_path, capsys):
    with FakeServer(FakeServerConfig(tokenize_delay_s=120)) as srv:
        t = time.monotonic()
        rc, s = _run(srv.base_url, tmp_path, *SMALL, "--num-requests", "4", flag, value)
        took = time.monotonic() - t
    err = capsys.readouterr().err
    assert rc == 0 and s["completed"] == 4
    # 1 s of waiting for the tokenizer (and, with --duration, a 1 s window), not a fixed 30 s.
    assert took < 8, took
    assert s["prompt_text_from"].startswith("estimate")
    assert s["prompt_text_fallback_reason"] == "/tokenize did not answer within 1 s"
    lines = [x for x in err.splitlines() if "tokenizer" in x]
    assert lines == [
        "kvtier replay: server tokenizer not used (/tokenize did not answer within 1 s); prompt lengths "
        "are estimated at 4 characters per token"
    ]


# ---------------------------------------------------------------- 4. SSE framing, parsed in linear time
async def _stream(url: str, n_tokens: int) -> RequestRecord:
    async with aiohttp.ClientSession() as session:
        spec = RequestSpec(0, "s", 0, url, {"model": "f", "prompt": "a b", "max_tokens": n_tokens, "stream": True})
        return await send_streaming(session, spec, RequestRecord(0, "s", 0))


def test_stream_without_blank_lines_is_malformed_sse():
    cfg = FakeServerConfig(fault_every={"no_blank_lines": 1}, tokens_per_chunk=50)
    with FakeServer(cfg) as srv:
        rec = asyncio.run(_stream(srv.base_url + "/v1/completions", 5000))
    assert not rec.success and rec.error_kind == "malformed_sse"
    assert "no blank line" in rec.error


def _parse_cpu_s(n_bytes: int) -> float:
    """CPU seconds to parse `n_bytes` of `data:` lines with no blank line, fed in 1 KB reads (best of 3)."""
    line = b'data: {"choices":[{"index":0,"text":" tok"}]}\n'
    stream = line * (n_bytes // len(line))
    best = float("inf")
    for _ in range(3):
        reader = client._SSEReader()
        t = time.process_time()
        for i in range(0, len(stream), 1024):
            assert reader.feed(stream[i : i + 1024]) == []
        best = min(best, time.process_time() - t)
        assert reader.unterminated_bytes() > 0.8 * n_bytes
    return best


def test_sse_parsing_is_linear_in_the_stream_length():
    # 8x the bytes: linear parsing costs about 8x; re-scanning the buffer on each read cost about 64x.
    small, large = _parse_cpu_s(256 << 10), _parse_cpu_s(2 << 20)
    assert large < 20 * small, (small, large)


def test_sse_reader_framing():
    r = client._SSEReader()
    assert r.feed(b'data: {"a"') == []
    assert r.feed(b":1}\r\n\r\n: ping\n\nevent: x\ndata: one\ndata: two\n\ndata: [DONE]\n") == [b'{"a":1}', b"one\ntwo"]
    assert r.feed(b"\n") == [b"[DONE]"] and r.unterminated_bytes() == 0


def test_help_states_the_exit_status_rule(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "exit status:" in out and "more failed than completed" in out and "trailing /v1" in out
