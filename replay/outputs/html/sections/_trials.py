"""kvtier bench --trials: what its result shows besides a run's view (_bench.py): its own banners (trials cut short
or failed) and each trial's figures with their median."""

from __future__ import annotations

import plotly.graph_objects as go

from ..kinds import Run
from ._shared import PALETTE, new_figure, series_name


def banners(run: Run) -> list[tuple[str, str]]:
    d = run.doc
    out = []
    status = d.get("status")
    done, asked = d["trials_completed"], d["trials_requested"]
    if status != "completed" or done < asked:
        out.append(("error", f"cut short: status {status}, {done} of {asked} trials completed (partial results)"))
    failed = [str(t.get("trial")) for t in d["per_trial"] if t.get("status") != "completed"]
    if failed:
        out.append(("error", f"trial{'s' if len(failed) > 1 else ''} {', '.join(failed)} did not complete"))
    return out


def figures(runs: list[Run]) -> list[go.Figure]:
    """Requests/s and end-to-end latency per trial of each --trials run (empty figures when there is none)."""
    many = len(runs) > 1
    trials_rate = new_figure("Requests/s per trial", "trial", "requests/s")
    trials_lat = new_figure("End-to-end latency per trial", "trial", "ms")
    for run in runs:
        if run.kind != "trials":
            continue
        _trial_traces(trials_rate, run, ("requests_per_second", "requests/s"), many)
        for q in ("p50", "p95", "p99"):
            _trial_traces(trials_lat, run, (f"end_to_end_latency_ms.{q}", f"end to end {q}"), many)
    return [trials_rate, trials_lat]


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
    colour = PALETTE[len(fig.data) // 2 % len(PALETTE)]
    name = series_name(run, label, many)
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
