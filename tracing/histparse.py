"""Parse bpftrace map output, text or ``-f json``, into plain Python objects.

Every bucket form bpftrace prints is understood: single values ``[0]``,
``[1]``; log2 ranges ``[2, 4)``, ``[512, 1K)``, ``[1M, 2M)``; linear ranges
``[7, 8)``; open ends ``(..., 0)``, ``[10, ...)``, ``[1M, ...)``; closed
ranges ``[-4, -2]``; and negative values. Suffixes K, M, G, T, P, E are
powers of 1024, as bpftrace prints them. A capture cut short (a map header
with no buckets, a bucket line cut in half, no END line) is parsed as far
as it goes and flagged ``truncated``, never dropped silently.

Standard library only: this file is copied onto nodes on its own.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field

__all__ = ["Bucket", "Hist", "Stats", "Trace", "TraceParseError", "parse_trace", "parse_text", "parse_json",
           "parse_value"]

_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50, "E": 1 << 60}
_NUM = r"-?\d+[KMGTPE]?"
_BUCKET_RE = re.compile(
    rf"^\s*(?P<open>[\[(])\s*(?P<lo>{_NUM}|\.\.\.)\s*(?:,\s*(?P<hi>{_NUM}|\.\.\.)\s*)?(?P<close>[\])])"
    r"\s+(?P<count>\d+)\s*(?:\|.*)?$")
_HEADER_RE = re.compile(r"^@(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:\[(?P<key>.*)\])?:\s*(?P<rest>.*)$")
_STATS_RE = re.compile(r"^count (-?\d+), average (-?\d+), total (-?\d+)$")
_WINDOW_RE = re.compile(r"^capture_window_ns:\s*(\d+)\s*$")
_SPAN_RE = re.compile(r"^active_span_ns:\s*(\d+)\s*$")


class TraceParseError(ValueError):
    """The input is not bpftrace output at all (not merely cut short)."""


def parse_value(text: str) -> int:
    """``'1K'`` -> 1024, ``'-4'`` -> -4, ``'512'`` -> 512."""
    m = re.fullmatch(r"(-?\d+)([KMGTPE]?)", text.strip())
    if not m:
        raise ValueError(f"not a bpftrace bucket value: {text!r}")
    return int(m.group(1)) * _SUFFIX[m.group(2)]


@dataclass(frozen=True)
class Bucket:
    """Values v with lo <= v < hi; None is an open end."""

    lo: int | None
    hi: int | None
    count: int

    @property
    def representative(self) -> float:
        """A single value standing for the bucket: its lower bound for ranges
        starting at a power of two or a single value, else the midpoint."""
        if self.lo is None:
            return float(self.hi - 1) if self.hi is not None else 0.0
        if self.hi is None or self.hi - self.lo == 1:
            return float(self.lo)
        return (self.lo + self.hi) / 2.0


@dataclass
class Hist:
    buckets: list[Bucket] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(b.count for b in self.buckets)

    def mean(self) -> float:
        n = self.total
        return sum(b.representative * b.count for b in self.buckets) / n if n else math.nan

    def quantile(self, q: float) -> float:
        """Upper edge of the bucket holding the q-quantile (conservative)."""
        n = self.total
        if not n:
            return math.nan
        rank = q * n
        seen = 0
        for b in self.buckets:
            seen += b.count
            if seen >= rank and b.count:
                if b.hi is None:
                    return float(b.lo)
                return float(b.hi - 1) if b.hi - (b.lo or 0) == 1 else float(b.hi)
        last = self.buckets[-1]
        return float(last.lo if last.hi is None else last.hi)

    def merged(self, other: "Hist") -> "Hist":
        acc: dict[tuple, int] = {}
        for b in self.buckets + other.buckets:
            acc[(b.lo, b.hi)] = acc.get((b.lo, b.hi), 0) + b.count
        def key(item):
            lo, hi = item[0]
            return (-math.inf if lo is None else lo, math.inf if hi is None else hi)
        return Hist([Bucket(lo, hi, c) for (lo, hi), c in sorted(acc.items(), key=key)])

    def to_json(self) -> list[dict]:
        return [{"lo": b.lo, "hi": b.hi, "count": b.count} for b in self.buckets]


@dataclass(frozen=True)
class Stats:
    count: int
    average: int
    total: int


Value = int | Hist | Stats


@dataclass
class Trace:
    """maps[name][key] -> value; key is "" for a map without keys and keys
    with several parts are joined by "," (no spaces), as bpftrace's JSON does."""

    maps: dict[str, dict[str, Value]] = field(default_factory=dict)
    meta: dict[str, str] = field(default_factory=dict)
    window_ns: int | None = None
    active_span_ns: int | None = None
    lines: list[str] = field(default_factory=list)
    truncated: bool = False
    problems: list[str] = field(default_factory=list)

    def get(self, name: str, key: str = "") -> Value | None:
        return self.maps.get(name, {}).get(key)

    def number(self, name: str, key: str = "") -> int:
        v = self.get(name, key)
        if isinstance(v, int):
            return v
        if isinstance(v, Stats):
            return v.count
        if isinstance(v, Hist):
            return v.total
        return 0

    def hist(self, name: str, key: str = "") -> Hist | None:
        v = self.get(name, key)
        return v if isinstance(v, Hist) else None

    def to_json(self) -> dict:
        def enc(v: Value):
            if isinstance(v, Hist):
                return {"hist": v.to_json()}
            if isinstance(v, Stats):
                return {"count": v.count, "average": v.average, "total": v.total}
            return v
        return {"meta": self.meta, "window_ns": self.window_ns, "active_span_ns": self.active_span_ns, "truncated": self.truncated,
                "problems": self.problems,
                "maps": {n: {k: enc(v) for k, v in d.items()} for n, d in self.maps.items()}}


def _norm_key(key: str | None) -> str:
    return "" if key is None else ",".join(part.strip() for part in key.split(","))


def _bucket_from_text(m: re.Match) -> Bucket:
    lo_s, hi_s = m.group("lo"), m.group("hi")
    count = int(m.group("count"))
    lo = None if lo_s == "..." else parse_value(lo_s)
    if hi_s is None:  # [0] or [1]: one value
        return Bucket(lo, None if lo is None else lo + 1, count)
    hi = None if hi_s == "..." else parse_value(hi_s)
    if hi is not None and m.group("close") == "]":
        hi += 1
    if lo is not None and m.group("open") == "(":
        lo += 1
    return Bucket(lo, hi, count)


def parse_text(text: str) -> Trace:
    tr = Trace()
    cur: Hist | None = None
    cur_name = ""
    saw_map = False
    for raw in text.splitlines():
        line = raw.rstrip("\n")
        if cur is not None:
            m = _BUCKET_RE.match(line)
            if m:
                cur.buckets.append(_bucket_from_text(m))
                continue
            if line.lstrip().startswith(("[", "(")):
                tr.truncated = True
                tr.problems.append(f"cut bucket line in {cur_name}: {line.strip()!r}")
                continue
            cur = None
        if not line.strip():
            continue
        if line.startswith("# kvtier "):
            k, _, v = line[len("# kvtier "):].partition(":")
            tr.meta[k.strip()] = v.strip()
            continue
        m = _WINDOW_RE.match(line.strip())
        if m:
            tr.window_ns = int(m.group(1))
            continue
        m = _SPAN_RE.match(line.strip())
        if m:
            tr.active_span_ns = int(m.group(1))
            continue
        m = _HEADER_RE.match(line.strip())
        if m:
            saw_map = True
            name, key, rest = m.group("name"), _norm_key(m.group("key")), m.group("rest").strip()
            slot = tr.maps.setdefault(name, {})
            if not rest:
                cur = slot[key] = Hist()
                cur_name = f"@{name}[{key}]" if key else f"@{name}"
            elif (sm := _STATS_RE.match(rest)):
                slot[key] = Stats(*(int(x) for x in sm.groups()))
            elif re.fullmatch(r"-?\d+", rest):
                slot[key] = int(rest)
            else:
                tr.problems.append(f"unparsed value for @{name}: {rest!r}")
            continue
        tr.lines.append(line)
    if tr.window_ns is None and saw_map:
        tr.problems.append("no capture_window_ns line: the capture did not reach END")
    if tr.window_ns is None:
        tr.truncated = True
    return tr


def _bucket_from_json(d: dict) -> Bucket:
    lo = d.get("min")
    hi = d.get("max")
    return Bucket(lo, None if hi is None else hi + 1, int(d.get("count", 0)))


def parse_json(text: str) -> Trace:
    tr = Trace()
    saw = False
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        try:
            ev = json.loads(line)
        except json.JSONDecodeError:
            if line.startswith("{"):
                tr.truncated = True
                tr.problems.append(f"line {n}: cut JSON record")
                continue
            tr.lines.append(line)
            continue
        if not isinstance(ev, dict):
            continue
        saw = True
        kind, data = ev.get("type"), ev.get("data")
        if kind == "kvtier_meta" and isinstance(data, dict):
            tr.meta.update({k: str(v) for k, v in data.items()})
        elif kind == "printf" and isinstance(data, str):
            for pl in data.splitlines():
                m = _WINDOW_RE.match(pl.strip())
                ms = _SPAN_RE.match(pl.strip())
                if m:
                    tr.window_ns = int(m.group(1))
                elif ms:
                    tr.active_span_ns = int(ms.group(1))
                elif pl.strip():
                    tr.lines.append(pl)
        elif kind in ("map", "hist", "stats") and isinstance(data, dict):
            for mname, val in data.items():
                name = mname.lstrip("@")
                slot = tr.maps.setdefault(name, {})
                keyed = isinstance(val, dict) and not (kind == "stats" and "count" in val)
                items = val.items() if keyed else [("", val)]
                for key, v in items:
                    key = _norm_key(str(key))
                    if kind == "hist":
                        slot[key] = Hist([_bucket_from_json(b) for b in v or []])
                    elif kind == "stats":
                        slot[key] = Stats(int(v["count"]), int(v["average"]), int(v["total"]))
                    elif isinstance(v, (int, float)):
                        slot[key] = int(v)
    if not saw and text.strip():
        raise TraceParseError("no bpftrace JSON records found")
    if tr.window_ns is None:
        tr.truncated = True
        if tr.maps:
            tr.problems.append("no capture_window_ns record: the capture did not reach END")
    return tr


def parse_trace(text: str) -> Trace:
    """Text or JSON, told apart by the first record."""
    for line in text.splitlines():
        s = line.strip()
        if not s:
            continue
        if s.startswith("{"):
            return parse_json(text)
        break
    tr = parse_text(text)
    if not tr.maps and tr.window_ns is None and not tr.meta:
        if text.strip():
            raise TraceParseError("no bpftrace maps found (is this a bpftrace trace?)")
    return tr
