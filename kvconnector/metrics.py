"""Prometheus exporter for a kvtier backend (prefix `kvtier_`), bound to 127.0.0.1 unless configured otherwise.

Metrics are computed at scrape time from the backend's own statistics (nothing is recorded twice on the I/O path):
- `kvtier_op_duration_seconds{tier,op,part}`: histogram of total, host and device time per tier and op (read/write),
  bucketed from the mergeable HDR histograms;
- `kvtier_ops_total`, `kvtier_bytes_total{tier,op}`;
- `kvtier_tier_events_total{tier,event}`: hits, demotions_in/out, evictions, adopted, vanished, corrupt_dropped,
  enospc, rescan_*, spare_writes (stores that overwrote an evicted entry's file in place) ...;
  `kvtier_fallbacks_total{tier,reason}` (O_DIRECT unavailable and other degradations);
- `kvtier_backend_events_total{event}`: lookup_hits/misses, load_hits/misses, store_ok, store_refused_full, ...;
- `kvtier_tier_used_bytes`, `kvtier_tier_capacity_bytes`, `kvtier_tier_entries{tier}`.

The events a hit rate is computed from (`*_EVENTS_FROM_ZERO`) are exported at 0 before they first happen: Prometheus's
rate() and increase() take a series' first sample as its start, so a counter that appears only at its first event
loses that first increment (prometheus.io/docs/practices/instrumentation/, "Avoid missing metrics").
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

log = logging.getLogger(__name__)

BUCKETS_S = (
    25e-6,
    50e-6,
    100e-6,
    250e-6,
    500e-6,
    1e-3,
    2.5e-3,
    5e-3,
    10e-3,
    25e-3,
    50e-3,
    100e-3,
    250e-3,
    500e-3,
    1.0,
    2.5,
    5.0,
    10.0,
)


def _buckets(hist) -> tuple[list[tuple[str, float]], float]:
    """Cumulative Prometheus buckets and the sum (seconds) from a LatencyHistogram."""
    count = hist.count
    counts = hist.cumulative_counts([b * 1e9 for b in BUCKETS_S])
    out = [(repr(b), c) for b, c in zip(BUCKETS_S, counts)] + [("+Inf", count)]
    return out, hist.mean_ms() * count / 1e3


# per tier, and for the backend: the events deploy/prometheus/kvtier-rules.yml divides
TIER_EVENTS_FROM_ZERO = ("hits",)
BACKEND_EVENTS_FROM_ZERO = ("lookup_hits", "lookup_misses", "load_hits", "load_misses", "store_ok")


class BackendCollector:
    def __init__(self, backend) -> None:
        self.backend = backend

    def collect(self):
        b = self.backend
        dur = HistogramMetricFamily(
            "kvtier_op_duration_seconds", "Time per tier operation, total/host/device", labels=["tier", "op", "part"]
        )
        ops = CounterMetricFamily("kvtier_ops", "Tier operations", labels=["tier", "op"])
        nbytes = CounterMetricFamily("kvtier_bytes", "Bytes moved by tier operations", labels=["tier", "op"])
        events = CounterMetricFamily("kvtier_tier_events", "Per-tier events", labels=["tier", "event"])
        fallbacks = CounterMetricFamily("kvtier_fallbacks", "Fallbacks and degradations", labels=["tier", "reason"])
        used = GaugeMetricFamily("kvtier_tier_used_bytes", "Bytes accounted in the tier", labels=["tier"])
        cap = GaugeMetricFamily("kvtier_tier_capacity_bytes", "Tier capacity", labels=["tier"])
        entries = GaugeMetricFamily("kvtier_tier_entries", "Entries in the tier", labels=["tier"])
        bev = CounterMetricFamily("kvtier_backend_events", "Backend events (lookups, loads, stores)", labels=["event"])
        for tier, st in zip(b.store.tiers, b.store.stats):
            for op_name, op in (("read", st.read), ("write", st.write)):
                for part, hist in (("total", op.total), ("host", op.host), ("device", op.device)):
                    buckets, sum_s = _buckets(hist)
                    dur.add_metric([tier.name, op_name, part], buckets, sum_s)
                ops.add_metric([tier.name, op_name], op.ops)
                nbytes.add_metric([tier.name, op_name], op.nbytes)
            tier_events = dict.fromkeys(TIER_EVENTS_FROM_ZERO, 0) | dict(st.events + tier.counters)
            for ev, n in sorted(tier_events.items()):
                events.add_metric([tier.name, ev], n)
            for reason, n in sorted(tier.fallbacks.items()):
                fallbacks.add_metric([tier.name, reason], n)
        for u in b.store.usage():
            used.add_metric([u["tier"]], u["used_bytes"])
            cap.add_metric([u["tier"]], u["capacity_bytes"])
            entries.add_metric([u["tier"]], u["entries"])
        for ev, n in sorted((dict.fromkeys(BACKEND_EVENTS_FROM_ZERO, 0) | dict(b.events_snapshot())).items()):
            bev.add_metric([ev], n)
        yield from (dur, ops, nbytes, events, fallbacks, used, cap, entries, bev)


class MetricsExporter:
    """An HTTP /metrics endpoint for one backend, on its own registry (so several backends in one process, as in the
    tests, do not collide). `port=0` picks a free port; `self.port` is the one bound."""

    def __init__(self, backend, host: str = "127.0.0.1", port: int = 0) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(BackendCollector(backend))
        self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        self.host = host
        self.port = self._server.server_address[1]
        if host not in ("127.0.0.1", "localhost", "::1"):
            log.warning("kvtier metrics exporter listens on %s:%d (not loopback), as configured", host, self.port)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
