"""The control endpoint of a mounted throttlefs (127.0.0.1 only), and a small client for it.

GET  /settings   the settings in force, JSON (`read_bw_bytes_s`, `read_lat_ms`, ...)
PUT  /settings   change some while mounted: a JSON object with the flag names (`{"bw": "250MB/s", "lat_ms": 1}`);
                 answers the settings now in force, or 400 with {"error": one line} and nothing changed
GET  /stats      counters since the mount, JSON: per operation ops, bytes, bw_wait_ns, lat_ns, hold_error_ns, errors
GET  /metrics    the same as Prometheus metrics (throttlefs_*)
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .fs import Throttle
from .settings import SettingError, apply_changes

MAX_BODY_BYTES = 64 * 1024


class ThrottleCollector:
    """Prometheus collector reading the throttle's counters at scrape time (nothing is done per operation)."""

    def __init__(self, throttle: Throttle) -> None:
        self.t = throttle

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        snap = self.t.snapshot()
        ops = CounterMetricFamily("throttlefs_ops", "operations done through the mount", labels=["op"])
        nbytes = CounterMetricFamily("throttlefs_bytes", "bytes moved by reads and writes", labels=["op"])
        bw = CounterMetricFamily(
            "throttlefs_bandwidth_wait_seconds", "time operations were held for the bandwidth cap", labels=["op"]
        )
        lat = CounterMetricFamily("throttlefs_added_latency_seconds", "latency added to operations", labels=["op"])
        err = CounterMetricFamily("throttlefs_errors", "operations the backing directory failed", labels=["op"])
        late = GaugeMetricFamily(
            "throttlefs_hold_error_seconds",
            "time held beyond (+) or short of (-) what was asked, summed",
            labels=["op"],
        )
        for op, c in snap["ops"].items():
            ops.add_metric([op], c["ops"])
            nbytes.add_metric([op], c["bytes"])
            bw.add_metric([op], c["bw_wait_ns"] / 1e9)
            lat.add_metric([op], c["lat_ns"] / 1e9)
            err.add_metric([op], c["errors"])
            late.add_metric([op], c["hold_error_ns"] / 1e9)
        bounce = CounterMetricFamily(
            "throttlefs_direct_bounces",
            "O_DIRECT transfers copied through an aligned buffer",
            value=snap["direct_bounces"],
        )
        setting = GaugeMetricFamily("throttlefs_setting", "settings in force (bytes/s, ms; 0 = off)", labels=["name"])
        for name, value in snap["settings"].items():
            setting.add_metric([name], value)
        yield from (ops, nbytes, bw, lat, err, late, bounce, setting)


def make_server(throttle: Throttle, port: int) -> ThreadingHTTPServer:
    """Bound to 127.0.0.1:port (0 = any free port); serve_forever() in a daemon thread."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(ThrottleCollector(throttle))
    change_lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt, *args):  # no line per request on the server's stderr
            pass

        def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _json(self, code: int, doc: Any) -> None:
            self._send(code, json.dumps(doc, indent=1).encode() + b"\n")

        def do_GET(self):
            if self.path == "/settings":
                self._json(200, throttle.settings.to_json())
            elif self.path == "/stats":
                self._json(200, throttle.snapshot())
            elif self.path == "/metrics":
                self._send(200, generate_latest(registry), "text/plain; version=0.0.4")
            else:
                self._json(404, {"error": f"no {self.path} (try /settings, /stats, /metrics)"})

        def do_PUT(self):
            if self.path != "/settings":
                self._json(404, {"error": f"no {self.path} to change (PUT /settings)"})
                return
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                self._json(413, {"error": f"body over {MAX_BODY_BYTES} bytes"})
                return
            try:
                changes = json.loads(self.rfile.read(length) or b"{}")
                if not isinstance(changes, dict):
                    raise SettingError("the body must be a JSON object of settings")
                with change_lock:  # two concurrent changes never lose one another's keys
                    new = apply_changes(throttle.settings, changes)
                    throttle.set_settings(new)
            except (SettingError, json.JSONDecodeError) as exc:
                self._json(400, {"error": str(exc)})
                return
            self._json(200, new.to_json())

        do_POST = do_PUT

    return ThreadingHTTPServer(("127.0.0.1", port), Handler)


class ControlError(RuntimeError):
    pass


class Client:
    """Talks to a mount's control endpoint: `Client(url).set(lat_ms=1, bw="250MB/s")`, `.stats()`, `.settings()`."""

    def __init__(self, url: str, timeout_s: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def _call(self, method: str, path: str, doc: dict | None = None) -> dict:
        data = None if doc is None else json.dumps(doc).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            try:
                msg = json.loads(exc.read()).get("error", str(exc))
            except ValueError:
                msg = str(exc)
            raise ControlError(msg) from exc
        except (urllib.error.URLError, OSError) as exc:
            raise ControlError(f"{self.url}: {exc}") from exc

    def settings(self) -> dict:
        return self._call("GET", "/settings")

    def set(self, **changes) -> dict:
        return self._call("PUT", "/settings", changes)

    def stats(self) -> dict:
        return self._call("GET", "/stats")

    def metrics_text(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=self.timeout_s) as resp:
            return resp.read().decode()
