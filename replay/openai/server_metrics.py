"""Scrape Prometheus `/metrics` (vLLM, LMCache, kvtier's exporter) and turn counter deltas into cache figures.

The text is parsed by prometheus_client's own parser (label values may hold `}`, escaped quotes and newlines), and
every sample is kept as a series: (sample name, labels) -> value. Samples of one series scraped from several URLs
add up (two vLLM instances behind one router report as one).

Rates are always deltas of counters between two snapshots (never gauges a server overwrites), taken per series and
then summed, so one series that went down (its server restarted) counts from zero without hiding the others' growth.
A `--metrics-url prometheus+http://HOST:PORT` names a Prometheus that scrapes the servers instead of a page: its
latest samples of the same series are read through its HTTP API (prometheus_source.py), so every figure below comes
out the same from either source.

A figure sums every series of its name unless it is asked per label: `prompt_tokens_by_source` per `source`, and
kvtier's `kvtier_bytes_total` per `tier` and `op` (which tier the bytes went to, not only how many).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from replay.common.prometheus_text import Series, parse_prometheus

from . import prometheus_source

__all__ = [
    "KV_WRITTEN_BYTES_METRICS",
    "Series",
    "Snapshot",
    "derive",
    "metric_selector",
    "parse_prometheus",
    "scrape",
]

# Bytes written to the KV tier, first one found wins: kvtier's exporter (kvconnector/metrics.py, its op="write"
# series of every tier), then LMCache's.
KV_WRITTEN_BYTES_METRICS = (
    'kvtier_bytes_total{op="write"}',
    "lmcache:stored_bytes_total",
    "lmcache:num_stored_bytes_total",
)
_KVTIER_BYTES = "kvtier_bytes_total"
# vLLM's prompt tokens by where they came from (`vllm:prompt_tokens_by_source_total{source}`)
_PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")


def metric_selector(text: str) -> tuple[str, dict[str, str]]:
    """'name' or 'name{label="value",...}' (PromQL's exact-match selector) -> (name, labels). ValueError if it is
    neither. The labels are read by the same parser as the scrape, so quoting and escapes mean the same."""
    text = text.strip()
    if "{" not in text:
        return text, {}
    name, _, rest = text.partition("{")
    inner = rest.removesuffix("}")
    what = f'not a metric selector (name or name{{label="value"}}): {text!r}'
    try:
        families = list(text_string_to_metric_families(text + " 0\n")) if rest.endswith("}") else []
    except ValueError as exc:
        raise ValueError(what) from exc
    samples = [s for f in families for s in f.samples]
    # The parser is lenient (`x{tier=}` reads as `x`): a selector must give back its name, and labels if it has any.
    if len(samples) != 1 or samples[0].name != name or (inner.strip() and not samples[0].labels):
        raise ValueError(what)
    return name, dict(samples[0].labels)


@dataclass
class Snapshot:
    t_ns: int
    values: dict[Series, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def series(self, *names: str, **match: str) -> dict[Series, float]:
        """The series of the first of `names` that has any whose labels include `match` (each name also tried with
        and without `_total`, as exporters differ); {} when none has."""
        for n in names:
            for cand in (n, n + "_total", n.removesuffix("_total")):
                found = {k: v for k, v in self.values.items() if k[0] == cand and _matches(k[1], match)}
                if found:
                    return found
        return {}

    def total(self, *names: str, **match: str) -> float | None:
        found = self.series(*names, **match)
        return sum(found.values()) if found else None

    def label_values(self, name: str, label: str) -> list[str]:
        """Values of `label` among the series of `name`, in first-seen order (an info metric's labels)."""
        out: list[str] = []
        for (_, labels), _v in self.series(name).items():
            v = dict(labels).get(label)
            if v is not None and v not in out:
                out.append(v)
        return out

    def block_size(self) -> int | None:
        """vLLM's KV block size, from the `block_size` label of `vllm:cache_config_info`."""
        for v in self.label_values("vllm:cache_config_info", "block_size"):
            if v.isdigit():
                return int(v)
        return None


def _matches(labels: tuple[tuple[str, str], ...], match: Mapping[str, str]) -> bool:
    if not match:
        return True
    have = dict(labels)
    return all(have.get(k) == v for k, v in match.items())


# The most of one /metrics body read: vLLM's is about 100 KB (a few hundred series); a body past this is not a
# metrics page worth parsing every few seconds (a 300 MB one made a 3-request run take 51 s and 1.9 GB): an error.
MAX_METRICS_BYTES = 16 << 20


class _TooLarge(Exception):
    pass


async def _read_capped(r: aiohttp.ClientResponse, cap: int) -> bytes:
    if r.content_length is not None and r.content_length > cap:
        raise _TooLarge
    chunks, n = [], 0
    async for chunk in r.content.iter_chunked(1 << 16):
        n += len(chunk)
        if n > cap:
            raise _TooLarge
        chunks.append(chunk)
    return b"".join(chunks)


async def scrape(
    session: aiohttp.ClientSession, urls: list[str], timeout_s: float = 5.0, max_bytes: int = MAX_METRICS_BYTES
) -> Snapshot:
    snap = Snapshot(time.perf_counter_ns())
    for url in urls:
        if prometheus_source.is_prometheus_url(url):
            values, errors = await prometheus_source.read(session, url, timeout_s)
            for key, v in values.items():
                snap.values[key] = snap.values.get(key, 0.0) + v
            snap.errors += errors
            continue
        try:
            # identity: the run's session does not decompress, and prometheus_client gzips when asked (kvtier's
            # exporter did, and the scrape failed on the gzip bytes)
            headers = {"Accept-Encoding": "identity"}
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s), headers=headers) as r:
                if r.status != 200:
                    snap.errors.append(f"{url}: HTTP {r.status}")
                    continue
                body = await _read_capped(r, max_bytes)
        except _TooLarge:
            snap.errors.append(f"{url}: body over {max_bytes >> 20} MiB, not read")
            continue
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            snap.errors.append(f"{url}: {type(exc).__name__}")
            continue
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            snap.errors.append(f"{url}: not UTF-8 text (byte {exc.start})")
            continue
        try:
            parse_prometheus(text, snap.values)
        except ValueError as exc:  # not the text format: said, and nothing of this URL counted
            snap.errors.append(f"{url}: not Prometheus text format ({exc})")
    return snap


def _series_delta(a: Snapshot, b: Snapshot, found: dict[Series, float]) -> float:
    """Sum over series of b's value minus a's; a series that went down (a restart) or is new counts from zero."""
    total = 0.0
    for key, vb in found.items():
        va = a.values.get(key, 0.0)
        total += vb - va if vb >= va else vb
    return total


def delta(a: Snapshot, b: Snapshot, *names: str, **match: str) -> float | None:
    found = b.series(*names, **match)
    return _series_delta(a, b, found) if found else None


def delta_by(a: Snapshot, b: Snapshot, name: str, *labels: str) -> dict[tuple[str, ...], float]:
    """Deltas of the series of `name` grouped by the values of `labels` (a series lacking one is left out)."""
    groups: dict[tuple[str, ...], dict[Series, float]] = {}
    for key, v in b.series(name).items():
        have = dict(key[1])
        if all(lab in have for lab in labels):
            groups.setdefault(tuple(have[lab] for lab in labels), {})[key] = v
    return {g: _series_delta(a, b, found) for g, found in groups.items()}


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or not den:
        return None
    return round(num / den, 6)


def _selector_text(name: str, labels: Mapping[str, str]) -> str:
    if not labels:
        return name
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return f"{name}{{{inner}}}"


def kv_bytes_by_tier(a: Snapshot, b: Snapshot) -> dict[str, dict[str, float]] | None:
    """{tier: {op: bytes}} over the interval from kvtier's `kvtier_bytes_total{tier,op}`; None when not exported."""
    out: dict[str, dict[str, float]] = {}
    for (tier, op), v in delta_by(a, b, _KVTIER_BYTES, "tier", "op").items():
        out.setdefault(tier, {})[op] = v
    return out or None


def _apportion(total: int, weights: Mapping[str, float]) -> dict[str, int]:
    """`total` split in proportion to `weights` (their sum above 0) as whole numbers that add up to it (largest
    remainders first)."""
    den = sum(weights.values())
    exact = {k: total * v / den for k, v in weights.items()}
    out = {k: int(x) for k, x in exact.items()}
    for k in sorted(exact, key=lambda k: out[k] - exact[k])[: total - sum(out.values())]:
        out[k] += 1
    return out


def prompt_tokens_by_tier(a: Snapshot, b: Snapshot) -> dict[str, int] | None:
    """Where each prompt token of the interval came from: vLLM's own prefix cache (`vllm_prefix_cache`), LMCache's
    memory (`lmcache_l1`), each kvtier tier behind LMCache (`kvtier_<tier>`; `lmcache_l2` when kvtier exports
    nothing), or computed again (`recomputed`); the parts add up to vLLM's prompt tokens of the interval. None without
    vLLM's `vllm:prompt_tokens_by_source`.

    vLLM counts its own hits, the external (KV connector) ones and the computed ones per token. No server counts the
    external ones per tier, so they are split in proportion to LMCache's lookup hits in L1 and L2
    (`lmcache_mp_lookup_hit_{l1,l2}_tokens`) and L2's part in proportion to the bytes kvtier read from each tier
    (`kvtier_bytes_total{op="read"}`); `external_kv_transfer` stays whole when LMCache counted no lookup hit."""
    src = {s: delta(a, b, "vllm:prompt_tokens_by_source", source=s) for s in _PROMPT_SOURCES}
    if all(v is None for v in src.values()):
        return None
    parts = {"vllm_prefix_cache": int(src["local_cache_hit"] or 0), "recomputed": int(src["local_compute"] or 0)}
    external = int(src["external_kv_transfer"] or 0)
    if not external:
        return parts
    lookups = {t: delta(a, b, f"lmcache_mp_lookup_hit_{t}_tokens") or 0.0 for t in ("l1", "l2")}
    if not sum(lookups.values()):
        return {**parts, "external_kv_transfer": external}
    lmcache = _apportion(external, {"lmcache_l1": lookups["l1"], "lmcache_l2": lookups["l2"]})
    reads = {f"kvtier_{t}": v for (t, op), v in delta_by(a, b, _KVTIER_BYTES, "tier", "op").items() if op == "read"}
    if lmcache["lmcache_l2"] and any(reads.values()):
        return {**parts, "lmcache_l1": lmcache["lmcache_l1"], **_apportion(lmcache["lmcache_l2"], reads)}
    return {**parts, **lmcache}


def derive(
    a: Snapshot, b: Snapshot, kv_bytes_per_token: float | None = None, kv_bytes_metric: str | None = None
) -> dict:
    """Cache and scheduler figures over the interval between two snapshots. `kv_bytes_metric` is a counter's name or
    an exact-match selector (`name{label="value"}`); by default KV_WRITTEN_BYTES_METRICS, first one found."""

    def d(*names: str, **match: str) -> float | None:
        return delta(a, b, *names, **match)

    hits, queries = d("vllm:prefix_cache_hits"), d("vllm:prefix_cache_queries")
    ext_hits, ext_queries = d("vllm:external_prefix_cache_hits"), d("vllm:external_prefix_cache_queries")
    src = {s: d("vllm:prompt_tokens_by_source", source=s) for s in _PROMPT_SOURCES}
    have_src = any(v is not None for v in src.values())
    total_src = sum(v or 0 for v in src.values()) if have_src else None
    if have_src and total_src:
        hit_rate = _ratio((src["local_cache_hit"] or 0) + (src["external_kv_transfer"] or 0), total_src)
    else:
        hit_rate = _ratio((hits or 0) + (ext_hits or 0), queries) if queries else None
    q_sum, q_cnt = d("vllm:request_queue_time_seconds_sum"), d("vllm:request_queue_time_seconds_count")
    written, written_source = None, None
    for sel in (kv_bytes_metric,) if kv_bytes_metric else KV_WRITTEN_BYTES_METRICS:
        try:
            name, labels = metric_selector(sel)
        except ValueError:
            continue  # a selector that does not parse names no series, as an unknown name does
        written = d(name, **labels)
        if written is not None:
            written_source = kv_bytes_metric or _selector_text(name, labels)
            break
    if written is None and kv_bytes_per_token:
        stored = d("lmcache:num_stored_tokens")
        if stored is not None:
            written, written_source = stored * kv_bytes_per_token, "lmcache:num_stored_tokens x kv_bytes_per_token"
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
        "prompt_tokens_by_tier": prompt_tokens_by_tier(a, b),
        "preemptions": d("vllm:num_preemptions"),
        "server_queue_time_mean_ms": round(q_sum / q_cnt * 1e3, 3) if q_sum is not None and q_cnt else None,
        "kv_written_bytes": written,
        "kv_written_bytes_source": written_source,
        "kv_bytes_by_tier": kv_bytes_by_tier(a, b),
        "lmcache_hit_tokens": d("lmcache:num_hit_tokens"),
        "lmcache_stored_tokens": d("lmcache:num_stored_tokens"),
        "scrape_errors": b.errors or None,
    }
