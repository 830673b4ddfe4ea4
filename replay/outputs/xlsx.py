"""The results document as an Excel workbook: one sheet per view a person opens first (summary, run parameters,
per-tier performance, QoS classes, autoscaler steps, ...). Numbers stay numbers (formatted, not turned into text), so
the sheets can be charted and summed as they are."""

from __future__ import annotations

import os
from typing import Any

from ._common import (
    GB,
    LATENCY_KEYS,
    autoscaling_rows,
    flatten,
    qos_rows,
    scalar_text,
    tier_event_names,
    tier_rows,
    timeline_series,
)
from .paths import atomic_path

__all__ = ["SHEETS", "write_xlsx"]

SHEETS = (
    "summary",
    "run parameters",
    "per-tier performance",
    "QoS",
    "autoscaling",
    "timeline",
    "clients",
    "environment",
    "latency tracing",
)

_REQUEST_LATENCIES = (
    ("end to end", "end_to_end_latency_ms"),
    ("storage I/O", "storage_io_latency_ms"),
    ("generation", "generation_latency_ms"),
    ("queue wait", "queue_wait_latency_ms"),
)
_HEADLINE = (
    ("requests completed", "total_requests", ""),
    ("requests per second", "requests_per_second", "1/s"),
    ("tokens (prompt + generated)", "prompt_and_generated_tokens", "tokens"),
    ("prompt tokens", "prompt_tokens", "tokens"),
    ("generated tokens", "generated_tokens", "tokens"),
    ("tokens per second", "avg_throughput_tokens_per_sec", "tokens/s"),
    ("prompt + generated tokens per second", "prompt_and_generated_tokens_per_sec", "tokens/s"),
    ("tokens per storage I/O second", "storage_throughput_tokens_per_sec", "tokens/s"),
    ("storage tier tokens per second", "storage_tier_tokens_per_sec", "tokens/s"),
    ("elapsed", "elapsed_time", "s"),
)
# Summary sections with their own sheet or table; every other dict in `summary` is listed key by key.
_SUMMARY_ELSEWHERE = {"qos_metrics", "status"} | {k for _, k in _REQUEST_LATENCIES}


def write_xlsx(doc: dict, path: str | os.PathLike) -> None:
    """Write the workbook to `path` atomically (a temporary file in the same directory, then a rename)."""
    from openpyxl import Workbook

    wb = Workbook()
    wb.remove(wb.active)
    _summary(wb.create_sheet("summary"), doc)
    _run_parameters(wb.create_sheet("run parameters"), doc)
    _tiers(wb.create_sheet("per-tier performance"), doc)
    _qos(wb.create_sheet("QoS"), doc)
    _autoscaling(wb.create_sheet("autoscaling"), doc)
    _timeline(wb.create_sheet("timeline"), doc)
    _clients(wb.create_sheet("clients"), doc)
    _environment(wb.create_sheet("environment"), doc)
    _latency_tracing(wb.create_sheet("latency tracing"), doc)
    with atomic_path(path, suffix=".xlsx.tmp") as tmp:
        wb.save(tmp)


# ---- cell helpers ------------------------------------------------------------------------------------------------
def _fmt(value: Any) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return "#,##0"
    if isinstance(value, float):
        return "#,##0.0###" if abs(value) >= 1 or value == 0 else "0.0#####"
    return None


def _put(ws, row: int, col: int, value: Any, bold: bool = False):
    from openpyxl.styles import Font

    cell = ws.cell(row=row, column=col, value=scalar_text(value))
    fmt = _fmt(value)
    if fmt:
        cell.number_format = fmt
    if bold:
        cell.font = Font(bold=True)
    return cell


def _header(ws, row: int, names: list[str], notes: dict[str, str] | None = None) -> None:
    from openpyxl.comments import Comment
    from openpyxl.styles import PatternFill

    fill = PatternFill("solid", fgColor="DDE4EE")
    for i, name in enumerate(names, start=1):
        cell = _put(ws, row, i, name, bold=True)
        cell.fill = fill
        if notes and name in notes:
            cell.comment = Comment(notes[name], "kvtier")


def _table(ws, names: list[str], rows: list[list[Any]], notes: dict[str, str] | None = None, empty: str = "") -> None:
    """A header in row 1 (frozen) and one row per record; `empty` is said in row 2 when there are no records."""
    _header(ws, 1, names, notes)
    ws.freeze_panes = "A2"
    if not rows and empty:
        _put(ws, 2, 1, empty)
    for r, values in enumerate(rows, start=2):
        for c, v in enumerate(values, start=1):
            _put(ws, r, c, v)
    _widths(ws)


def _widths(ws, cap: int = 60) -> None:
    from openpyxl.utils import get_column_letter

    widths: dict[int, int] = {}
    for row in ws.iter_rows():
        for cell in row:
            if cell.value is None:
                continue
            v = cell.value
            n = len(f"{v:,.4f}") if isinstance(v, float) else len(f"{v:,}") if isinstance(v, int) else len(str(v))
            widths[cell.column] = max(widths.get(cell.column, 0), n)
    for col, n in widths.items():
        ws.column_dimensions[get_column_letter(col)].width = min(cap, max(8, n + 2))


# ---- sheets ------------------------------------------------------------------------------------------------------
def _summary(ws, doc: dict) -> None:
    s = doc.get("summary") or {}
    model = doc.get("model") or {}
    r = 1
    _header(ws, r, ["metric", "value", "unit"])
    ws.freeze_panes = "A2"

    def kv(label: str, value: Any, unit: str = "") -> None:
        nonlocal r
        r += 1
        _put(ws, r, 1, label)
        _put(ws, r, 2, value)
        if unit:
            _put(ws, r, 3, unit)

    def section(title: str) -> None:
        nonlocal r
        r += 2
        _put(ws, r, 1, title, bold=True)

    kv("status", doc.get("status", s.get("status")))
    if doc.get("error"):
        kv("error", doc["error"])
    kv("started at", doc.get("started_at"))
    kv("model", model.get("name"))
    kv("KV bytes per token", model.get("bytes_per_token"), "bytes")
    kv("KV dtype", model.get("kv_dtype"))
    kv("kvtier version", doc.get("kvtier_version"))
    for label, key, unit in _HEADLINE:
        if key in s:
            kv(label, s[key], unit)

    section("request latency (ms)")
    r += 1
    _header(ws, r, ["latency", *LATENCY_KEYS, "count"])
    for label, key in _REQUEST_LATENCIES:
        d = s.get(key)
        if not d:
            continue
        r += 1
        for c, v in enumerate([label, *(d.get(k) for k in LATENCY_KEYS), d.get("count")], start=1):
            _put(ws, r, c, v)

    for key, value in s.items():
        if key in _SUMMARY_ELSEWHERE or not isinstance(value, dict):
            continue
        section(key)
        for sub, v in flatten(value):
            kv(sub, v)
    blk = doc.get("block_device")
    if blk:
        section("block_device (whole device, the run's window)")
        for sub, v in flatten(blk):
            if sub != "note":
                kv(sub, v, "GB/s" if sub.endswith("_gbps") else "bytes" if sub.endswith("_bytes") else "")
    if doc.get("fallbacks"):
        section("fallbacks (counted, never silent)")
        for sub, v in flatten(doc["fallbacks"]):
            kv(sub, v)
    if doc.get("notes"):
        section("notes")
        for note in doc["notes"]:
            kv(note, None)
    _widths(ws)
    ws.column_dimensions["A"].width = 44


def _run_parameters(ws, doc: dict) -> None:
    rows = [[k, v] for k, v in flatten(doc.get("config") or {})]
    _table(ws, ["parameter", "value"], rows, empty="no config in this results file")


_TIER_NOTES = {
    "GB/s": "bytes moved / elapsed wall-clock time of the run (not / busy time)",
    "host p50 ms": "CPU work around the I/O: copies, checksums, buffer handling",
    "device p50 ms": "time inside the I/O system calls (disk tiers) or the memory copy (memory tiers)",
}


def _tiers(ws, doc: dict) -> None:
    events = tier_event_names(doc)
    names = [
        "tier",
        "op",
        "ops",
        "GB",
        "GB/s",
        "p50 ms",
        "p95 ms",
        "p99 ms",
        "p999 ms",
        "host p50 ms",
        "host p99 ms",
        "device p50 ms",
        "device p99 ms",
        *(f"{e} (tier)" for e in events),
    ]
    notes = dict(_TIER_NOTES)
    for e in events:
        notes[f"{e} (tier)"] = "an event count of the whole tier, repeated on its read and write rows"
    rows = [
        [
            t["tier"],
            t["op"],
            t["ops"],
            t["gb"],
            t["gbps"],
            t["p50_ms"],
            t["p95_ms"],
            t["p99_ms"],
            t["p999_ms"],
            t["host_p50_ms"],
            t["host_p99_ms"],
            t["device_p50_ms"],
            t["device_p99_ms"],
            *(t["events"].get(e, 0) for e in events),
        ]
        for t in tier_rows(doc)
    ]
    _table(ws, names, rows, notes, empty="no tiers in this results file")


def _qos(ws, doc: dict) -> None:
    names = [
        "class",
        "priority",
        "requests",
        "e2e p50 ms",
        "e2e p95 ms",
        "e2e p99 ms",
        "service p50 ms",
        "service p95 ms",
        "service p99 ms",
        "target p95 ms",
        "target p99 ms",
        "SLA",
    ]
    notes = {
        "service p95 ms": "service latency = end to end minus simulated generation; the SLA is judged on it",
        "SLA": "met when the class's service latency met its p95 and p99 targets, missed when not, "
        "no data when it completed no request",
    }
    rows = [
        [
            q["class"],
            q["priority"],
            q["requests"],
            q["e2e_p50_ms"],
            q["e2e_p95_ms"],
            q["e2e_p99_ms"],
            q["service_p50_ms"],
            q["service_p95_ms"],
            q["service_p99_ms"],
            q["target_p95_ms"],
            q["target_p99_ms"],
            q["verdict"],
        ]
        for q in qos_rows(doc)
    ]
    _table(ws, names, rows, notes, empty="no QoS classes in this run")


def _autoscaling(ws, doc: dict) -> None:
    steps = autoscaling_rows(doc)
    known = ["t_s", "users", "next_users", "throughput_tokens_per_sec", "saturation", "action", "reason"]
    names = [k for k in known if any(k in s for s in steps)] or known
    extra: list[str] = []
    for s in steps:
        extra += [k for k in s if k not in names and k not in extra]
    names += extra
    rows = [[s.get(k) for k in names] for s in steps]
    _table(ws, names, rows, empty="no autoscaling in this run")


def _timeline(ws, doc: dict) -> None:
    ts = timeline_series(doc)
    tiers = list(ts["used_gb"]) if ts else []
    users = bool(ts and ts["users"])
    names = [
        "t_s",
        "requests",
        "requests/s",
        "read GB/s",
        "write GB/s",
        *(["users"] if users else []),
        *(f"{t} used GB" for t in tiers),
        *(f"{t} entries" for t in tiers),
    ]
    notes = {"requests/s": "rates over the interval since the previous sample (cumulative counters differenced)"}
    rows = []
    if ts:
        for i, t in enumerate(ts["t_s"]):
            rows.append(
                [
                    t,
                    ts["requests"][i],
                    ts["requests_per_s"][i],
                    ts["read_gbps"][i],
                    ts["write_gbps"][i],
                    *([ts["users"][i]] if users else []),
                    *(ts["used_gb"][n][i] for n in tiers),
                    *(ts["entries"][n][i] for n in tiers),
                ]
            )
    _table(ws, names, rows, notes, empty="no timeline in this results file")


def _clients(ws, doc: dict) -> None:
    names = [
        "client",
        "status",
        "requests",
        "requests/s",
        "tokens/s",
        "e2e p50 ms",
        "e2e p95 ms",
        "e2e p99 ms",
        "storage I/O p95 ms",
        "elapsed s",
    ]
    rows = []
    for i, c in enumerate(doc.get("clients") or []):
        s = c.get("summary") or {}
        e2e, sio = s.get("end_to_end_latency_ms") or {}, s.get("storage_io_latency_ms") or {}
        rows.append(
            [
                c.get("client_id", c.get("name", i)),
                c.get("status", s.get("status")),
                s.get("total_requests"),
                s.get("requests_per_second"),
                s.get("avg_throughput_tokens_per_sec"),
                e2e.get("p50"),
                e2e.get("p95"),
                e2e.get("p99"),
                sio.get("p95"),
                s.get("elapsed_time"),
            ]
        )
    _table(ws, names, rows, empty="single-client run")


def _environment(ws, doc: dict) -> None:
    rows = [[f"model.{k}", v] for k, v in flatten(doc.get("model") or {})]
    rows += [[k, v] for k, v in flatten({"environment": doc.get("environment") or {}})]
    for name, t in (doc.get("tiers") or {}).items():
        for k in ("kind", "capacity_bytes", "directory", "io_mode", "entries", "used_bytes"):
            if k in t:
                rows.append([f"tiers.{name}.{k}", t[k]])
        if "capacity_bytes" in t:
            rows.append([f"tiers.{name}.capacity_gb", t["capacity_bytes"] / GB])
    _table(ws, ["key", "value"], rows)


def _latency_tracing(ws, doc: dict) -> None:
    """--enable-latency-tracing: what the tracer saw, its histograms bucket by bucket, and the distilled fio job."""
    lt = doc.get("latency_tracing") or {}
    rows: list[list[Any]] = []
    for key in ("layers_on", "layers_off", "window_ns", "truncated", "error", "fio_error", "trace_path"):
        if lt.get(key) not in (None, "", []):
            rows.append([key, " ".join(lt[key]) if isinstance(lt[key], list) else lt[key], None, None, None])
    for name, by_key in sorted((lt.get("histograms") or {}).items()):
        for key, value in by_key.items() if isinstance(by_key, dict) else []:
            if isinstance(value, dict) and "hist" in value:
                for b in value["hist"]:
                    rows.append([name, key or None, b.get("lo"), b.get("hi"), b.get("count")])
            elif isinstance(value, (int, float)):
                rows.append([name, key or None, None, None, value])
    for line in (lt.get("fio_job") or "").splitlines():
        rows.append(["fio job", line, None, None, None])
    _table(
        ws,
        ["map", "key", "bucket low", "bucket high", "count"],
        rows,
        empty="no latency tracing in this run (--enable-latency-tracing, as root)",
    )
