"""What the report shows for each kind of result: banners, the summary rows, the figures, configuration and system.

A row (replay/outputs/compare_rows.py) is (metric, unit, path into the document or a function of it, which direction
is better); the page puts each run's value in a column with its ratio to the first run. Rows with a path carry it on
the page (`data-path`), so a reader (and the browser test) can tell which number of the JSON a cell shows. Figures
are plotly figures, one trace per run and series, named `label: series` when several runs are overlaid.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go

from kvconnector.units import GB

from .._common import sla_verdict_text, timeline_series
from ..compare_rows import Row, bench_rows, value_at
from ..plots import cdf_points
from .kinds import ReportError, Run

# plotly's default colours, named so a series keeps one colour across runs; one dash per run when runs are overlaid
_PALETTE = ("#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3", "#ff6692", "#b6e880", "#ff97ff")
_DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")


def _name(run: Run, series: str, overlaid: bool) -> str:
    return f"{run.label}: {series}" if overlaid else series


def _fig(title: str, xaxis: str, yaxis: str, *, logx: bool = False, yrange: list | None = None) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(
        title=title,
        xaxis_title=xaxis,
        yaxis_title=yaxis,
        template="plotly_white",
        autosize=True,
        margin={"l": 60, "r": 20, "t": 50, "b": 50},
        hovermode="closest",
        legend={"font": {"size": 11}},
    )
    if logx:
        fig.update_xaxes(type="log")
    if xaxis in ("round", "trial"):
        fig.update_xaxes(dtick=1)
    if yrange:
        fig.update_yaxes(range=yrange, tickformat=".0%")
    elif not logx:
        fig.update_yaxes(rangemode="tozero")
    return fig


def _cdf_trace(fig: go.Figure, encoded: str, name: str, source: str) -> None:
    try:
        xs, ys, n = cdf_points(encoded)
    except Exception as exc:  # hdrh's decoder raises its own exception types (and binascii's, zlib's) on bad input
        raise ReportError(f"{source}: the {name} histogram cannot be decoded ({type(exc).__name__}: {exc})") from None
    if xs:
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                name=f"{name} (n={n:,})",
                mode="lines",
                line={"shape": "hv"},
                hovertemplate="%{y:.1%} within %{x:.3g} ms<extra>" + name + "</extra>",
            )
        )


def _kept(figs: list[go.Figure]) -> list[go.Figure]:
    return [f for f in figs if f.data]


# ---- kvtier bench, bench --trials, kvtier merge -------------------------------------------------------------------


def _bench_rows(runs: list[Run]) -> list[Row]:
    # kvtier compare's rows: one definition of what a bench run is compared on
    return bench_rows([r.doc for r in runs])


def _bench_banners(run: Run) -> list[tuple[str, str]]:
    d = run.doc
    out = []
    status = d.get("status")
    if run.kind == "trials":
        done, asked = d["trials_completed"], d["trials_requested"]
        if status != "completed" or done < asked:
            out.append(("error", f"cut short: status {status}, {done} of {asked} trials completed (partial results)"))
        failed = [str(t.get("trial")) for t in d["per_trial"] if t.get("status") != "completed"]
        if failed:
            out.append(("error", f"trial{'s' if len(failed) > 1 else ''} {', '.join(failed)} did not complete"))
        return out
    if status != "completed":
        why = d.get("error") or d.get("stop_signal") or ""
        out.append(("error", f"cut short: status {status}{f' ({why})' if why else ''}; these are partial results"))
    for cls, m in sorted(((d.get("summary") or {}).get("qos_metrics") or {}).items()):
        if isinstance(m, dict) and sla_verdict_text(m) == "missed":
            sla = m.get("sla") or {}
            out.append(
                ("error", f"failed its SLA check: QoS class {cls} missed (p95 target {sla.get('target_p95_ms')} ms)")
            )
    for note in d.get("notes") or []:
        out.append(("note", str(note)))
    return out


def _bench_figures(runs: list[Run]) -> list[go.Figure]:
    many = len(runs) > 1
    tiers = _fig("Latency per tier and operation (CDF)", "latency (ms, log)", "share of operations", logx=True)
    reqs = _fig("Request latency (CDF)", "latency (ms, log)", "share of requests", logx=True)
    thr = _fig("Throughput over time", "time (s)", "GB/s")
    occ = _fig("Tier occupancy over time", "time (s)", "GB held")
    rounds = _fig("Prefix hit rate per round", "round", "hit rate", yrange=[0, 1.05])
    sources = _fig("Per source of the merge", "source", "requests/s")
    sources.update_layout(
        barmode="group",
        yaxis2={"title": "end-to-end p95 (ms)", "overlaying": "y", "side": "right", "rangemode": "tozero"},
        legend={"orientation": "h", "y": -0.3},
    )
    trials_rate = _fig("Requests/s per trial", "trial", "requests/s")
    trials_lat = _fig("End-to-end latency per trial", "trial", "ms")
    for run in runs:
        d = run.doc
        for tier, t in (d.get("tiers") or {}).items():
            for op in ("read", "write"):
                enc = (((t.get(op) or {}).get("histograms")) or {}).get("total") if isinstance(t, dict) else None
                if isinstance(enc, str):
                    _cdf_trace(tiers, enc, _name(run, f"{tier} {op}", many), run.path)
        for key, label in (("end_to_end", "end to end"), ("storage_io", "storage I/O"), ("queue_wait", "queue wait")):
            enc = (d.get("request_histograms") or {}).get(key)
            if isinstance(enc, str):
                _cdf_trace(reqs, enc, _name(run, label, many), run.path)
        ts = timeline_series(d) if run.kind != "trials" else None
        if ts:
            for key, label in (("read_gbps", "read"), ("write_gbps", "write")):
                thr.add_trace(go.Scatter(x=ts["t_s"], y=ts[key], name=_name(run, label, many), mode="lines+markers"))
            for tier, ys in ts["used_gb"].items():
                occ.add_trace(go.Scatter(x=ts["t_s"], y=ys, name=_name(run, tier, many), mode="lines+markers"))
        rows = (d.get("summary") or {}).get("rounds") or []
        if rows:
            xs = [r.get("round") for r in rows]
            for key, label, dash in (
                ("hit_rate", "measured", None),
                ("ideal_hit_rate", "ideal", "dash"),
                ("predicted_hit_rate", "kvtier plan", "dot"),
            ):
                ys = [r.get(key) for r in rows]
                if any(y is not None for y in ys):
                    rounds.add_trace(go.Scatter(x=xs, y=ys, name=_name(run, label, many), line={"dash": dash}))
        if run.kind == "merged":  # each source's own figures beside the merged ones
            clients = [c for c in d["clients"] if isinstance(c, dict) and isinstance(c.get("summary"), dict)]
            names = [str(c.get("source", c.get("client"))) for c in clients]
            rate = [c["summary"].get("requests_per_second") for c in clients]
            p95 = [(c["summary"].get("end_to_end_latency_ms") or {}).get("p95") for c in clients]
            # side by side although on two axes (bars on different axes are grouped apart unless given offsets)
            sources.add_trace(go.Bar(x=names, y=rate, name=_name(run, "requests/s", many), offsetgroup="rate"))
            sources.add_trace(
                go.Bar(x=names, y=p95, name=_name(run, "end-to-end p95 ms", many), yaxis="y2", offsetgroup="p95")
            )
        if run.kind == "trials":
            _trial_traces(trials_rate, run, ("requests_per_second", "requests/s"), many)
            for q in ("p50", "p95", "p99"):
                _trial_traces(trials_lat, run, (f"end_to_end_latency_ms.{q}", f"end to end {q}"), many)
    return _kept([tiers, reqs, thr, occ, rounds, sources, trials_rate, trials_lat])


def _trial_traces(fig: go.Figure, run: Run, what: tuple[str, str], many: bool) -> None:
    """Each completed trial's value (aggregate[key].values, in the order of the completed trials) and their median as
    a dashed line of the same colour across the trials."""
    key, label = what
    agg = run.doc["aggregate"].get(key) or {}
    vals = agg.get("values") or []
    if not vals:
        return
    done = [t.get("trial") for t in run.doc["per_trial"] if t.get("status") == "completed"]
    xs = done if len(done) == len(vals) else list(range(1, len(vals) + 1))
    colour = _PALETTE[len(fig.data) // 2 % len(_PALETTE)]
    name = _name(run, label, many)
    fig.add_trace(go.Scatter(x=xs, y=vals, name=name, mode="markers", marker={"size": 10, "color": colour}))
    if isinstance(agg.get("median"), int | float):
        fig.add_trace(
            go.Scatter(
                x=[min(xs) - 0.3, max(xs) + 0.3],
                y=[agg["median"]] * 2,
                name=f"{name} median",
                mode="lines",
                line={"dash": "dash", "color": colour},
            )
        )


# ---- kvtier replay --------------------------------------------------------------------------------------------


def _replay_rows(runs: list[Run]) -> list[Row]:
    rows = [
        Row("requests completed", "", ("completed",)),
        Row("requests failed", "", ("failed",), "lower"),
        Row("requests/s", "1/s", ("request_throughput",), "higher"),
        Row("output tokens/s", "tokens/s", ("output_throughput",), "higher"),
    ]
    for key, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2el_ms", "end-to-end")):
        for q in ("p50", "p95", "p99"):
            rows.append(Row(f"{label} {q}", "ms", (key, q), "lower"))
    rows += [
        Row("server prefix hit rate", "%", ("server_metrics", "prefix_cache_hit_rate"), "higher"),
        Row("external (L2) hit rate", "%", ("server_metrics", "external_prefix_cache_hit_rate"), "higher"),
    ]
    return rows


def _replay_banners(run: Run) -> list[tuple[str, str]]:
    d = run.doc
    out = []
    if d.get("aborted"):
        out.append(("error", f"cut short: {d['aborted']}; these are partial results"))
    if d.get("run_failed"):
        out.append(("error", f"run failed its check: {d['run_failed']}"))
    if d.get("failed"):
        out.append(("warn", f"{d['failed']} requests failed: {d.get('errors_by_kind') or {}}"))
    if d.get("not_sent"):
        out.append(("warn", f"{d['not_sent']} scheduled requests were not sent"))
    return out


def _replay_figures(runs: list[Run]) -> list[go.Figure]:
    many = len(runs) > 1
    ttft = _fig("Time to first token (CDF)", "TTFT (ms, log)", "share of requests", logx=True)
    lat = _fig("End-to-end and inter-token latency (CDF)", "latency (ms, log)", "share", logx=True)
    hit = _fig("Prefix hit rate per round", "round", "hit rate", yrange=[0, 1.05])
    rt = _fig("TTFT per round", "round", "TTFT (ms)")
    for run in runs:
        d = run.doc
        h = d.get("histograms") or {}
        if isinstance(h.get("ttft_ms"), str):
            _cdf_trace(ttft, h["ttft_ms"], _name(run, "TTFT", many), run.path)
        for key, label in (("e2el_ms", "end to end"), ("itl_ms", "inter-token")):
            if isinstance(h.get(key), str):
                _cdf_trace(lat, h[key], _name(run, label, many), run.path)
        rows = d.get("rounds") or []
        if rows:
            xs = [r["round"] for r in rows]
            for key, label, dash in (("hit_rate", "measured (server)", None), ("ideal_hit_rate", "ideal", "dash")):
                ys = [r.get(key) for r in rows]
                hit.add_trace(go.Scatter(x=xs, y=ys, name=_name(run, label, many), line={"dash": dash}))
            for key, label in (("ttft_p50_ms", "p50"), ("ttft_p95_ms", "p95")):
                rt.add_trace(go.Scatter(x=xs, y=[r.get(key) for r in rows], name=_name(run, label, many)))
    return _kept([ttft, lat, hit, rt])


# ---- kvtier plan ----------------------------------------------------------------------------------------------


def _plan_rows(runs: list[Run]) -> list[Row]:
    """Per configuration of the first run (by position: runs of one plan command line up): its capacity, the round the
    hit rate collapsed in, the last round's predicted and ideal hit rates, the bytes written."""
    rows = [Row("status", "", ("status",)), Row("rounds", "", ("workload", "rounds"))]
    for i, c in enumerate(runs[0].doc["configurations"]):
        at = ("configurations", str(i))
        rows += [
            Row(f"{c['name']}: capacity", "bytes", (*at, "capacity_bytes")),
            Row(f"{c['name']}: collapse round", "", (*at, "collapse_round"), "higher"),
            Row(f"{c['name']}: hit rate, last round", "%", (*at, "rounds", "-1", "predicted_hit_rate"), "higher"),
            Row(f"{c['name']}: ideal, last round", "%", (*at, "rounds", "-1", "ideal_hit_rate")),
            Row(f"{c['name']}: bytes written", "bytes", (*at, "bytes_written_total"), "lower"),
        ]
    return rows


def _plan_figures(runs: list[Run]) -> list[go.Figure]:
    many = len(runs) > 1
    hit = _fig("Predicted prefix hit rate per round", "round", "hit rate", yrange=[0, 1.05])
    written = _fig("KV bytes written, accumulated", "round", "GB")
    for run in runs:
        longest = max(run.doc["configurations"], key=lambda c: len(c["rounds"]), default=None)
        if longest is not None:  # the ideal depends on the workload only
            xs = [r["round"] for r in longest["rounds"]]
            ideal = [r["ideal_hit_rate"] for r in longest["rounds"]]
            hit.add_trace(
                go.Scatter(x=xs, y=ideal, name=_name(run, "ideal", many), line={"dash": "dash", "color": "gray"})
            )
        for c in run.doc["configurations"]:
            xs = [r["round"] for r in c["rounds"]]
            hit.add_trace(
                go.Scatter(x=xs, y=[r["predicted_hit_rate"] for r in c["rounds"]], name=_name(run, c["name"], many))
            )
            ys = [(r.get("bytes_written_total") or 0) / GB for r in c["rounds"]]
            written.add_trace(go.Scatter(x=xs, y=ys, name=_name(run, c["name"], many)))
    return _kept([hit, written])


def _trace_rows(runs: list[Run]) -> list[Row]:
    names: list[str] = []
    for run in runs:
        names += [t["name"] for t in run.doc["traces"] if t["name"] not in names]
    rows = [Row("status", "", ("status",))]
    for run in runs[:1]:
        for i, t in enumerate(run.doc["traces"]):
            base = ("traces", str(i))
            rows += [
                Row(f"{t['name']}: requests", "", (*base, "requests")),
                Row(f"{t['name']}: prompt tokens", "", (*base, "prompt_tokens")),
                Row(f"{t['name']}: most reachable hit rate", "%", (*base, "max_hit_rate")),
                Row(f"{t['name']}: hit rate of the tiers", "%", (*base, "tiers_hit_rate"), "higher"),
            ]
            for j, tier in enumerate(t["tiers"]):
                rows.append(
                    Row(f"{t['name']}: tier {tier['name']} hit rate", "%", (*base, "tiers", str(j), "hit_rate"))
                )
    return rows


def _trace_figures(runs: list[Run]) -> list[go.Figure]:
    many = len(runs) > 1
    fig = _fig("Prefix hit rate against cache capacity", "capacity (tokens, log)", "hit rate", logx=True)
    fig.update_yaxes(tickformat=".1%")
    for run in runs:
        for t in run.doc["traces"]:
            colour = _PALETTE[len(fig.data) // (1 + len(t["tiers"])) % len(_PALETTE)]
            fig.add_trace(
                go.Scatter(
                    x=[p["capacity_tokens"] for p in t["curve"]],
                    y=[p["hit_rate"] for p in t["curve"]],
                    name=_name(run, t["name"], many),
                    mode="lines+markers",
                    line={"color": colour},
                )
            )
            for tier in t["tiers"]:
                fig.add_trace(
                    go.Scatter(
                        x=[tier["capacity_tokens"]],
                        y=[tier["hit_rate"]],
                        name=_name(run, f"{t['name']} tier {tier['name']}", many),
                        mode="markers",
                        marker={"size": 12, "symbol": "diamond", "color": colour, "line": {"width": 1}},
                    )
                )
    return _kept([fig])


def _plan_banners(run: Run) -> list[tuple[str, str]]:
    status = run.doc["status"]
    if status != "done":
        return [("error", f"cut short: status {status}; these are partial results")]
    return []


# ---- kvtier sweep ---------------------------------------------------------------------------------------------


def _sweep_rows(runs: list[Run]) -> list[Row]:
    rows = [
        Row("status", "", ("status",)),
        Row("driver", "", ("driver",)),
        Row("reference runs", "", ("reference_runs",)),
    ]
    keys: list[str] = []
    for run in runs:
        keys += [k for k in run.doc.get("reference") or {} if k not in keys]
    for k in keys:
        rows.append(Row(f"reference {_figure(k)}", _unit(k), ("reference", k)))
    for i, p in enumerate(runs[0].doc["points"]):
        for k in keys:
            if not (p["bw"] == "none" and p["lat_ms"] == 0):
                what = f"{p['bw']}, +{p['lat_ms']:g} ms: {_figure(k)} / reference"
                rows.append(Row(what, "x", ("points", str(i), "relative", k)))
    return rows


def _figure(key: str) -> str:
    """A sweep figure's key in words: service_p50_ms -> service p50 (ms)."""
    if key.endswith("_ms"):
        return key[:-3].replace("_", " ") + " (ms)"
    if key.endswith("_per_s"):
        return key[:-6].replace("_", " ") + "/s"
    return key.replace("_", " ").replace("l2 ", "L2 ")


def _unit(key: str) -> str:
    return "%" if key.endswith("share") else ""


def _sweep_banners(run: Run) -> list[tuple[str, str]]:
    d = run.doc
    out = []
    if d["status"] != "completed":
        out.append(("error", f"status: {d['status']}" + ("" if d["status"].startswith("completed") else " (partial)")))
    bad = [r for r in d["runs"] if r["exit_code"] != 0]
    if bad:
        out.append(
            (
                "error",
                f"{len(bad)} of {len(d['runs'])} driver runs failed "
                f"(exit codes {', '.join(map(str, sorted({r['exit_code'] for r in bad})))})",
            )
        )
    return out


# Heat-map colours are log2 of the ratio to the reference, so 2x slower and 2x faster sit as far from 1x; ratios beyond
# 64x either way (and a figure that fell to 0) take the end colour.
_LOG2_CLIP = 6
_TICKS = (1 / 64, 1 / 16, 1 / 4, 0.5, 0.8, 1, 1.25, 2, 4, 16, 64)


def _log2_ratio(r: float | None) -> float | None:
    if r is None:
        return None
    return max(-_LOG2_CLIP, min(_LOG2_CLIP, math.log2(r))) if r > 0 else -_LOG2_CLIP


def _sweep_figures(runs: list[Run]) -> list[go.Figure]:
    figs = []
    for run in runs:
        d = run.doc
        points = d["points"]
        bws = list(d["grid"].get("bw", [])) or sorted({p["bw"] for p in points})
        lats = sorted({p["lat_ms"] for p in points})
        at = {(p["bw"], p["lat_ms"]): p for p in points}
        keys = [k for k in (d.get("reference") or {}) if any(p["relative"].get(k) is not None for p in points)]
        for k in keys:
            cells = [[at.get((bw, lat)) for bw in bws] for lat in lats]
            ratio = [[None if p is None else p["relative"].get(k) for p in row] for row in cells]
            raw = [[None if p is None else p["metrics"].get(k) for p in row] for row in cells]
            z = [[_log2_ratio(r) for r in row] for row in ratio]
            # at least 0.5x..2x, so a few percent of noise stays pale
            span = max([1.0, *(abs(v) for row in z for v in row if v is not None)])
            ticks = [t for t in _TICKS if abs(math.log2(t)) <= span + 1e-9 and (span <= 2 or t not in (0.8, 1.25))]
            title = f"{_figure(k)} / unthrottled" + (f" ({run.label})" if len(runs) > 1 else "")
            fig = _fig(title, "bandwidth cap", "added latency per operation (ms)")
            fig.add_trace(
                go.Heatmap(
                    x=[str(b) for b in bws],
                    y=[f"{lat:g}" for lat in lats],
                    z=z,
                    text=[["" if r is None else f"{r:.2f}x" for r in row] for row in ratio],
                    customdata=raw,
                    # centred on the reference (1x): red is worse than unthrottled, green better
                    colorscale="RdYlGn_r" if k.endswith("_ms") else "RdYlGn",
                    zmid=0,
                    zmin=-span,
                    zmax=span,
                    colorbar={"tickvals": [math.log2(t) for t in ticks], "ticktext": [f"{t:.2g}x" for t in ticks]},
                    texttemplate="%{text}",
                    hovertemplate="bw %{x}, +%{y} ms: %{text} (%{customdata:.4g})<extra>" + k + "</extra>",
                    name=k,
                )
            )
            fig.update_yaxes(type="category")
            fig.update_xaxes(type="category")
            figs.append(fig)
    return _kept(figs)


# ---- storage trace (tracing/) ---------------------------------------------------------------------------------


def _trace_layer_rows(runs: list[Run]) -> list[Row]:
    from tracing.report import layer_rows

    names: list[str] = []
    for run in runs:
        names += [f"{layer} {what}" for layer, what, _ in layer_rows(run.doc) if f"{layer} {what}" not in names]

    def stat(name: str, what: str) -> Callable[[Any], Any]:
        def get(tr: Any) -> Any:
            for layer, w, h in layer_rows(tr):
                if f"{layer} {w}" == name:
                    if what == "count":
                        return h.total
                    v = h.quantile(float(what))
                    return None if math.isnan(v) else v
            return None

        return get

    rows = []
    for name in names:
        rows += [
            Row(f"{name}: count", "", stat(name, "count")),
            Row(f"{name}: p50", "us", stat(name, "0.5"), "lower"),
            Row(f"{name}: p99", "us", stat(name, "0.99"), "lower"),
        ]
    return rows


def _storage_trace_banners(run: Run) -> list[tuple[str, str]]:
    from tracing.report import health_lines

    tr = run.doc
    out = []
    if tr.truncated:
        out.append(("error", "the trace is cut short (partial): " + "; ".join(tr.cuts[:3])))
    out += [("warn", line) for line in health_lines(tr)]
    return out


def _storage_trace_figures(runs: list[Run]) -> list[go.Figure]:
    from tracing.report import layer_rows

    many = len(runs) > 1
    figs = []
    by_layer: dict[str, go.Figure] = {}
    edges: dict[str, dict[str, float]] = {}  # per layer: bucket label -> its lower edge, to order the axis
    for run in runs:
        for layer, what, h in layer_rows(run.doc):
            fig = by_layer.get(layer)
            if fig is None:
                fig = by_layer[layer] = _fig(f"{layer}: latency histogram", "latency (us, bucket)", "count")
                fig.update_layout(barmode="group")
                figs.append(fig)
            labels = [f"{'' if b.lo is None else b.lo}-{'' if b.hi is None else b.hi}" for b in h.buckets]
            for lab, b in zip(labels, h.buckets):
                edges.setdefault(layer, {})[lab] = -math.inf if b.lo is None else b.lo
            fig.add_trace(go.Bar(x=labels, y=[b.count for b in h.buckets], name=_name(run, what, many)))
    for layer, fig in by_layer.items():  # buckets of several histograms in one axis, in latency order
        order = sorted(edges[layer], key=edges[layer].__getitem__)
        fig.update_xaxes(type="category", categoryorder="array", categoryarray=order)
    return _kept(figs)


def _trace_meta(run: Run) -> dict[str, Any]:
    tr = run.doc
    return {**tr.meta, "window_ns": tr.window_ns, "active_span_ns": tr.active_span_ns}


# ---- the table of kinds ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KindView:
    rows: Callable[[list[Run]], list[Row]]
    banners: Callable[[Run], list[tuple[str, str]]]
    figures: Callable[[list[Run]], list[go.Figure]]
    config: Callable[[Run], Any]
    system: Callable[[Run], Any]


def _key(*path: str) -> Callable[[Run], Any]:
    return lambda run: value_at(run.doc, path)


def _replay_config(run: Run) -> dict:
    skip = {
        "histograms",
        "rounds",
        "server_metrics",
        "ttft_ms",
        "tpot_ms",
        "itl_ms",
        "e2el_ms",
        "send_lag_ms",
        "queue_ms",
    }
    # the run's settings: its scalars (what was asked, what was sent) and the long-session shape; figures elsewhere
    return {
        k: v for k, v in run.doc.items() if k == "long_session" or (k not in skip and not isinstance(v, dict | list))
    }


VIEWS = {
    "bench": KindView(_bench_rows, _bench_banners, _bench_figures, _key("config"), _key("environment")),
    "replay": KindView(_replay_rows, _replay_banners, _replay_figures, _replay_config, _key("server_metrics")),
    "plan": KindView(_plan_rows, _plan_banners, _plan_figures, _key("workload"), _key("command")),
    "plan-trace": KindView(_trace_rows, _plan_banners, _trace_figures, _key("command"), _key("provenance")),
    "sweep": KindView(
        _sweep_rows,
        _sweep_banners,
        _sweep_figures,
        lambda run: {k: run.doc.get(k) for k in ("driver", "grid", "driver_args", "stack_args", "mount", "backing")},
        lambda run: {k: run.doc.get(k) for k in ("started_at", "loadavg_start", "loadavg_end", "runs_dir")},
    ),
    "trace": KindView(_trace_layer_rows, _storage_trace_banners, _storage_trace_figures, _trace_meta, lambda run: None),
}
VIEWS["trials"] = VIEWS["merged"] = VIEWS["bench"]


def overlay_style(figs: list[go.Figure], labels: list[str]) -> None:
    """Several runs in one plot: one colour per series (the same in every run), one dash per run (in label order),
    so `a: disk read` and `b: disk read` read as one series of two runs."""
    for fig in figs:
        colours: dict[str, str] = {}
        for t in fig.data:
            if t.type != "scatter" or not t.name:
                continue
            run = next((i for i, lab in enumerate(labels) if t.name.startswith(f"{lab}: ")), None)
            if run is None:
                continue
            series = t.name[len(labels[run]) + 2 :].split(" (n=")[0]
            colour = colours.setdefault(series, _PALETTE[len(colours) % len(_PALETTE)])
            t.update(line={"color": colour, "dash": _DASHES[run % len(_DASHES)]}, marker={"color": colour})
        # the runs' labels make long legend entries: below the plot, where they do not squeeze it
        fig.update_layout(legend={"orientation": "h", "yanchor": "top", "y": -0.22, "x": 0}, height=560)
