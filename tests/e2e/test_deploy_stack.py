"""deploy.stack's parts that need no running stack: its metrics read, the pids file, clearing L1 over HTTP."""

from __future__ import annotations

import http.server
import threading
import urllib.error

import pytest
from helpers import QuietHTTPServer

from deploy import RUN_STACK
from deploy.stack import clear_l1_at, metric, metrics, pid_of

EXPOSITION = b"""# TYPE kvtier_tier_events_total counter
kvtier_tier_events_total{event="hit",tier="disk"} 3.0
kvtier_tier_events_total{event="hit",tier="cpu"} 4.0
kvtier_tier_events_total{event="miss",tier="disk"} 5.0
# TYPE vllm:external_prefix_cache_hits counter
vllm:external_prefix_cache_hits_total{model_name="a} b"} 7.0
"""


@pytest.fixture
def server():
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(EXPOSITION)

        def do_POST(self):
            seen.append(self.path)
            self.send_response(200 if self.path == "/cache/clear" else 500)
            self.end_headers()

        def log_message(self, *a):
            pass

    httpd = QuietHTTPServer(Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", seen
    httpd.shutdown()


def test_metric_sums_the_series_whose_labels_match(server):
    url, _ = server
    m = metrics(url + "/metrics")
    assert metric(m, "kvtier_tier_events_total", event="hit") == 7.0
    assert metric(m, "kvtier_tier_events_total", event="hit", tier="disk") == 3.0
    assert metric(m, "kvtier_tier_events_total") == 12.0
    # a label value holding "}" (a hand split on "{" got this wrong)
    assert metric(m, "vllm:external_prefix_cache_hits_total", model_name="a} b") == 7.0


def test_clear_l1_posts_cache_clear(server):
    url, seen = server
    clear_l1_at(url)
    assert seen == ["/cache/clear"]
    with pytest.raises(urllib.error.HTTPError):
        clear_l1_at(url + "/wrong")


def test_pid_of_reads_the_last_recorded_pid(tmp_path):
    (tmp_path / "pids").write_text("vllm 10\nlmcache 11\nvllm 12\n")
    assert pid_of(tmp_path, "vllm") == 12
    with pytest.raises(KeyError):
        pid_of(tmp_path, "kvtier")


def test_run_stack_comes_with_the_package():
    assert RUN_STACK.is_file() and RUN_STACK.name == "run-stack.sh"
