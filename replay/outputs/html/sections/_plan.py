"""kvtier plan: per configuration its capacity, collapse round, last round's hit rates and bytes written; the
predicted hit rate per round against the ideal, and the bytes written. Its banner (a plan cut short) is --trace's
too (_plan_trace.py)."""

from __future__ import annotations

import plotly.graph_objects as go

from kvconnector.units import GB

from ...compare_rows import Row
from ..kinds import Run
from ._shared import KindView, doc_key, kept, new_figure, series_name


def summary_rows(runs: list[Run]) -> list[Row]:
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


def figures(runs: list[Run]) -> list[go.Figure]:
    many = len(runs) > 1
    hit = new_figure("Predicted prefix hit rate per round", "round", "hit rate", yrange=[0, 1.05])
    written = new_figure("KV bytes written, accumulated", "round", "GB")
    for run in runs:
        longest = max(run.doc["configurations"], key=lambda c: len(c["rounds"]), default=None)
        if longest is not None:  # the ideal depends on the workload only
            xs = [r["round"] for r in longest["rounds"]]
            ideal = [r["ideal_hit_rate"] for r in longest["rounds"]]
            hit.add_trace(
                go.Scatter(x=xs, y=ideal, name=series_name(run, "ideal", many), line={"dash": "dash", "color": "gray"})
            )
        for c in run.doc["configurations"]:
            xs = [r["round"] for r in c["rounds"]]
            hit.add_trace(
                go.Scatter(
                    x=xs, y=[r["predicted_hit_rate"] for r in c["rounds"]], name=series_name(run, c["name"], many)
                )
            )
            ys = [(r.get("bytes_written_total") or 0) / GB for r in c["rounds"]]
            written.add_trace(go.Scatter(x=xs, y=ys, name=series_name(run, c["name"], many)))
    return kept([hit, written])


def banners(run: Run) -> list[tuple[str, str]]:
    status = run.doc["status"]
    if status != "done":
        return [("error", f"cut short: status {status}; these are partial results")]
    return []


VIEW = KindView(summary_rows, banners, figures, doc_key("workload"), doc_key("command"))
