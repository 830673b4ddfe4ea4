"""kvtier plan --trace: per production trace its requests, the most reachable hit rate and the tiers' hit rates; the
hit rate against cache capacity, with each tier's point on the curve."""

from __future__ import annotations

import plotly.graph_objects as go

from ...compare_rows import Row
from ..kinds import Run
from ._plan import banners
from ._shared import PALETTE, KindView, doc_key, kept, new_figure, series_name


def summary_rows(runs: list[Run]) -> list[Row]:
    """Per trace of the first run (runs of one plan command line up by position)."""
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


def figures(runs: list[Run]) -> list[go.Figure]:
    many = len(runs) > 1
    fig = new_figure("Prefix hit rate against cache capacity", "capacity (tokens, log)", "hit rate", logx=True)
    fig.update_yaxes(tickformat=".1%")
    for run in runs:
        for t in run.doc["traces"]:
            colour = PALETTE[len(fig.data) // (1 + len(t["tiers"])) % len(PALETTE)]
            fig.add_trace(
                go.Scatter(
                    x=[p["capacity_tokens"] for p in t["curve"]],
                    y=[p["hit_rate"] for p in t["curve"]],
                    name=series_name(run, t["name"], many),
                    mode="lines+markers",
                    line={"color": colour},
                )
            )
            for tier in t["tiers"]:
                fig.add_trace(
                    go.Scatter(
                        x=[tier["capacity_tokens"]],
                        y=[tier["hit_rate"]],
                        name=series_name(run, f"{t['name']} tier {tier['name']}", many),
                        mode="markers",
                        marker={"size": 12, "symbol": "diamond", "color": colour, "line": {"width": 1}},
                    )
                )
    return kept([fig])


VIEW = KindView(summary_rows, banners, figures, doc_key("command"), doc_key("provenance"))
