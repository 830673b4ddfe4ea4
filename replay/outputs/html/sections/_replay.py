"""kvtier replay: the summary rows (requests, TTFT, TPOT, ITL, end to end, the server's hit rates), the banners of a
run cut short or with failed requests, and its figures (TTFT and latency CDFs, hit rate and TTFT per round, where
the prompt tokens came from)."""

from __future__ import annotations

import plotly.graph_objects as go

from ...compare_rows import Row
from ...tables import source_order
from ..kinds import Run
from ._shared import PALETTE, KindView, cdf_trace, doc_key, kept, new_figure, series_name


def summary_rows(runs: list[Run]) -> list[Row]:
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


def banners(run: Run) -> list[tuple[str, str]]:
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


def figures(runs: list[Run]) -> list[go.Figure]:
    many = len(runs) > 1
    ttft = new_figure("Time to first token (CDF)", "TTFT (ms, log)", "share of requests", logx=True)
    lat = new_figure("End-to-end and inter-token latency (CDF)", "latency (ms, log)", "share", logx=True)
    hit = new_figure("Prefix hit rate per round", "round", "hit rate", yrange=[0, 1.05])
    rt = new_figure("TTFT per round", "round", "TTFT (ms)")
    for run in runs:
        d = run.doc
        h = d.get("histograms") or {}
        if isinstance(h.get("ttft_ms"), str):
            cdf_trace(ttft, h["ttft_ms"], series_name(run, "TTFT", many), run.path)
        for key, label in (("e2el_ms", "end to end"), ("itl_ms", "inter-token")):
            if isinstance(h.get(key), str):
                cdf_trace(lat, h[key], series_name(run, label, many), run.path)
        rows = d.get("rounds") or []
        if rows:
            xs = [r["round"] for r in rows]
            for key, label, dash in (("hit_rate", "measured (server)", None), ("ideal_hit_rate", "ideal", "dash")):
                ys = [r.get(key) for r in rows]
                hit.add_trace(go.Scatter(x=xs, y=ys, name=series_name(run, label, many), line={"dash": dash}))
            for key, label in (("ttft_p50_ms", "p50"), ("ttft_p95_ms", "p95")):
                rt.add_trace(go.Scatter(x=xs, y=[r.get(key) for r in rows], name=series_name(run, label, many)))
    return kept([ttft, lat, hit, rt, _prompt_sources(runs)])


def _prompt_sources(runs: list[Run]) -> go.Figure:
    """Shares of the prompt tokens by where they came from (server_metrics.prompt_tokens_by_tier): one bar per run,
    and, for a single run in rounds, one per round."""
    bars: list[tuple[str, dict[str, int]]] = []
    for run in runs:
        parts = (run.doc.get("server_metrics") or {}).get("prompt_tokens_by_tier")
        if parts:
            bars.append((run.label if len(runs) > 1 else "whole run", parts))
        if len(runs) == 1:
            bars += [(f"round {r['round']}", r["prompt_tokens_by_tier"]) for r in run.doc.get("rounds") or []
                     if r.get("prompt_tokens_by_tier")]  # fmt: skip
    fig = new_figure("Where the prompt tokens came from", "", "share of prompt tokens")
    names = sorted({k for _, parts in bars for k in parts}, key=source_order)
    for i, name in enumerate(names):
        ys = [parts.get(name, 0) / (sum(parts.values()) or 1) for _, parts in bars]
        fig.add_trace(
            go.Bar(
                x=[x for x, _ in bars],
                y=ys,
                name=name,
                marker={"color": PALETTE[i % len(PALETTE)]},
                hovertemplate="%{x}: %{y:.1%}<extra>%{fullData.name}</extra>",
            )
        )
    fig.update_layout(barmode="stack")
    fig.update_yaxes(range=[0, 1.05], tickformat=".0%")
    return fig


def config(run: Run) -> dict:
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


VIEW = KindView(summary_rows, banners, figures, config, doc_key("server_metrics"))
