"""What the views of every kind share: the figure every plot starts from, a CDF trace from an encoded histogram,
series names and colours when runs are overlaid, and the view itself (`KindView`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go

from ...compare_rows import Row, value_at
from ...plots import cdf_points
from ..kinds import ReportError, Run

__all__ = [
    "DASHES",
    "PALETTE",
    "KindView",
    "cdf_trace",
    "doc_key",
    "kept",
    "new_figure",
    "overlay_style",
    "series_name",
]

# plotly's default colours, named so a series keeps one colour across runs; one dash per run when runs are overlaid
PALETTE = ("#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3", "#ff6692", "#b6e880", "#ff97ff")
DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")


def series_name(run: Run, series: str, overlaid: bool) -> str:
    return f"{run.label}: {series}" if overlaid else series


def new_figure(title: str, xaxis: str, yaxis: str, *, logx: bool = False, yrange: list | None = None) -> go.Figure:
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


def cdf_trace(fig: go.Figure, encoded: str, name: str, source: str) -> None:
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
                hovertemplate="%{y:.1%} within %{x:.3g} ms<extra>%{fullData.name}</extra>",
            )
        )


def kept(figs: list[go.Figure]) -> list[go.Figure]:
    return [f for f in figs if f.data]


@dataclass(frozen=True)
class KindView:
    rows: Callable[[list[Run]], list[Row]]
    banners: Callable[[Run], list[tuple[str, str]]]
    figures: Callable[[list[Run]], list[go.Figure]]
    config: Callable[[Run], Any]
    system: Callable[[Run], Any]
    # more of the page, as HTML, between the summary table and the plots (a kind whose results are tables of their
    # own: the MLPerf run's Options x trials x ranks and its rules' verdicts)
    tables: Callable[[list[Run]], str] | None = None


def doc_key(*path: str) -> Callable[[Run], Any]:
    return lambda run: value_at(run.doc, path)


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
            colour = colours.setdefault(series, PALETTE[len(colours) % len(PALETTE)])
            t.update(line={"color": colour, "dash": DASHES[run % len(DASHES)]}, marker={"color": colour})
        # the runs' labels make long legend entries: below the plot, where they do not squeeze it
        fig.update_layout(legend={"orientation": "h", "yanchor": "top", "y": -0.22, "x": 0}, height=560)
