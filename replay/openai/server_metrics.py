"""Scrape Prometheus `/metrics` (vLLM, LMCache, kvtier's exporter) and turn counter deltas into cache figures.

Rates are always deltas of counters between two snapshots (never gauges a server overwrites). Series of the same name
are summed across labels and across scraped URLs (two vLLM instances behind one router add up), except
`prompt_tokens_by_source`, kept per `source`. A counter that went down (server restart) counts from zero.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

import aiohttp

__all__ = ["KV_WRITTEN_BYTES_METRICS", "Snapshot", "derive", "parse_prometheus", "scrape"]

# Bytes written to the KV tier, first one found wins (kvtier's exporter, then LMCache's).
# kvtier's exporter (kvconnector/metrics.py) has kvtier_bytes_total{tier,op}: the op="write" series, all tiers summed.
KV_WRITTEN_BYTES_METRICS = ("kvtier_bytes_total|write", "lmcache:stored_bytes_total", "lmcache:num_stored_bytes_total")

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_BLOCK = re.compile(r'[{,]block_size="(\d+)"')
_OP = re.compile(r'[{,]op="([^"]*)"')
_SOURCE = re.compile(r'source="([^"]*)"')


@dataclass
class Snapshot:
    t_ns: int
    values: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def get(self, *names: str) -> float | None:
        for n in names:
            for cand in (n, n + "_total", n.removesuffix("_total")):
                if cand in self.values:
                    return self.values[cand]
        return None


def parse_prometheus(text: str, into: dict[str, float] | None = None) -> dict[str, float]:
    out = {} if into is None else into
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = _LINE.match(line)
        if not m:
            continue
        name, labels, raw = m.groups()
        try:
            v = float(raw)
        except ValueError:
            continue
        if v != v:  # NaN
            continue
        key = name
        if labels and name == "vllm:cache_config_info":
            b = _BLOCK.search(labels)
            if b:
                out["vllm:cache_config_block_size"] = float(b.group(1))
            continue
        if labels and name in ("kvtier_bytes_total", "kvtier_bytes"):
            op = _OP.search(labels)
            key = f"kvtier_bytes_total|{op.group(1)}" if op else name
        elif labels and "prompt_tokens_by_source" in name:
            s = _SOURCE.search(labels)
            if s:
                key = f"{name}|{s.group(1)}"
        out[key] = out.get(key, 0.0) + v
    return out


async def scrape(session: aiohttp.ClientSession, urls: list[str], timeout_s: float = 5.0) -> Snapshot:
    snap = Snapshot(time.perf_counter_ns())
    for url in urls:
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
                if r.status != 200:
                    snap.errors.append(f"{url}: HTTP {r.status}")
                    continue
                parse_prometheus(await r.text(), snap.values)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            snap.errors.append(f"{url}: {type(exc).__name__}")
    return snap


def _delta(a: Snapshot, b: Snapshot, *names: str) -> float | None:
    vb = b.get(*names)
    if vb is None:
        return None
    va = a.get(*names) or 0.0
    return vb - va if vb >= va else vb  # a reset counts from zero


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or not den:
        return None
    return round(num / den, 6)


def derive(
    a: Snapshot, b: Snapshot, kv_bytes_per_token: float | None = None, kv_bytes_metric: str | None = None
) -> dict:
    """Cache and scheduler figures over the interval between two snapshots."""
    d = lambda *n: _delta(a, b, *n)  # noqa: E731
    hits, queries = d("vllm:prefix_cache_hits"), d("vllm:prefix_cache_queries")
    ext_hits, ext_queries = d("vllm:external_prefix_cache_hits"), d("vllm:external_prefix_cache_queries")
    src = {
        s: d(f"vllm:prompt_tokens_by_source_total|{s}") or d(f"vllm:prompt_tokens_by_source|{s}")
        for s in ("local_compute", "local_cache_hit", "external_kv_transfer")
    }
    have_src = any(v is not None for v in src.values())
    total_src = sum(v or 0 for v in src.values()) if have_src else None
    if have_src and total_src:
        hit_rate = _ratio((src["local_cache_hit"] or 0) + (src["external_kv_transfer"] or 0), total_src)
    else:
        hit_rate = _ratio((hits or 0) + (ext_hits or 0), queries) if queries else None
    q_sum, q_cnt = d("vllm:request_queue_time_seconds_sum"), d("vllm:request_queue_time_seconds_count")
    written = None
    for name in (kv_bytes_metric,) if kv_bytes_metric else KV_WRITTEN_BYTES_METRICS:
        written = d(name)
        if written is not None:
            break
    written_source = kv_bytes_metric if written is not None and kv_bytes_metric else None
    if written is None and kv_bytes_per_token:
        stored = d("lmcache:num_stored_tokens")
        if stored is not None:
            written, written_source = stored * kv_bytes_per_token, "lmcache:num_stored_tokens x kv_bytes_per_token"
    elif written is not None and written_source is None:
        written_source = next(n for n in KV_WRITTEN_BYTES_METRICS if d(n) is not None)
    return {
        "interval_s": round((b.t_ns - a.t_ns) / 1e9, 3),
        "hit_rate": hit_rate,
        "prefix_cache_hit_rate": _ratio(hits, queries),
        "prefix_cache_hits": hits,
        "prefix_cache_queries": queries,
        "external_prefix_cache_hit_rate": _ratio(ext_hits, ext_queries),
        "external_prefix_cache_hits": ext_hits,
        "external_prefix_cache_queries": ext_queries,
        "prompt_tokens_by_source": src if have_src else None,
        "preemptions": d("vllm:num_preemptions"),
        "server_queue_time_mean_ms": round(q_sum / q_cnt * 1e3, 3) if q_sum is not None and q_cnt else None,
        "kv_written_bytes": written,
        "kv_written_bytes_source": written_source,
        "lmcache_hit_tokens": d("lmcache:num_hit_tokens"),
        "lmcache_stored_tokens": d("lmcache:num_stored_tokens"),
        "scrape_errors": b.errors or None,
    }
