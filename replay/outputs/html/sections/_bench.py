"""kvtier bench: a run's summary rows (kvtier compare's), its banners, and its figures: latency CDFs per tier and per
request, throughput and occupancy over time, the prefix hit rate per round. A merge (kvtier merge) and --trials
share this view; what only they have is in _merge.py and _trials.py."""

from __future__ import annotations

import plotly.graph_objects as go

from ..._common import sla_verdict_text, timeline_series
from ...compare_rows import Row, bench_rows
from ..kinds import Run
from . import _merge, _trials
from ._shared import KindView, cdf_trace, doc_key, kept, new_figure, series_name


def summary_rows(runs: list[Run]) -> list[Row]:
    # kvtier compare's rows: one definition of what a bench run is compared on
    return bench_rows([r.doc for r in runs])


def banners(run: Run) -> list[tuple[str, str]]:
    if run.kind == "trials":
        return _trials.banners(run)
    d = run.doc
    out = []
    status = d.get("status")
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


def figures(runs: list[Run]) -> list[go.Figure]:
    many = len(runs) > 1
    tiers = new_figure("Latency per tier and operation (CDF)", "latency (ms, log)", "share of operations", logx=True)
    reqs = new_figure("Request latency (CDF)", "latency (ms, log)", "share of requests", logx=True)
    thr = new_figure("Throughput over time", "time (s)", "GB/s")
    occ = new_figure("Tier occupancy over time", "time (s)", "GB held")
    rounds = new_figure("Prefix hit rate per round", "round", "hit rate", yrange=[0, 1.05])
    for run in runs:
        d = run.doc
        for tier, t in (d.get("tiers") or {}).items():
            for op in ("read", "write"):
                enc = (((t.get(op) or {}).get("histograms")) or {}).get("total") if isinstance(t, dict) else None
                if isinstance(enc, str):
                    cdf_trace(tiers, enc, series_name(run, f"{tier} {op}", many), run.path)
        for key, label in (("end_to_end", "end to end"), ("storage_io", "storage I/O"), ("queue_wait", "queue wait")):
            enc = (d.get("request_histograms") or {}).get(key)
            if isinstance(enc, str):
                cdf_trace(reqs, enc, series_name(run, label, many), run.path)
        ts = timeline_series(d) if run.kind != "trials" else None
        if ts:
            for key, label in (("read_gbps", "read"), ("write_gbps", "write")):
                thr.add_trace(
                    go.Scatter(x=ts["t_s"], y=ts[key], name=series_name(run, label, many), mode="lines+markers")
                )
            for tier, ys in ts["used_gb"].items():
                occ.add_trace(go.Scatter(x=ts["t_s"], y=ys, name=series_name(run, tier, many), mode="lines+markers"))
        per_round = (d.get("summary") or {}).get("rounds") or []
        if per_round:
            xs = [r.get("round") for r in per_round]
            for key, label, dash in (
                ("hit_rate", "measured", None),
                ("ideal_hit_rate", "ideal", "dash"),
                ("predicted_hit_rate", "kvtier plan", "dot"),
            ):
                ys = [r.get(key) for r in per_round]
                if any(y is not None for y in ys):
                    rounds.add_trace(go.Scatter(x=xs, y=ys, name=series_name(run, label, many), line={"dash": dash}))
    return kept([tiers, reqs, thr, occ, rounds, *_merge.figures(runs), *_trials.figures(runs)])


VIEW = KindView(summary_rows, banners, figures, doc_key("config"), doc_key("environment"))
