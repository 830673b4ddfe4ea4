"""Pieces the output writers share: the tables every format shows (per-tier rows, QoS rows, autoscaling rows,
flattened key/value pairs), read from a results document with older files in mind (any section may be missing)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

from kvconnector.units import GB

OPS = ("read", "write")
LATENCY_KEYS = ("mean", "p50", "p90", "p95", "p99", "p999", "max")


def elapsed_s(doc: dict) -> float:
    return float((doc.get("summary") or {}).get("elapsed_time") or 0.0)


def tier_event_names(doc: dict) -> list[str]:
    names: list[str] = []
    for t in (doc.get("tiers") or {}).values():
        for k in t.get("events") or {}:
            if k not in names:
                names.append(k)
    return names


def tier_rows(doc: dict) -> list[dict[str, Any]]:
    """One row per tier and operation, in tier order (fastest first): counts, volume, bandwidth and latencies in ms."""
    elapsed = elapsed_s(doc)
    rows = []
    for name, t in (doc.get("tiers") or {}).items():
        for op in OPS:
            o = t.get(op)
            if not o:
                continue
            lat, host, dev = o.get("latency_ms") or {}, o.get("host_ms") or {}, o.get("device_ms") or {}
            nbytes = o.get("bytes", 0)
            rows.append(
                {
                    "tier": name,
                    "op": op,
                    "ops": o.get("ops", 0),
                    "gb": nbytes / GB,
                    "gbps": nbytes / GB / elapsed if elapsed else 0.0,
                    "p50_ms": lat.get("p50"),
                    "p95_ms": lat.get("p95"),
                    "p99_ms": lat.get("p99"),
                    "p999_ms": lat.get("p999"),
                    "host_p50_ms": host.get("p50"),
                    "host_p99_ms": host.get("p99"),
                    "device_p50_ms": dev.get("p50"),
                    "device_p99_ms": dev.get("p99"),
                    "events": dict(t.get("events") or {}),
                }
            )
    return rows


def sla_verdict_text(c: dict) -> str:
    """A QoS class's SLA verdict, "met", "missed" or "no data" (no request completed): from `sla.verdict`, or
    derived for results written before it existed, which said met=false for a class with 0 requests."""
    sla = c.get("sla") or {}
    if sla.get("verdict"):
        return sla["verdict"]
    if not c.get("requests") or sla.get("met") is None:
        return "no data"
    return "met" if sla["met"] else "missed"


def qos_rows(doc: dict) -> list[dict[str, Any]]:
    """One row per QoS class, highest priority first."""
    classes = (doc.get("summary") or {}).get("qos_metrics") or {}
    rows = []
    for name, c in classes.items():
        e2e, svc, sla = c.get("end_to_end_latency_ms") or {}, c.get("service_latency_ms") or {}, c.get("sla") or {}
        rows.append(
            {
                "class": name,
                "priority": c.get("priority"),
                "requests": c.get("requests"),
                "e2e_p50_ms": e2e.get("p50"),
                "e2e_p95_ms": e2e.get("p95"),
                "e2e_p99_ms": e2e.get("p99"),
                "service_p50_ms": svc.get("p50"),
                "service_p95_ms": svc.get("p95"),
                "service_p99_ms": svc.get("p99"),
                "target_p95_ms": sla.get("target_p95_ms"),
                "target_p99_ms": sla.get("target_p99_ms"),
                "met": sla.get("met") if c.get("requests") else None,
                "verdict": sla_verdict_text(c),
            }
        )
    rows.sort(key=lambda r: -(r["priority"] or 0))
    return rows


def autoscaling_rows(doc: dict) -> list[dict[str, Any]]:
    return [dict(s) for s in doc.get("autoscaling_stats") or []]


def scalar_text(value: Any) -> Any:
    """A value as one spreadsheet cell: numbers, strings and booleans as they are, lists and dicts as JSON text."""
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, separators=(", ", ": "))
    return value


def flatten(obj: Any, prefix: str = "", skip: tuple[str, ...] = ()) -> Iterator[tuple[str, Any]]:
    """(dotted.key, leaf) pairs. Dicts are walked; a list of dicts is walked with its index as a key part; any other
    list is one leaf. Keys named in `skip` are left out wherever they appear."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k in skip:
                continue
            yield from flatten(v, f"{prefix}.{k}" if prefix else str(k), skip)
    elif isinstance(obj, list) and obj and all(isinstance(x, dict) for x in obj):
        for i, v in enumerate(obj):
            yield from flatten(v, f"{prefix}.{i}" if prefix else str(i), skip)
    else:
        yield prefix, obj


def timeline_series(doc: dict) -> dict[str, Any] | None:
    """The timeline as columns, with rates derived from its cumulative counters: each sample's rate is over the
    interval since the previous sample (the first one since the run's start, when every counter was zero).
    None when the document has no timeline."""
    samples = sorted((s for s in doc.get("timeline") or [] if "t_s" in s), key=lambda s: s["t_s"])
    if not samples:
        return None
    tiers: list[str] = []
    for s in samples:
        tiers += [n for n in s.get("tiers") or {} if n not in tiers]
    out: dict[str, Any] = {
        "t_s": [],
        "requests": [],
        "requests_per_s": [],
        "read_gbps": [],
        "write_gbps": [],
        "users": [],
        "used_gb": {n: [] for n in tiers},
        "entries": {n: [] for n in tiers},
    }
    prev = {"t_s": 0.0, "requests": 0, "read_bytes": 0, "written_bytes": 0}
    for s in samples:
        dt = s["t_s"] - prev["t_s"]
        if dt <= 0:  # a duplicate instant: no interval to take a rate over
            continue
        out["t_s"].append(s["t_s"])
        out["requests"].append(s.get("requests", 0))
        out["requests_per_s"].append((s.get("requests", 0) - prev.get("requests", 0)) / dt)
        out["read_gbps"].append((s.get("read_bytes", 0) - prev.get("read_bytes", 0)) / GB / dt)
        out["write_gbps"].append((s.get("written_bytes", 0) - prev.get("written_bytes", 0)) / GB / dt)
        out["users"].append(s.get("users"))
        for n in tiers:
            t = (s.get("tiers") or {}).get(n) or {}
            out["used_gb"][n].append(t.get("used_bytes", 0) / GB)
            out["entries"][n].append(t.get("entries", 0))
        prev = s
    if all(u is None for u in out["users"]):
        out["users"] = None
    return out if out["t_s"] else None


def default_labels(paths: list[str]) -> list[str]:
    """Labels for result files (kvtier compare, kvtier report): file names without their extension; where two collide,
    with their parent directory too; where those still collide, numbered."""

    def name(p: str, depth: int) -> str:
        parts = os.path.normpath(os.path.abspath(p)).split(os.sep)
        stem = os.path.splitext(parts[-1])[0]
        return "/".join([*parts[-depth:-1], stem]) if depth > 1 else stem

    labels = [name(p, 1) for p in paths]
    if len(set(labels)) < len(labels):
        labels = [name(p, 2) for p in paths]
    if len(set(labels)) < len(labels):
        labels = [f"{lab} #{i + 1}" for i, lab in enumerate(labels)]
    return labels


def run_labels(labels: str | None, paths: list[str]) -> list[str]:
    """The name of each result file's column or series (kvtier compare, kvtier report): `--labels` split at commas,
    spaces around each name dropped, or else `default_labels`. ValueError, said in one line, for names that do not
    name each file once: too many or too few, an empty one (`a,` or `,b`), one name given twice."""
    if labels is None:
        return default_labels(paths)
    if not labels.strip():
        raise ValueError(f"--labels is empty; give one name per file ({len(paths)})")
    names = [s.strip() for s in labels.split(",")]
    if len(names) != len(paths):
        raise ValueError(f"--labels has {len(names)} names for {len(paths)} files")
    if not all(names):
        raise ValueError(f"--labels {labels!r}: name {names.index('') + 1} is empty")
    twice = sorted({x for x in names if names.count(x) > 1})
    if twice:  # two columns or series of one name: nobody could tell them apart
        raise ValueError(f"--labels {labels!r}: {twice[0]!r} names two files")
    return names


def distinct_files(paths: list[str]) -> None:
    """ValueError when two of `paths` are one file (the same name twice, a link to it, ./a and a): a run beside
    itself shows nothing. A path that cannot be looked at is left to the reader, which says why."""
    seen: dict[tuple[int, int], str] = {}
    for p in paths:
        try:
            st = os.stat(p)
        except OSError:
            continue
        first = seen.get((st.st_dev, st.st_ino))
        if first is None:
            seen[(st.st_dev, st.st_ino)] = p
        else:
            said = f"{p!r} is given twice" if p == first else f"{first!r} and {p!r} are the same file"
            raise ValueError(f"{said}; give each result once")
