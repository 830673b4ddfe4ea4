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


def _sources_text(compute, cache_hit, external, l1=None, l2=None, reads=None) -> str:
    lines = [
        f'vllm:prompt_tokens_by_source_total{{source="local_compute"}} {compute}',
        f'vllm:prompt_tokens_by_source_total{{source="local_cache_hit"}} {cache_hit}',
        f'vllm:prompt_tokens_by_source_total{{source="external_kv_transfer"}} {external}',
    ]
    if l1 is not None:
        lines += [f"lmcache_mp_lookup_hit_l1_tokens_total {l1}", f"lmcache_mp_lookup_hit_l2_tokens_total {l2}"]
    for tier, n in (reads or {}).items():
        lines += [
            f'kvtier_bytes_total{{tier="{tier}",op="read"}} {n}',
            f'kvtier_bytes_total{{tier="{tier}",op="write"}} 9',
        ]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    "external, l1, l2, reads, want",
    [
        # LMCache's lookups 1:3 between L1 and L2, kvtier's reads 1:2 between cpu and disk: 1,000 external tokens
        (1000, 100, 300, {"cpu": 1000, "disk": 2000}, {"lmcache_l1": 250, "kvtier_cpu": 250, "kvtier_disk": 500}),
        # shares that do not divide evenly still add up to the tokens (largest remainders)
        (
            1001,
            1,
            1,
            {"cpu": 1, "disk": 1, "shared": 1},
            {"lmcache_l1": 501, "kvtier_cpu": 167, "kvtier_disk": 167, "kvtier_shared": 166},
        ),
        # no kvtier exporter: L2 stays whole; no LMCache counters: the external tokens stay whole
        (1000, 100, 300, None, {"lmcache_l1": 250, "lmcache_l2": 750}),
        (1000, None, None, None, {"external_kv_transfer": 1000}),
        # LMCache counted no lookup hit: nothing to split by
        (1000, 0, 0, {"disk": 5}, {"external_kv_transfer": 1000}),
    ],
)
def test_prompt_tokens_are_attributed_to_each_tier_and_add_up(external, l1, l2, reads, want):
    zero_reads = dict.fromkeys(reads or {}, 0)
    a = Snapshot(0, parse_prometheus(_sources_text(0, 0, 0, 0 if l1 is not None else None, 0, zero_reads)))
    b = Snapshot(1, parse_prometheus(_sources_text(700, 300, external, l1, l2, reads)))
    parts = derive(a, b)["prompt_tokens_by_tier"]
    assert parts == {"vllm_prefix_cache": 300, "recomputed": 700, **want}
    assert sum(parts.values()) == 700 + 300 + external  # every prompt token once
    assert derive(a, Snapshot(1, parse_prometheus("kvtier_bytes_total 1\n")))["prompt_tokens_by_tier"] is None


def test_the_closing_table_says_where_the_prompt_tokens_came_from():
    summary = {k: {} for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms", "send_lag_ms", "queue_ms")}
    summary.update(completed=1, failed=0, request_throughput=1.0, output_throughput=1.0, achieved_rate=None)
    parts = {"recomputed": 600, "vllm_prefix_cache": 100, "kvtier_disk": 200, "lmcache_l1": 100}
    summary["server_metrics"] = {"prompt_tokens_by_tier": parts}
    console = Console(record=True, width=120)
    for t in replay_tables(summary):
        console.print(t)
    text = console.export_text()
    rows = [line.split("│")[1].strip() for line in text.splitlines() if line.startswith("│") and "%" in line]
    assert rows == ["vllm_prefix_cache", "lmcache_l1", "kvtier_disk", "recomputed"]  # nearest the GPU first
    assert "60.0%" in text and "1,000 prompt tokens" in text
