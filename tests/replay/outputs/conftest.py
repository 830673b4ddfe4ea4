"""Results documents for the output writers: the real sample of `kvtier bench`, and a variant with the sections a
QoS / autoscaling / multi-client run adds (built here from real histograms, so its numbers are consistent)."""

import copy
import json
import random
from pathlib import Path

import pytest

from kvconnector.histogram import LatencyHistogram

SAMPLE = Path(__file__).resolve().parents[1] / "fixtures" / "bench_result_sample.json"


def load_sample() -> dict:
    return json.loads(SAMPLE.read_text())


def _hists(rng: random.Random, median_ms: float, n: int) -> tuple[LatencyHistogram, LatencyHistogram]:
    """(end to end, service): service is lognormal around the median, end to end adds 20-60% generation time."""
    e2e, svc = LatencyHistogram(), LatencyHistogram()
    for _ in range(n):
        service_ns = int(rng.lognormvariate(0, 0.6) * median_ms * 1e6)
        svc.record_ns(service_ns)
        e2e.record_ns(int(service_ns * rng.uniform(1.2, 1.6)))
    return e2e, svc


def make_full_doc() -> dict:
    """The sample plus summary.qos_metrics, prefix_cache_stats, rag_stats, autoscaling_stats, clients, users."""
    doc = load_sample()
    rng = random.Random(7)
    qos = {}
    for name, prio, median, n, t95, t99 in (
        ("interactive", 3, 200.0, 40, 1000.0, 2000.0),
        ("batch", 1, 1500.0, 15, 5000.0, 8000.0),
        ("standard", 2, 1200.0, 25, 1500.0, 2500.0),
    ):
        e2e, svc = _hists(rng, median, n)
        met = svc.percentile_ms(95) <= t95 and svc.percentile_ms(99) <= t99
        qos[name] = {
            "requests": n,
            "priority": prio,
            "end_to_end_latency_ms": e2e.summary_ms(),
            "service_latency_ms": svc.summary_ms(),
            "sla": {"target_p95_ms": t95, "target_p99_ms": t99, "met": met},
            "histograms": {"end_to_end": e2e.encode(), "service": svc.encode()},
        }
    doc["summary"]["qos_metrics"] = qos
    doc["summary"]["prefix_cache_stats"] = {"hits": 120, "misses": 30, "hit_rate": 0.8, "bytes_saved_gb": 3.25}
    doc["summary"]["rag_stats"] = {"queries": 40, "chunk_reads": 200, "chunk_hits": 150, "hit_rate": 0.75}
    users, steps = 10, []
    for i in range(12):
        t = 2.0 * (i + 1)
        action = "scale_up" if i < 7 else "peak_found" if i == 7 else "hold"
        nxt = users + 10 if action == "scale_up" else users
        steps.append(
            {
                "t_s": t,
                "users": users,
                "throughput_tokens_per_sec": round(1000.0 * min(users, 60) ** 0.8, 1),
                "saturation": round(min(1.0, users / 80), 3),
                "action": action,
                "reason": f"saturation {min(1.0, users / 80):.0%}",
                "next_users": nxt,
            }
        )
        users = nxt
    doc["autoscaling_stats"] = steps
    for i, s in enumerate(doc["timeline"]):
        s["users"] = 10 + i
    client = copy.deepcopy(load_sample())
    client["client_id"] = "client-0"
    doc["clients"] = [client, {**copy.deepcopy(client), "client_id": "client-1"}]
    return doc


@pytest.fixture
def sample_doc() -> dict:
    return load_sample()


@pytest.fixture(scope="session")
def _full_doc_once() -> dict:
    return make_full_doc()  # ~0.5 s (hdrh's mean walks every bucket in Python), so built once


@pytest.fixture
def full_doc(_full_doc_once) -> dict:
    return copy.deepcopy(_full_doc_once)
