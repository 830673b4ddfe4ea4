"""kvtier sweep: the reference (unthrottled) figures and each point's ratio to them, the banners of a sweep cut short
or with failed driver runs, and one heat map per figure (bandwidth cap x added latency)."""

from __future__ import annotations

import math

import plotly.graph_objects as go

from ...compare_rows import Row
from ..kinds import Run
from ._shared import KindView, kept, new_figure


def summary_rows(runs: list[Run]) -> list[Row]:
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


def banners(run: Run) -> list[tuple[str, str]]:
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


def figures(runs: list[Run]) -> list[go.Figure]:
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
            fig = new_figure(title, "bandwidth cap", "added latency per operation (ms)")
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
                    hovertemplate="bw %{x}, +%{y} ms: %{text} (%{customdata:.4g})<extra>%{fullData.name}</extra>",
                    name=k,
                )
            )
            fig.update_yaxes(type="category")
            fig.update_xaxes(type="category")
            figs.append(fig)
    return kept(figs)


VIEW = KindView(
    summary_rows,
    banners,
    figures,
    lambda run: {k: run.doc.get(k) for k in ("driver", "grid", "driver_args", "stack_args", "mount", "backing")},
    lambda run: {k: run.doc.get(k) for k in ("started_at", "loadavg_start", "loadavg_end", "runs_dir")},
)
