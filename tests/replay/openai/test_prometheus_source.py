"""`--metrics-url prometheus+http://...`: the server's counters read from a real Prometheus (Debian's 2.42) that
scrapes a real prometheus_client exporter, against the same exporter scraped directly. The full stack (vLLM, LMCache,
kvtier) behind a Prometheus is tests/e2e/test_prometheus_stack.py."""

from __future__ import annotations

import asyncio
import http.server
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import aiohttp
import pytest
import yaml
from helpers import QuietHTTPServer, free_port, wait_for
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest

from replay.openai.config import ReplayConfig
from replay.openai.prometheus_source import parse_prometheus_url
from replay.openai.server_metrics import derive, scrape

INTERVAL_S = 0.2


def test_url_forms():
    p = parse_prometheus_url("prometheus+http://127.0.0.1:9090/")
    assert (p.base, p.matchers) == ("http://127.0.0.1:9090", "")
    p = parse_prometheus_url('prometheus+https://prom.example/sub/?match={job=~"vllm|kvtier", env="a"}')
    assert p.base == "https://prom.example/sub"
    assert p.selector() == '{__name__=~"vllm:.+|lmcache.+|kvtier_.+", job=~"vllm|kvtier", env="a"}'


@pytest.mark.parametrize(
    "url, message",
    [
        ("prometheus+ftp://h:1", "a Prometheus URL is prometheus+http://HOST:PORT"),
        ("prometheus+http://", "a Prometheus URL is prometheus+http://HOST:PORT"),
        ("prometheus+http://h:1?job=vllm", "the only query parameter of a Prometheus URL is one match="),
        ("prometheus+http://h:1?match=job", "match= takes PromQL label matchers in braces"),
        ("prometheus+http://h:1?match={}", "match= takes PromQL label matchers in braces"),
        ("h:8000/metrics", "--metrics-url is a /metrics page (http://HOST:PORT/metrics) or a Prometheus"),
    ],
)
def test_a_bad_metrics_url_is_refused_before_the_run(url, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        ReplayConfig(base_url="http://127.0.0.1:1", model="m", output="o.json", metrics_url=[url])


@pytest.mark.slow
def test_a_bad_metrics_url_is_one_line_and_exit_2(tmp_path):
    cmd = ["-m", "replay.cli", "replay", "--base-url", "http://127.0.0.1:1", "--model", "m", "--num-requests", "1"]
    cmd += ["--metrics-url", "prometheus+ftp://h:1", "--output", str(tmp_path / "o.json")]
    p = subprocess.run([sys.executable, *cmd], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("\n") == 1 and "prometheus+http://HOST:PORT" in p.stderr, p.stderr
    assert not (tmp_path / "o.json").exists()


@pytest.fixture
def exporter_and_prometheus(tmp_path):
    """A prometheus_client exporter with the counters derive() reads, and a Prometheus scraping it every 0.2 s."""
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus not installed (apt-get install prometheus)")
    reg = CollectorRegistry()
    tokens = Counter("vllm:prompt_tokens_by_source", "", ["source"], registry=reg)
    kv = Counter("kvtier_bytes", "", ["tier", "op"], registry=reg)
    other = Counter("python_unrelated", "", registry=reg)  # not a vLLM/LMCache/kvtier series: never read
    for s in ("local_compute", "external_kv_transfer"):
        tokens.labels(s).inc(1000)
    kv.labels("disk", "write").inc(4096)

    class Page(http.server.BaseHTTPRequestHandler):
        """Text format 0.0.4 whatever Prometheus asks, as vLLM serves it: prometheus_client's own server answers
        Prometheus's OpenMetrics Accept with names escaped (vllm:x stored as vllm_x), which vLLM's does not."""

        def do_GET(self):
            body = generate_latest(reg)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = QuietHTTPServer(Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    target = f"127.0.0.1:{server.server_address[1]}"
    port = free_port()
    cfg = {
        "global": {"scrape_interval": f"{int(INTERVAL_S * 1000)}ms", "scrape_timeout": f"{int(INTERVAL_S * 1000)}ms"},
        "scrape_configs": [{"job_name": "fake", "static_configs": [{"targets": [target]}]}],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    log = open(tmp_path / "prometheus.log", "wb")
    cmd = ["prometheus", "--config.file", str(tmp_path / "prometheus.yml"), "--storage.tsdb.path", str(tmp_path / "d")]
    cmd += ["--web.listen-address", f"127.0.0.1:{port}"]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"

    def scraped() -> bool:
        assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
        try:
            with urllib.request.urlopen(base + "/api/v1/query?query=up", timeout=2) as r:
                return '"1"]' in r.read().decode()
        except OSError:
            return False

    try:
        wait_for(scraped, 60, 0.2, what="Prometheus's first scrape of the exporter")
        yield {"tokens": tokens, "kv": kv, "other": other, "direct": f"http://{target}/metrics", "prom": base}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
        log.close()
        server.shutdown()
        server.server_close()


@pytest.mark.e2e
@pytest.mark.timeout(180)
def test_prometheus_gives_the_same_figures_as_the_page(exporter_and_prometheus):
    env = exporter_and_prometheus
    prom, direct = "prometheus+" + env["prom"], env["direct"]

    async def window() -> tuple[dict, dict, float]:
        async with aiohttp.ClientSession() as s:
            a_prom, a_page = await scrape(s, [prom]), await scrape(s, [direct])
            env["tokens"].labels("external_kv_transfer").inc(3000)
            env["tokens"].labels("local_compute").inc(1000)
            env["kv"].labels("disk", "read").inc(8192)
            env["kv"].labels("shared", "write").inc(512)  # a series born inside the window counts from zero
            env["other"].inc(5)
            b_page = await scrape(s, [direct])
            t0 = time.monotonic()
            b_prom = await scrape(s, [prom])  # right after the change: it waits for Prometheus's next scrape
            waited = time.monotonic() - t0
        assert not (a_prom.errors or b_prom.errors), (a_prom.errors, b_prom.errors)
        return derive(a_prom, b_prom), derive(a_page, b_page), waited

    from_prom, from_page, waited = asyncio.run(window())
    for k in ("interval_s",):
        from_prom.pop(k), from_page.pop(k)
    assert from_prom == from_page
    assert from_prom["hit_rate"] == 0.75 and from_prom["prompt_tokens_by_source"]["external_kv_transfer"] == 3000
    assert from_prom["kv_bytes_by_tier"] == {"disk": {"read": 8192, "write": 0}, "shared": {"write": 512}}
    assert waited < 30  # a few scrape intervals; 30 s is the reading's own bound


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_no_matching_series_and_an_unreachable_prometheus_are_errors_not_figures(exporter_and_prometheus):
    base = exporter_and_prometheus["prom"]

    async def read(url: str):
        async with aiohttp.ClientSession() as s:
            return await scrape(s, [url])

    none = asyncio.run(read(f'prometheus+{base}?match={{job="not-scraped"}}'))
    assert not none.values and "no series matching" in none.errors[0]
    gone = asyncio.run(read(f"prometheus+http://127.0.0.1:{free_port()}"))
    assert not gone.values and "ClientConnectorError" in gone.errors[0]
    page = asyncio.run(read(base + "/metrics"))  # Prometheus's own /metrics page: not one of our series
    assert page.values and not any(n.startswith(("vllm:", "kvtier_")) for n, _ in page.values)
