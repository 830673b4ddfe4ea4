"""The server's counters read from a Prometheus that scrapes it, for a user who reaches Prometheus but not the servers.

`--metrics-url prometheus+http://HOST:PORT` (or prometheus+https://, with a path prefix if Prometheus serves under
one) names a Prometheus instead of a /metrics page. The scheme says so explicitly rather than probing the URL: a
probe costs a request per URL and cannot tell a Prometheus behind a proxy that refuses its status API from a
/metrics page that is down. `?match={job="vllm",cluster="a"}` (PromQL label matchers) keeps only the series of the
servers the run drives, when that Prometheus scrapes others too.

One reading of it gives what one scrape of the /metrics pages gives: the latest sample of every series of vLLM
(`vllm:`), LMCache (`lmcache`) and kvtier (`kvtier_`) that Prometheus holds, keyed by (name, labels) as
server_metrics parses them, so server_metrics.derive computes the same figures from two readings (the run's
counters' increase over its window). Prometheus's own labels (job, instance, and target labels such as
run-stack.sh's stack_instance) stay on each series: two servers' series stay apart and each one's delta is taken
on its own, which sums to what the /metrics pages' merged series give.

A reading waits until every one of those series has a sample Prometheus took after the reading began (at most one
scrape interval, bounded by `wait_s`): the state at the run's end, not one scrape interval before it. Prometheus's
clock decides "after" (its `time()`), so the two machines' clocks need not agree. The readings are exact when the
servers are idle just before and after the window (what a run's start and end are), as counters change only with
requests.

Prometheus's HTTP API: prometheus.io/docs/prometheus/latest/querying/api/ (instant queries, the JSON result).
"""

from __future__ import annotations

import asyncio
import json
import re
from urllib.parse import parse_qs, urlsplit, urlunsplit

import aiohttp

__all__ = ["PROMETHEUS_SCHEME", "PrometheusUrl", "is_prometheus_url", "parse_prometheus_url", "read"]

PROMETHEUS_SCHEME = "prometheus+"
# the servers whose counters server_metrics.derive reads; the metric name regex a selector needs (never empty)
SERIES_NAMES = "vllm:.+|lmcache.+|kvtier_.+"
_MATCHERS = re.compile(r"^\{(.*)\}$", re.S)

# One series as server_metrics keys it (kept in step with server_metrics.Series)
Series = tuple[str, tuple[tuple[str, str], ...]]


class PrometheusUrl:
    """A parsed `prometheus+http(s)://host:port[/prefix][?match={...}]`: the API base and the extra matchers."""

    def __init__(self, text: str, base: str, matchers: str) -> None:
        self.text, self.base, self.matchers = text, base, matchers

    def selector(self) -> str:
        inner = f'__name__=~"{SERIES_NAMES}"'
        return "{" + inner + (", " + self.matchers if self.matchers else "") + "}"

    def last_scrapes(self) -> str:
        """PromQL: when the least recently scraped of the targets holding those series was scraped (its `up`
        sample's time; timestamp() of the series themselves would drop their names and collide)."""
        return f"min(timestamp(up) and on (job, instance) count by (job, instance) ({self.selector()}))"


def is_prometheus_url(url: str) -> bool:
    return url.startswith(PROMETHEUS_SCHEME)


def parse_prometheus_url(url: str) -> PrometheusUrl:
    """ValueError with what is wrong, for a user's --metrics-url."""
    u = urlsplit(url.removeprefix(PROMETHEUS_SCHEME))
    if u.scheme not in ("http", "https") or not u.netloc:
        raise ValueError(f"{url!r}: a Prometheus URL is prometheus+http://HOST:PORT (or prometheus+https://)")
    query = parse_qs(u.query, keep_blank_values=True)
    unknown = set(query) - {"match"}
    if unknown or len(query.get("match", [])) > 1:
        raise ValueError(f'{url!r}: the only query parameter of a Prometheus URL is one match={{label="value"}}')
    matchers = ""
    if query.get("match"):
        m = _MATCHERS.match(query["match"][0].strip())
        if not m or not m.group(1).strip():
            raise ValueError(f'{url!r}: match= takes PromQL label matchers in braces, e.g. match={{job="vllm"}}')
        matchers = m.group(1).strip()
    base = urlunsplit((u.scheme, u.netloc, u.path.rstrip("/"), "", ""))
    return PrometheusUrl(url, base, matchers)


class PrometheusError(Exception):
    """A query that failed: the one line said in the run's scrape errors."""


async def _query(session: aiohttp.ClientSession, base: str, promql: str, timeout_s: float) -> list[dict]:
    """An instant query at Prometheus's now; its result vector (or a scalar as [time, value])."""
    try:
        async with session.get(
            base + "/api/v1/query", params={"query": promql}, timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as r:
            text = await r.text()
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        raise PrometheusError(f"{type(exc).__name__}") from exc
    try:
        body = json.loads(text)
    except ValueError as exc:
        raise PrometheusError(f"HTTP {r.status}, not Prometheus's API (no JSON)") from exc
    if not isinstance(body, dict) or body.get("status") != "success":
        what = body.get("error") if isinstance(body, dict) else None
        raise PrometheusError(f"HTTP {r.status}, query failed: {what or 'not Prometheus API JSON'}")
    return body["data"]["result"]


async def read(
    session: aiohttp.ClientSession, url: str, timeout_s: float = 5.0, wait_s: float = 30.0
) -> tuple[dict[Series, float], list[str]]:
    """The latest value of every vLLM/LMCache/kvtier series Prometheus scraped after this call began, and the errors
    (one line each, as server_metrics.scrape says them). A series not scraped again within `wait_s` (its server is
    down, or Prometheus's interval is longer) is read as it stands and said in the errors."""
    try:
        p = parse_prometheus_url(url)
        began = float((await _query(session, p.base, "time()", timeout_s))[0])
        sel = p.selector()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        errors: list[str] = []
        while True:
            oldest = await _query(session, p.base, p.last_scrapes(), timeout_s)
            if not oldest:
                return {}, [f"{url}: no series matching {sel}"]
            if float(oldest[0]["value"][1]) > began:
                break
            if loop.time() > deadline:
                errors.append(f"{url}: some series not scraped again within {wait_s:g} s (read as they stand)")
                break
            await asyncio.sleep(0.2)
        values: dict[Series, float] = {}
        for s in await _query(session, p.base, sel, timeout_s):
            labels = dict(s["metric"])
            name = labels.pop("__name__")
            v = float(s["value"][1])
            if v == v:  # NaN left out, as server_metrics.parse_prometheus does
                values[(name, tuple(sorted(labels.items())))] = v
        return values, errors
    except (PrometheusError, ValueError, KeyError, IndexError, TypeError) as exc:
        return {}, [f"{url}: {exc}"]
