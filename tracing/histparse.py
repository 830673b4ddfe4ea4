"""Parse bpftrace map output, text or ``-f json``, into plain Python objects.

Every bucket form bpftrace prints is understood: single values ``[0]``,
``[1]``; log2 ranges ``[2, 4)``, ``[512, 1K)``, ``[1M, 2M)``; linear ranges
``[7, 8)``; open ends ``(..., 0)``, ``[10, ...)``, ``[1M, ...)``; closed
ranges ``[-4, -2]``; and negative values. Suffixes K, M, G, T, P, E are
powers of 1024, as bpftrace prints them. A capture cut short is parsed as
far as it goes and flagged ``truncated``, the reasons in ``cuts``, never
dropped silently. A cut is seen by what a whole capture always has:

* the ``capture_window_ns`` line END prints before the maps;
* the wrapper's end marker (``# kvtier missed_events`` / a ``kvtier_meta``
  record with ``missed_events``), appended after bpftrace exits, in every
  trace that starts with the wrapper's header (``layers_on``);
* the blank line bpftrace prints after every histogram's last bucket;
* a newline at the end of the last line, whole bucket lines and JSON records.

A raw bpftrace capture (no wrapper header) cut exactly between two maps
that are not histograms cannot be told from a whole one. Input that is not
bpftrace output at all (empty, another format, JSON of another shape,
non-integral or non-finite numbers where bpftrace prints integers) raises
``TraceParseError``.

Standard library only: this file is copied onto nodes on its own.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from dataclasses import dataclass, field

__all__ = [
    "Bucket",
    "Hist",
    "Stats",
    "Trace",
    "TraceParseError",
    "parse_json",
    "parse_text",
    "parse_trace",
    "parse_value",
    "read_trace",
]

_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50, "E": 1 << 60}
_NUM = r"-?\d+[KMGTPE]?"
_BUCKET_RE = re.compile(
    rf"^\s*(?P<open>[\[(])\s*(?P<lo>{_NUM}|\.\.\.)\s*(?:,\s*(?P<hi>{_NUM}|\.\.\.)\s*)?(?P<close>[\])])"
    r"\s+(?P<count>-?\d+)\s*(?:\|.*)?$"
)
_HEADER_RE = re.compile(r"^@(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:\[(?P<key>.*)\])?:\s*(?P<rest>.*)$")
_STATS_RE = re.compile(r"^count (-?\d+), average (-?\d+), total (-?\d+)$")
_WINDOW_RE = re.compile(r"^capture_window_ns:\s*(\d+)\s*$")
_SPAN_RE = re.compile(r"^active_span_ns:\s*(\d+)\s*$")


class TraceParseError(ValueError):
    """The input is not bpftrace output at all (not merely cut short)."""


MAX_TRACE_BYTES = 256 << 20  # bpftrace maps are bounded (4096 keys by default): a trace is a few MB


def read_trace(path) -> str:
    """The text of a trace file, or TraceParseError saying what it is not
    (OSError when it cannot be read at all). A FIFO or device is refused
    before it is opened: reading one could block or never end."""
    st = os.stat(path)
    if stat.S_ISDIR(st.st_mode):
        raise TraceParseError("is a directory, not a trace file")
    if not stat.S_ISREG(st.st_mode):
        raise TraceParseError("is not a regular file (a FIFO or device?): give a saved trace file")
    if st.st_size > MAX_TRACE_BYTES:
        raise TraceParseError(
            f"is {st.st_size >> 20} MiB: too big for a bpftrace map dump (at most {MAX_TRACE_BYTES >> 20} MiB)"
        )
    with open(path, "rb") as f:
        data = f.read(MAX_TRACE_BYTES + 1)
    if b"\0" in data:
        raise TraceParseError("no bpftrace histograms found: a binary file")
    # utf-8-sig: an editor's BOM must not hide the first line; a comm name
    # that is not UTF-8 must not stop the parse
    return data.decode("utf-8-sig", errors="replace")


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

    def merged(self, other: Hist) -> Hist:
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
    cuts: list[str] = field(default_factory=list)  # why it is truncated (also in problems)
    attached: bool = False  # bpftrace's "Attaching N probes" was seen: it started

    def cut(self, why: str) -> None:
        self.truncated = True
        self.cuts.append(why)
        self.problems.append(why)

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

        return {
            "meta": self.meta,
            "window_ns": self.window_ns,
            "active_span_ns": self.active_span_ns,
            "truncated": self.truncated,
            "cuts": self.cuts,
            "problems": self.problems,
            "maps": {n: {k: enc(v) for k, v in d.items()} for n, d in self.maps.items()},
        }


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
    for raw in text.splitlines():
        line = raw.rstrip("\n")
        if cur is not None:
            m = _BUCKET_RE.match(line)
            if m:
                bucket = _bucket_from_text(m)
                if bucket.count < 0:  # a whole line with a bad number, not a cut one: said as such, as in JSON
                    raise TraceParseError(f"{cur_name}: negative bucket count {bucket.count} in {line.strip()!r}")
                cur.buckets.append(bucket)
                continue
            if line.lstrip().startswith(("[", "(")):
                tr.cut(f"cut bucket line in {cur_name}: {line.strip()!r}")
                cur = None  # said once: not again as "no blank line" at the end
                continue
            cur = None
        if not line.strip():
            continue
        if line.startswith("# kvtier "):
            k, _, v = line[len("# kvtier ") :].partition(":")
            tr.meta[k.strip()] = v.strip()
            continue
        if line.startswith("Attaching ") and "probe" in line:
            tr.attached = True
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
            name, key, rest = m.group("name"), _norm_key(m.group("key")), m.group("rest").strip()
            slot = tr.maps.setdefault(name, {})
            if not rest:
                cur = slot[key] = Hist()
                cur_name = f"@{name}[{key}]" if key else f"@{name}"
            elif sm := _STATS_RE.match(rest):
                slot[key] = Stats(*(int(x) for x in sm.groups()))
            elif re.fullmatch(r"-?\d+", rest):
                slot[key] = int(rest)
            else:
                tr.problems.append(f"unparsed value for @{name}: {rest!r}")
            continue
        tr.lines.append(line)
    if cur is not None:  # bpftrace ends every histogram with a blank line
        tr.cut(f"{cur_name} cut off: no blank line after its last bucket")
    _common_cuts(tr, text, "line", "# kvtier missed_events")
    return tr


def _common_cuts(tr: Trace, text: str, what: str, marker: str) -> None:
    if text.strip() and not text.endswith(("\n", "\r")):
        tr.cut(f"the last {what} has no newline: cut mid-{what}")
    if tr.window_ns is None:
        tr.cut("no capture_window_ns: the capture did not reach END")
    if "layers_on" in tr.meta and "missed_events" not in tr.meta:
        tr.cut(f"no end marker ({marker}) after the maps: the file was cut")


def _int(v, where: str) -> int:
    """bpftrace prints integers: anything else (NaN, 1.7, "x", true) is not its output."""
    if isinstance(v, bool) or not isinstance(v, int):
        if isinstance(v, float) and math.isfinite(v) and v == int(v):
            return int(v)
        raise TraceParseError(f"{where}: {v!r} is not an integer")
    return v


def _bucket_from_json(d, where: str) -> Bucket:
    if not isinstance(d, dict):
        raise TraceParseError(f"{where}: bucket {d!r} is not an object")
    lo = None if d.get("min") is None else _int(d["min"], where)
    hi = None if d.get("max") is None else _int(d["max"], where)
    count = _int(d.get("count", 0), where)
    if count < 0:
        raise TraceParseError(f"{where}: negative bucket count {count}")
    return Bucket(lo, None if hi is None else hi + 1, count)


def _stats_from_json(v, where: str) -> Stats:
    if not isinstance(v, dict) or not {"count", "average", "total"} <= v.keys():
        raise TraceParseError(f"{where}: stats {v!r} lack count, average, total")
    st = Stats(*(_int(v[k], where) for k in ("count", "average", "total")))
    if st.count < 0:
        raise TraceParseError(f"{where}: negative stats count {st.count}")
    return st


def parse_json(text: str) -> Trace:
    tr = Trace()
    saw = False
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        try:
            ev = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            if line.startswith("{"):
                tr.cut(f"line {n}: cut JSON record")
                continue
            tr.lines.append(line)
            continue
        if not isinstance(ev, dict) or not isinstance(ev.get("type"), str):
            continue
        saw = True
        kind, data = ev.get("type"), ev.get("data")
        where = f"line {n}"
        if kind == "attached_probes":
            tr.attached = True
        elif kind == "kvtier_meta" and isinstance(data, dict):
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
        elif kind in ("map", "hist", "stats"):
            if not isinstance(data, dict):
                raise TraceParseError(f"{where}: a {kind} record whose data is not an object")
            for mname, val in data.items():
                name = mname.lstrip("@")
                where = f"line {n}, {mname}"
                keyed = isinstance(val, dict) and not (kind == "stats" and "count" in val)
                items = val.items() if keyed else [("", val)]
                for key, v in items:
                    key = _norm_key(str(key))
                    if kind == "hist":
                        if not isinstance(v, list):
                            raise TraceParseError(f"{where}: histogram {v!r} is not a list of buckets")
                        value = Hist([_bucket_from_json(b, where) for b in v])
                    elif kind == "stats":
                        value = _stats_from_json(v, where)
                    elif isinstance(v, (int, float)):
                        value = _int(v, where)
                    else:
                        continue  # strings and other map values: not ours, not needed
                    tr.maps.setdefault(name, {})[key] = value
    if not saw and text.strip():
        raise TraceParseError("no bpftrace histograms found: JSON, but no bpftrace records")
    _common_cuts(tr, text, "record", "a kvtier_meta record with missed_events")
    return tr


def parse_trace(text: str) -> Trace:
    """Text or JSON, told apart by the first record. TraceParseError when
    the text holds no map, no END line, no wrapper header and no sign that
    bpftrace ran: empty, or not bpftrace output."""
    text = text.lstrip("\ufeff")
    for line in text.splitlines():
        s = line.strip()
        if not s:
            continue
        if s.startswith("{"):
            tr = parse_json(text)
            break
        tr = parse_text(text)
        break
    else:
        raise TraceParseError("no bpftrace histograms found: the file is empty")
    if not any(tr.maps.values()) and tr.window_ns is None and not tr.meta and not tr.attached:
        raise TraceParseError("no bpftrace histograms found: not bpftrace output")
    return tr
