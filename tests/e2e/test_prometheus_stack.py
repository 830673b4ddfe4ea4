"""End to end: `run-stack.sh up --prometheus` (Debian's prometheus scraping a real vLLM, LMCache and kvtier every
second), two short `kvtier replay` runs, then Prometheus's HTTP API against the exporters' own counters.

The stack is the one this module shares with test_lmcache_stack.py (conftest.py's `disk_stack`: a 1 GB disk tier,
Prometheus every second). This module runs on it first (marked fresh_disk_stack): kvtier has read nothing from its
disk yet, so every read-latency bucket enters the window at zero, where rate() does not extrapolate back past a
series' first sample; a bucket already counting would be extrapolated further than one at zero, and the quantiles
of the rules would no longer be those of the buckets' increases. The checks in file order:
1. a replay fills kvtier (prompts computed, chunks stored), LMCache's L1 is cleared, the same replay again reads
   them back from kvtier's disk tier, its server-side figures read from the Prometheus (`--metrics-url
   prometheus+http://...`): they equal the figures of the exporters' /metrics pages scraped directly around it;
2. the recording rules against the increase of the exporters' counters over the same window: the rules as evaluated
   when their 1m window starts in an idle stretch after a warm-up request (LMCache creates its lookup counters at
   the first lookup, and rate() takes a series' first sample as its start) and holds both replays: bytes and
   operations per tier, the hit ratios per tier (vLLM's sources, LMCache's L1/L2, kvtier's tiers), read-latency
   quantiles computed from the bucket increases as histogram_quantile does; tolerance only for the scrapes' timing
   (rate() extrapolates to the window's edges by up to one scrape interval);
3. every query of the Grafana dashboard returns data, and its instance variable's values are the stack's instances;
4. `status` names the Prometheus and `down` stops it (run after every other test of the shared stack, marked
   stops_disk_stack).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from datetime import datetime
from types import SimpleNamespace

import pytest
from kvtier_stack import PROMETHEUS_INTERVAL_S, clear_l1, complete, metrics, prompt_text, wait_for

from deploy import RUN_STACK, SCRIPTS
from kvconnector.metrics import BUCKETS_S
from replay.openai.server_metrics import Snapshot, derive

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.xdist_group("disk_stack"),  # on the worker that runs test_lmcache_stack.py: one shared stack
    pytest.mark.fresh_disk_stack,
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        shutil.which("prometheus") is None, reason="prometheus not installed (apt-get install prometheus)"
    ),
]

INTERVAL_S = PROMETHEUS_INTERVAL_S
WINDOW_S = 60.0  # the rules' rate window ([1m], deploy/prometheus/kvtier-rules.yml)
# rate() extrapolates the sampled span to the window's edges: at most one scrape interval at each end
RATE_TOL = 2.5 * INTERVAL_S / WINDOW_S + 0.01


def _api(base: str, path: str, **params: str) -> object:
    url = f"{base}/api/v1/{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=30) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]


def _query(base: str, promql: str, at: float | None = None) -> list[dict]:
    params = {"query": promql} | ({"time": f"{at:.3f}"} if at is not None else {})
    return _api(base, "query", **params)["result"]


def _prom_now(base: str) -> float:
    return float(_query(base, "time()")[0])


def _direct(stack) -> Snapshot:
    """One scrape of every exporter's /metrics page, as kvtier replay merges them."""
    inst = stack.inst(0)
    values: dict = {}
    for url in (inst["vllm"] + "/metrics", inst["lmcache_metrics"], inst["kvtier_metrics"]):
        for k, v in metrics(url).items():
            values[k] = values.get(k, 0.0) + v
    return Snapshot(time.perf_counter_ns(), values)


def _inc(a: Snapshot, b: Snapshot, name: str, **labels: str) -> float:
    """Increase of the sum of `name`'s series whose labels include `labels`."""

    def total(s: Snapshot) -> float:
        return sum(v for (n, ls), v in s.values.items() if n == name and labels.items() <= dict(ls).items())

    return total(b) - total(a)


def _quantile(q: float, a: Snapshot, b: Snapshot, **labels: str) -> float:
    """histogram_quantile over the buckets' increases (Prometheus's linear interpolation within a bucket)."""
    bounds = [*BUCKETS_S, math.inf]
    counts = [_inc(a, b, "kvtier_op_duration_seconds_bucket", le=repr(x), **labels) for x in BUCKETS_S]
    counts.append(_inc(a, b, "kvtier_op_duration_seconds_bucket", le="+Inf", **labels))
    rank = q * counts[-1]
    for i, (bound, c) in enumerate(zip(bounds, counts)):
        if c >= rank:
            if math.isinf(bound):
                return bounds[-2]
            lo, below = (0.0, 0.0) if i == 0 else (bounds[i - 1], counts[i - 1])
            return lo + (bound - lo) * (rank - below) / (c - below)
    raise AssertionError("no bucket reaches the rank")


def _replay(stack, out, *extra: str) -> dict:
    cmd = [sys.executable, "-m", "replay.cli", "replay", "--base-url", stack.vllm, "--model", "tiny"]
    cmd += ["--endpoint", "completions", "--num-requests", "6", "--input-len", "300", "--prefix-len", "512"]
    cmd += ["--output-len", "4", "--request-rate", "6", "--seed", "3", "--warmup", "0", "--quiet", "--output", str(out)]
    p = subprocess.run([*cmd, *extra], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(out.read_text())


def _stores_settled(stack) -> bool:
    """LMCache has no store to kvtier in flight (a replay's last stores finish after its answers)."""
    m = metrics(stack.inst(0)["lmcache_metrics"])

    def total(name: str) -> float:
        return sum(v for (n, _), v in m.items() if n == name)

    done = total("lmcache_mp_l2_store_completed_objects_chunks_total")
    return done == total("lmcache_mp_l2_store_submitted_objects_chunks_total") and done > 0


def _oldest_scrape(base: str) -> float:
    """When the least recently scraped target was last scraped (Prometheus's clock)."""
    r = _query(base, "min(timestamp(up))")
    return float(r[0]["value"][1]) if r else 0.0


def _all_scraped_after(base: str, t: float) -> bool:
    return _oldest_scrape(base) > t


@pytest.fixture(scope="module")
def env(disk_stack, tmp_path_factory):
    assert disk_stack.prometheus, "the shared stack started without Prometheus"
    stack = disk_stack.ensure_up()
    base = tmp_path_factory.mktemp("prometheus-stack")
    prom = stack.endpoints["prometheus"]
    ctx = SimpleNamespace(stack=stack, prom=prom, state=disk_stack.state, out=base)

    def targets_up() -> bool:
        active = _api(prom, "targets")["activeTargets"]
        return len(active) == 3 and all(t["health"] == "up" for t in active)

    assert wait_for(targets_up, 60, 0.5), _api(prom, "targets")
    # One request first: LMCache creates its lookup counters at the first lookup, and rate() takes a series'
    # first sample as its start (kvtier's exporter has its counters from zero for that reason)
    complete(stack.vllm, prompt_text(disk_stack.model, 300, "typing.py"), max_tokens=2)
    assert wait_for(lambda: _stores_settled(stack), 60, 0.2), stack.log("lmcache0")
    # s1: every target scraped after the warm-up; the rules' window will start between s1 and t0, when
    # nothing changes (a few scrapes of the idle stack), so it holds both replays and nothing of the warm-up
    settled = _prom_now(prom)
    assert wait_for(lambda: _all_scraped_after(prom, settled), 30, 0.2)
    ctx.s1 = _oldest_scrape(prom)
    assert wait_for(lambda: _all_scraped_after(prom, ctx.s1 + 2.5 * INTERVAL_S), 30, 0.2)
    ctx.t0 = _prom_now(prom)
    ctx.d0 = _direct(stack)
    # the stack is fresh (see above): the read-latency buckets all start the window at zero
    assert _inc(Snapshot(0, {}), ctx.d0, "kvtier_ops_total", tier="disk", op="read") == 0, "kvtier read its disk before"
    ctx.wall0 = time.monotonic()
    _replay(stack, base / "fill.json")
    assert wait_for(lambda: _stores_settled(stack), 60, 0.2), stack.log("lmcache0")
    clear_l1(stack)
    ctx.d1 = _direct(stack)
    ctx.run = _replay(stack, base / "reload.json", "--metrics-url", "prometheus+" + prom)
    ctx.d2 = _direct(stack)
    ctx.wall1 = time.monotonic()
    yield ctx


def test_replay_reads_the_same_figures_from_prometheus_as_from_the_pages(env):
    from_prom = dict(env.run["server_metrics"])
    from_pages = derive(env.d1, env.d2)
    for k in ("interval_s", "scrape_errors"):
        from_prom.pop(k), from_pages.pop(k)
    assert env.run["server_metrics"]["scrape_errors"] is None
    assert from_prom == from_pages
    # the run read its prefixes back from kvtier's disk tier, so the figures compared are not all zeros
    assert from_prom["kv_bytes_by_tier"]["disk"]["read"] > 0
    assert from_prom["prompt_tokens_by_source"]["external_kv_transfer"] > 0
    # where the prompt tokens came from: every one counted once, and L1 was cleared before this replay, so kvtier's
    # disk tier served some of them (the same figures from Prometheus, compared above)
    parts = from_prom["prompt_tokens_by_tier"]
    assert sum(parts.values()) == sum(from_prom["prompt_tokens_by_source"].values())
    assert parts["kvtier_disk"] > 0, parts


def test_recording_rules_match_the_exporters_counters(env):
    prom, d0, d2 = env.prom, env.d0, env.d2
    # The rules evaluated at `at`: their 1m window then starts after s1 (the warm-up's last scrape) and before t0
    # (the replays' start), and ends after the scrape that followed the replays.
    at = env.s1 + WINDOW_S + 1.5 * INTERVAL_S
    end = _prom_now(prom)
    assert wait_for(lambda: _all_scraped_after(prom, end), 30, 0.2)
    assert _oldest_scrape(prom) < at - INTERVAL_S, f"the replays took {env.wall1 - env.wall0:.0f} s, past the 1m window"

    def evaluated() -> float:  # when the last of the rule groups was evaluated
        groups = _api(prom, "rules", type="record")["groups"]
        assert len(groups) == 3, groups
        return min(datetime.fromisoformat(g["lastEvaluation"]).timestamp() for g in groups)

    assert wait_for(lambda: evaluated() > at, 2 * WINDOW_S, 0.5)

    def recorded(name: str, **labels: str) -> float:
        sel = ",".join(f'{k}="{v}"' for k, v in {"stack_instance": "0", **labels}.items())
        r = _query(prom, f"{name}{{{sel}}}", at)
        assert len(r) == 1, (name, labels, r)
        return float(r[0]["value"][1])

    def close(got: float, want: float, tol: float = RATE_TOL) -> bool:
        return abs(got - want) <= tol * abs(want) + 1e-9

    checked = 0
    for tier, op in (("disk", "read"), ("disk", "write")):
        want_bytes = _inc(d0, d2, "kvtier_bytes_total", tier=tier, op=op)
        want_ops = _inc(d0, d2, "kvtier_ops_total", tier=tier, op=op)
        assert want_bytes > 0 and want_ops > 0, (tier, op)
        got = recorded("stack_instance_tier_op:kvtier_bytes:rate1m", tier=tier, op=op) * WINDOW_S
        assert close(got, want_bytes), (tier, op, got, want_bytes)
        got = recorded("stack_instance_tier_op:kvtier_ops:rate1m", tier=tier, op=op) * WINDOW_S
        assert close(got, want_ops), (tier, op, got, want_ops)
        checked += 2
    loads = _inc(d0, d2, "kvtier_backend_events_total", event="load_hits")
    loads += _inc(d0, d2, "kvtier_backend_events_total", event="load_misses")
    want = _inc(d0, d2, "kvtier_tier_events_total", event="hits", tier="disk") / loads
    assert close(recorded("stack_instance_tier:kvtier_load_hits:ratio_rate1m", tier="disk"), want)
    asked = _inc(d0, d2, "lmcache_mp_lookup_requested_tokens_total")
    for tier in ("l1", "l2"):
        want = _inc(d0, d2, f"lmcache_mp_lookup_hit_{tier}_tokens_total") / asked
        assert close(recorded("stack_instance_tier:lmcache_lookup_hit_tokens:ratio_rate1m", tier=tier), want), tier
    prompt = _inc(d0, d2, "vllm:prompt_tokens_by_source_total")
    for source in ("local_compute", "external_kv_transfer"):
        want = _inc(d0, d2, "vllm:prompt_tokens_by_source_total", source=source) / prompt
        got = recorded("stack_instance_source:vllm_prompt_tokens:ratio_rate1m", source=source)
        assert want > 0 and close(got, want), (source, got, want)
    checked += 5
    for q in ("0.5", "0.99"):
        want = _quantile(float(q), d0, d2, tier="disk", op="read", part="total")
        got = recorded(
            "stack_instance_tier_op_part:kvtier_op_duration_seconds:quantile_rate1m",
            tier="disk",
            op="read",
            part="total",
            quantile=q,
        )
        assert close(got, want, 1e-6), (q, got, want)
        checked += 1
    assert checked == 11


def test_every_dashboard_query_returns_data(env):
    dash = json.loads((SCRIPTS / "grafana" / "kvtier-dashboard.json").read_text())
    var = next(v for v in dash["templating"]["list"] if v["name"] == "instance")
    series = var["query"].removeprefix("label_values(").split(",")[0]
    assert _api(env.prom, "label/stack_instance/values", **{"match[]": series}) == ["0"]
    for panel in dash["panels"]:
        for target in panel["targets"]:
            expr = target["expr"].replace("$instance", var["allValue"])
            values = [float(r["value"][1]) for r in _query(env.prom, expr)]
            assert any(math.isfinite(v) for v in values), (panel["title"], expr, values)


def test_status_names_prometheus(env):
    p = subprocess.run(
        ["bash", str(RUN_STACK), "status", "--state-dir", str(env.state)], capture_output=True, text=True
    )
    assert f"prometheus  {env.prom}" in p.stdout, p.stdout


@pytest.mark.stops_disk_stack
def test_down_stops_prometheus(disk_stack):
    prom = disk_stack.endpoints["prometheus"]
    disk_stack.down()
    with pytest.raises(OSError):
        urllib.request.urlopen(prom + "/-/ready", timeout=5)
