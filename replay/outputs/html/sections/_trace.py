"""A storage trace (tracing/storage_latency_stack.sh, text or JSON): count, p50 and p99 per layer and operation, the
trace's health warnings, and one latency histogram per layer. tracing/ is imported inside the functions: it stands
alone, and the other kinds do not need it."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import plotly.graph_objects as go

from ...compare_rows import Row
from ..kinds import Run
from ._shared import KindView, kept, new_figure, series_name


def summary_rows(runs: list[Run]) -> list[Row]:
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


def banners(run: Run) -> list[tuple[str, str]]:
    from tracing.report import health_lines

    tr = run.doc
    out = []
    if tr.truncated:
        out.append(("error", "the trace is cut short (partial): " + "; ".join(tr.cuts[:3])))
    out += [("warn", line) for line in health_lines(tr)]
    return out


def figures(runs: list[Run]) -> list[go.Figure]:
    from tracing.report import layer_rows

    many = len(runs) > 1
    figs = []
    by_layer: dict[str, go.Figure] = {}
    edges: dict[str, dict[str, float]] = {}  # per layer: bucket label -> its lower edge, to order the axis
    for run in runs:
        for layer, what, h in layer_rows(run.doc):
            fig = by_layer.get(layer)
            if fig is None:
                fig = by_layer[layer] = new_figure(f"{layer}: latency histogram", "latency (us, bucket)", "count")
                fig.update_layout(barmode="group")
                figs.append(fig)
            labels = [f"{'' if b.lo is None else b.lo}-{'' if b.hi is None else b.hi}" for b in h.buckets]
            for lab, b in zip(labels, h.buckets):
                edges.setdefault(layer, {})[lab] = -math.inf if b.lo is None else b.lo
            fig.add_trace(go.Bar(x=labels, y=[b.count for b in h.buckets], name=series_name(run, what, many)))
    for layer, fig in by_layer.items():  # buckets of several histograms in one axis, in latency order
        order = sorted(edges[layer], key=edges[layer].__getitem__)
        fig.update_xaxes(type="category", categoryorder="array", categoryarray=order)
    return kept(figs)


def meta(run: Run) -> dict[str, Any]:
    tr = run.doc
    return {**tr.meta, "window_ns": tr.window_ns, "active_span_ns": tr.active_span_ns}


VIEW = KindView(summary_rows, banners, figures, meta, lambda run: None)
