"""/metrics parsing and deltas on real exporter text and on label values a hand-written regex gets wrong.

Samples are kept as labelled series (prometheus_client's parser), so bytes per kvtier tier reach the summary, a label
value may hold `}`, escaped quotes or newlines, and a counter reset in one series does not hide another's growth.
"""

from __future__ import annotations

import asyncio

import aiohttp
import numpy as np
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from rich.console import Console

from kvconnector.backend import KvtierBackend
from kvconnector.backend_config import BackendConfig
from kvconnector.metrics import BackendCollector
from replay.common.ports import free_port
from replay.openai.server_metrics import Snapshot, derive, metric_selector, parse_prometheus, scrape
from replay.outputs.tables import replay_tables

N = 50_000


def _exporter_text(backend) -> str:
    """What kvtier's exporter serves at /metrics for this backend (kvconnector/metrics.py), without the HTTP."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BackendCollector(backend))
    return generate_latest(registry).decode()


def _written(backend) -> dict[str, int]:
    return {t.name: st.write.nbytes for t, st in zip(backend.store.tiers, backend.store.stats)}


@pytest.mark.slow
def test_bytes_per_tier_from_a_real_kvtier_exporter(tmp_path):
    # A 200 KB disk tier over a shared-directory tier: 50 KB entries overflow the disk tier and are demoted, so both
    # tiers are written, by different amounts (what the media-identity check, replay/openai/report.py, needs to see).
    cfg = BackendConfig(
        disk_dir=str(tmp_path / "disk"),
        disk_capacity_gb=2e-4,
        shared_dir=str(tmp_path / "shared"),
        shared_capacity_gb=0.01,
        snapshot_path="",
    )
    b = KvtierBackend(cfg)
    try:
        b.put("warm", [memoryview(np.zeros(N, np.uint8))])
        before_text, before = _exporter_text(b), _written(b)
        rng = np.random.default_rng(1)
        for i in range(12):
            assert b.put(f"k{i}", [memoryview(rng.integers(0, 256, N, dtype=np.uint8))])
        after_text, after = _exporter_text(b), _written(b)
    finally:
        b.close()
    expected = {tier: after[tier] - before[tier] for tier in after}
    assert len(expected) == 2 and all(v > 0 for v in expected.values()) and len(set(expected.values())) == 2
    d = derive(Snapshot(0, parse_prometheus(before_text)), Snapshot(10**9, parse_prometheus(after_text)))
    assert {tier: v["write"] for tier, v in d["kv_bytes_by_tier"].items()} == expected
    assert d["kv_written_bytes"] == sum(expected.values())
    assert d["kv_written_bytes_source"] == 'kvtier_bytes_total{op="write"}'
    # one tier picked with a selector, as --kv-bytes-metric takes it
    disk = 'kvtier_bytes_total{tier="disk",op="write"}'
    d_disk = derive(Snapshot(0, parse_prometheus(before_text)), Snapshot(1, parse_prometheus(after_text)), None, disk)
    assert d_disk["kv_written_bytes"] == expected["disk"] and d_disk["kv_written_bytes_source"] == disk
    # and the closing table shows the tiers with the bytes written to each
    summary = {k: {} for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms", "send_lag_ms", "queue_ms")}
    summary.update(completed=1, failed=0, request_throughput=1.0, output_throughput=1.0, achieved_rate=None)
    summary["server_metrics"] = d
    console = Console(record=True, width=120)
    for t in replay_tables(summary):
        console.print(t)
    text = console.export_text()
    assert "kvtier bytes per tier" in text
    for tier, n in expected.items():
        assert tier in text and f"{n:,}" in text


# Label values that a regex over `{[^}]*}` and `label="([^"]*)"` misreads: a brace ends its label set early (the line
# is dropped), escaped quotes and newlines must come back decoded, a label named `..._source` is not `source`.
HOSTILE = [
    ("a}b", "a}b"),
    (r"say \"hi\" {x}", 'say "hi" {x}'),
    (r"line1\nline2", "line1\nline2"),
    (r"C:\\dir\\", "C:\\dir\\"),
    (r"quote \" then brace }", 'quote " then brace }'),
]


def _hostile_text(raw: str, written: int, cache_hit: int, block: int) -> str:
    return (
        "# TYPE kvtier_bytes counter\n"
        f'kvtier_bytes_total{{tier="{raw}",op="write"}} {written}\n'
        f'kvtier_bytes_total{{tier="{raw}",op="read"}} 7\n'
        f'vllm:cache_config_info{{engine="{raw}",block_size="{block}"}} 1.0\n'
        f'vllm:prompt_tokens_by_source_total{{data_source="{raw}",source="local_compute"}} 100\n'
        f'vllm:prompt_tokens_by_source_total{{model_name="{raw}",source="local_cache_hit"}} {cache_hit}\n'
    )


@pytest.mark.parametrize("raw, decoded", HOSTILE, ids=[h[1] for h in HOSTILE])
def test_hostile_label_values(raw, decoded):
    a = Snapshot(0, parse_prometheus(_hostile_text(raw, 1000, 0, 32)))
    b = Snapshot(10**9, parse_prometheus(_hostile_text(raw, 5096, 300, 32)))
    d = derive(a, b)
    assert d["prompt_tokens_by_source"] == {"local_compute": 0, "local_cache_hit": 300, "external_kv_transfer": None}
    assert d["kv_written_bytes"] == 4096
    assert d["kv_bytes_by_tier"] == {decoded: {"write": 4096, "read": 0}}
    assert d["hit_rate"] == 1.0
    assert b.block_size() == 32


def test_counter_reset_is_per_series():
    # Two engines behind one router; engine 1 restarted between the snapshots (its counter went down).
    a = Snapshot(
        0,
        parse_prometheus(
            'vllm:prefix_cache_queries_total{engine="0"} 100\nvllm:prefix_cache_queries_total{engine="1"} 100\n'
        ),
    )
    b = Snapshot(
        1,
        parse_prometheus(
            'vllm:prefix_cache_queries_total{engine="0"} 300\nvllm:prefix_cache_queries_total{engine="1"} 10\n'
        ),
    )
    # engine 0 grew by 200, engine 1 counts from zero: 10 (summing first would say 310 - 200 = 110)
    assert derive(a, b)["prefix_cache_queries"] == 210


def test_same_series_from_two_urls_add_up_and_selector_parsing():
    both = parse_prometheus('kvtier_bytes_total{tier="disk",op="write"} 5\n')
    parse_prometheus('kvtier_bytes_total{tier="disk",op="write"} 7\n', both)
    assert both == {("kvtier_bytes_total", (("op", "write"), ("tier", "disk"))): 12.0}
    assert metric_selector("lmcache:stored_bytes_total") == ("lmcache:stored_bytes_total", {})
    assert metric_selector(r'x_total{tier="a}b \"c\""}') == ("x_total", {"tier": 'a}b "c"'})
    for bad in ("x{tier=}", 'x{tier="a"', '{tier="a"}', 'x{tier="a"} 5'):
        with pytest.raises(ValueError, match="not a metric selector"):
            metric_selector(bad)


def test_scrape_reports_a_text_it_cannot_parse_and_keeps_the_others():
    async def run() -> Snapshot:
        app = web.Application()

        async def good(_request):
            return web.Response(text="vllm:num_preemptions_total 4\n")

        async def bad(_request):
            return web.Response(text="vllm:num_preemptions_total 4\n<html>oops</html>\n")

        app.router.add_get("/good", good)
        app.router.add_get("/bad", bad)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            async with aiohttp.ClientSession() as session:
                return await scrape(session, [f"http://127.0.0.1:{port}/bad", f"http://127.0.0.1:{port}/good"])
        finally:
            await runner.cleanup()

    snap = asyncio.run(run())
    assert snap.total("vllm:num_preemptions") == 4  # the good URL only: nothing of the bad one is counted
    assert len(snap.errors) == 1 and "/bad: not Prometheus text format" in snap.errors[0]
    with pytest.raises(ValueError):
        parse_prometheus("<html>oops</html>\n")
