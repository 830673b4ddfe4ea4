"""`kvtier replay` against servers that never stop or answer oddly: every request ends (the asked tokens plus a margin,
--request-max-time however the data trickles), a compressed stream is decoded and plain is asked for, /metrics
problems are one warning line and the run goes on, a body of /metrics is capped, and Ctrl-C while set-up waits on
the server ends the run at once. The servers are real HTTP servers on 127.0.0.1 (one thread each), the CLI the real
one, signals real.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from helpers import QuietHTTPServer

from replay.cli import main as kvtier
from replay.common.ports import free_port
from replay.openai.fake_server import FakeServer


def main(argv: list[str]) -> int:
    """`kvtier replay ARGV`: through the dispatcher, which answers a refusal (exit 2, one line) and a bug."""
    return kvtier(["replay", *argv])


SMALL = ("--source", "synthetic", "--input-len", "4", "--output-len", "4", "--quiet")


def _chunk(i: int) -> bytes:
    obj = {"choices": [{"index": 0, "delta": {"content": f" t{i}"}, "finish_reason": None}]}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _answer(n: int) -> bytes:
    return b"".join(_chunk(i) for i in range(n)) + b"data: [DONE]\n\n"


class OddServer:
    """POST /v1/chat/completions answers as `mode` says; /metrics as `metrics` says; the rest 404."""

    def __init__(self, mode: str = "ok", metrics: str = "ok") -> None:
        self.mode, self.metrics, self.headers_seen = mode, metrics, []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):
                if self.path != "/metrics":
                    return self._plain(404, b"no")
                body = {
                    "ok": b"vllm:prompt_tokens_total 5\n",
                    "bad_utf8": b"vllm:prompt_tokens_total 5\n# \xff\xfe\xfd\n",
                    "huge": b"# " + b"x" * (17 << 20) + b"\n",
                    "404": None,
                }[outer.metrics]
                if body is None:
                    return self._plain(404, b"not here")
                self._plain(200, body)

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if not self.path.endswith("/chat/completions"):
                    return self._plain(404, b"no")
                outer.headers_seen.append(dict(self.headers))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                mode = outer.mode
                if mode in ("gzip", "deflate"):
                    raw = _answer(4)
                    body = gzip.compress(raw) if mode == "gzip" else zlib.compress(raw)
                    self.send_header("Content-Encoding", mode)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                self.send_header("Connection", "close")
                self.end_headers()
                try:
                    i = 0
                    while True:  # never ends by itself: the client must
                        if mode == "endless":
                            self.wfile.write(_chunk(i))
                        elif mode == "keepalive":
                            self.wfile.write(b": keepalive\n\n")
                            time.sleep(0.05)
                        elif mode == "trickle":
                            self.wfile.write(_chunk(0)[i % 10 : i % 10 + 1] if i < 10 else b" ")
                            time.sleep(0.1)
                        elif mode == "usage_endless":  # cumulative usage past max_tokens, a chunk at a time
                            obj = {"choices": [{"delta": {"content": "x"}}], "usage": {"completion_tokens": i + 1}}
                            self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
                        self.wfile.flush()
                        i += 1
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def _plain(self, status, body):
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):  # the client read no more of it (the cap)
                    pass

        self.httpd = QuietHTTPServer(Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> OddServer:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _replay(base_url: str, tmp_path: Path, *extra: str) -> tuple[int, dict]:
    out = tmp_path / "out.json"
    rc = main(["--base-url", base_url, "--model", "m", "--output", str(out), *SMALL, *extra])
    return rc, (json.loads(out.read_text()) if out.exists() else {})


# ---- a stream that never ends ends -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "mode, kind",
    [
        ("endless", "overlong_stream"),  # tokens past max_tokens, as fast as the server can
        ("usage_endless", "overlong_stream"),  # the same counted by cumulative usage
        ("keepalive", "timeout"),  # only ': keepalive' comments: never idle, never done
        ("trickle", "timeout"),  # one byte every 0.1 s
    ],
)
@pytest.mark.slow
def test_an_endless_stream_ends_the_request(tmp_path, mode, kind):
    with OddServer(mode) as srv:
        t0 = time.monotonic()
        rc, s = _replay(srv.base_url, tmp_path, "--num-requests", "2", "--request-max-time", "1.5")
        took = time.monotonic() - t0
    assert rc == 1 and s["errors_by_kind"] == {kind: 2}, s.get("errors_by_kind")
    assert took < 20, took  # each request ends within its 1.5 s (or at max_tokens + margin), not never


def test_plain_is_asked_and_a_compressed_answer_is_decoded(tmp_path):
    for mode in ("gzip", "deflate"):
        with OddServer(mode) as srv:
            rc, s = _replay(srv.base_url, tmp_path, "--num-requests", "3")
        assert rc == 0 and s["completed"] == 3, (mode, s.get("errors_by_kind"))
        assert {h.get("Accept-Encoding") for h in srv.headers_seen} == {"identity"}


# ---- --metrics-url problems: one warning line, the run goes on ------------------------------------------------------
@pytest.mark.parametrize("metrics, said", [("404", "HTTP 404"), ("bad_utf8", "not UTF-8"), ("huge", "over 16 MiB")])
def test_metrics_url_problems_warn_once_and_the_run_goes_on(tmp_path, capsys, metrics, said):
    with FakeServer() as srv, OddServer(metrics=metrics) as m:
        rc, s = _replay(srv.base_url, tmp_path, "--num-requests", "3", "--metrics-url", m.base_url + "/metrics")
    err = capsys.readouterr().err
    assert rc == 0 and s["completed"] == 3
    warnings = [line for line in err.splitlines() if "--metrics-url" in line]
    assert len(warnings) == 1 and said in warnings[0] and m.base_url in warnings[0], err
    assert "Traceback" not in err


def test_metrics_url_refused_warns_and_the_run_goes_on(tmp_path, capsys):
    dead = f"http://127.0.0.1:{free_port()}/metrics"  # a port nothing listens on
    with FakeServer() as srv:
        rc, s = _replay(srv.base_url, tmp_path, "--num-requests", "2", "--metrics-url", dead)
    err = capsys.readouterr().err
    assert rc == 0 and s["completed"] == 2
    assert sum("--metrics-url" in line and dead in line for line in err.splitlines()) == 1, err


# ---- Ctrl-C while set-up waits on the server ------------------------------------------------------------------------
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.slow
def test_a_signal_during_the_tokenize_probe_ends_the_run_at_once(tmp_path, sig):
    # A server that accepts and never answers: the /tokenize probe would wait its 30 s budget but for the signal.
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(64)
    accepted = threading.Event()
    held = []

    def accept():
        while True:
            try:
                conn, _ = lst.accept()
            except OSError:
                return
            held.append(conn)
            accepted.set()

    threading.Thread(target=accept, daemon=True).start()
    url = f"http://127.0.0.1:{lst.getsockname()[1]}"
    out = tmp_path / "out.json"
    cmd = [sys.executable, "-m", "replay.cli", "replay", "--base-url", url, "--model", "m", "--output", str(out)]
    proc = subprocess.Popen(
        [*cmd, *SMALL, "--num-requests", "2"], stderr=subprocess.PIPE, text=True, env=dict(os.environ)
    )
    try:
        assert accepted.wait(60), "replay never connected"
        t0 = time.monotonic()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=15)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        lst.close()
        for c in held:
            c.close()
    assert proc.returncode == 128 + sig, err
    assert took < 10, took  # not the probe's 30 s
    assert "Traceback" not in err and json.loads(out.read_text())["completed"] == 0


# ---- the client's own limit is said to be the client's --------------------------------------------------------------
@pytest.mark.slow
def test_the_clients_fd_limit_is_reported_as_the_clients(tmp_path):
    import resource

    from replay.openai.fake_server import FakeServerConfig

    out = tmp_path / "out.json"
    with FakeServer(FakeServerConfig(ttft_ms=1500, default_max_tokens=2)) as srv:
        cmd = [sys.executable, "-m", "replay.cli", "replay", "--base-url", srv.base_url, "--model", "m"]
        r = subprocess.run(
            [*cmd, "--output", str(out), *SMALL, "--users", "200", "--num-requests", "200"],
            capture_output=True,
            text=True,
            timeout=120,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64)),  # 200 sockets cannot open
        )
    s = json.loads(out.read_text())
    assert s["errors_by_kind"].get("client_limit", 0) > 0 and "connection" not in s["errors_by_kind"], s
    assert "server unreachable" not in r.stderr and "Traceback" not in r.stderr
    assert "RLIMIT_NOFILE, is 64" in r.stderr and "ulimit -n" in r.stderr, r.stderr


# ---- a --base-url no request can go to -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "url, said",
    [
        ("http://127.0.0.1:99999", "Port out of range"),
        ("http://127.0.0.1:65536", "Port out of range"),
        ("http://127.0.0.1:0", "port 0"),
        ("http://127.0.0.1:-1", "Port could not be cast"),
        ("http://127.0.0.1:abc", "Port could not be cast"),
        ("http://:8000", "no host"),
        ("http://[::1", "Invalid IPv6 URL"),
        ("http://127.0.0.1:8000/?a=1", "no query or fragment"),
        ("http://127.0.0.1:8000#x", "no query or fragment"),
    ],
)
def test_a_base_url_no_request_can_reach_is_a_usage_error(tmp_path, capsys, url, said):
    out = tmp_path / "out.json"
    assert main(["--base-url", url, "--model", "m", "--output", str(out), *SMALL]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--base-url" in err[0] and said in err[0], err
    assert not out.exists()
