"""kvtier merge: what a merged result shows besides a run's view (_bench.py): each source's own figures."""

from __future__ import annotations

import plotly.graph_objects as go

from ..kinds import Run
from ._shared import new_figure, series_name


def figures(runs: list[Run]) -> list[go.Figure]:
    """Requests/s and end-to-end p95 per source of each merged run (one empty figure when none is merged)."""
    many = len(runs) > 1
    sources = new_figure("Per source of the merge", "source", "requests/s")
    sources.update_layout(
        barmode="group",
        yaxis2={"title": "end-to-end p95 (ms)", "overlaying": "y", "side": "right", "rangemode": "tozero"},
        legend={"orientation": "h", "y": -0.3},
    )
    for run in runs:
        if run.kind != "merged":
            continue
        clients = [c for c in run.doc["clients"] if isinstance(c, dict) and isinstance(c.get("summary"), dict)]
        names = [str(c.get("source", c.get("client"))) for c in clients]
        rate = [c["summary"].get("requests_per_second") for c in clients]
        p95 = [(c["summary"].get("end_to_end_latency_ms") or {}).get("p95") for c in clients]
        # side by side although on two axes (bars on different axes are grouped apart unless given offsets)
        sources.add_trace(go.Bar(x=names, y=rate, name=series_name(run, "requests/s", many), offsetgroup="rate"))
        sources.add_trace(
            go.Bar(x=names, y=p95, name=series_name(run, "end-to-end p95 ms", many), yaxis="y2", offsetgroup="p95")
        )
    return [sources]
