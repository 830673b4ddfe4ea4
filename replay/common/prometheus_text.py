"""The Prometheus text exposition format read into plain samples: what `kvtier replay`, deploy/stack.py and the
benchmarks read from vLLM's, LMCache's and kvtier's /metrics pages (prometheus_client's own parser underneath)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["Series", "parse_prometheus"]

# One series: the sample name and its labels as sorted (name, value) pairs (hashable, so it can key a dict).
Series = tuple[str, tuple[tuple[str, str], ...]]


def parse_prometheus(text: str, into: dict[Series, float] | None = None) -> dict[Series, float]:
    """Samples of a Prometheus text exposition as {(name, labels): value}, added into `into` when given.
    NaN samples are left out (a histogram with no observations). A malformed text raises ValueError and adds
    nothing."""
    parsed: dict[Series, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.value != s.value:  # NaN
                continue
            key = (s.name, tuple(sorted(s.labels.items())))
            parsed[key] = parsed.get(key, 0.0) + s.value
    out = {} if into is None else into
    for key, v in parsed.items():
        out[key] = out.get(key, 0.0) + v
    return out
