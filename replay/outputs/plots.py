"""Figures of a results document, as PNG files: what a person would rather look at than read.

`kvtier bench` (`write_plots`, FIGURES):

    latency_cdf.png          per tier and operation, the share of operations done within x ms (log x)
    request_latency_cdf.png  the same for whole requests: end to end, storage I/O, queue wait, generation
    throughput.png           requests/s and read/write GB/s over time (from the timeline's cumulative counters)
    tier_occupancy.png       GB held by each tier over time, against its capacity
    autoscaling.png          users and tokens/s at each autoscaler step (runs with autoscaling only)
    qos_latency.png          per QoS class, p95/p99 latency against the class's SLA targets (QoS runs only)

`kvtier replay` (`write_replay_plots`, REPLAY_FIGURES), from its summary and per-request rows:

    latency_cdf.png          TTFT (share of requests) and inter-token latency (share of tokens) within x ms (log x)
    timeline.png             each request from sent to last chunk, its first token marked, failed ones in red
    rounds.png               per round, measured against ideal prefix hit rate, and TTFT p50/p95 (runs in rounds)
    round_bytes.png          KV bytes written, accumulated over the rounds, per kvtier tier (or the server's total)

Both draw with the same frame (log-ms CDF axes with p50/p99 guides, step curves from the histograms, the run's
label in the corner). A figure whose data is absent (an older file, a run without that feature) is skipped, with an
INFO log line on the `kvtier.outputs` logger saying why. matplotlib is imported only when plots are asked for.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from kvconnector.histogram import LatencyHistogram
from kvconnector.units import GB

from ._common import OPS, sla_verdict_text, timeline_series
from .paths import atomic_path

__all__ = ["FIGURES", "REPLAY_FIGURES", "cdf_points", "literal_texts", "write_plots", "write_replay_plots"]

log = logging.getLogger("kvtier.outputs")

FIGURES = (
    "latency_cdf.png",
    "request_latency_cdf.png",
    "throughput.png",
    "tier_occupancy.png",
    "autoscaling.png",
    "qos_latency.png",
    "rounds.png",
)
REPLAY_FIGURES = ("latency_cdf.png", "timeline.png", "rounds.png", "round_bytes.png")

_DPI = 110
_OP_STYLE = {"read": "-", "write": "--"}
_REQUEST_HISTS = (
    ("end_to_end", "end to end"),
    ("storage_io", "storage I/O"),
    ("queue_wait", "queue wait"),
    ("generation", "generation (simulated)"),
)
# A histogram whose largest value is at most this (ns) recorded only zeros (clamped to 1 ns): nothing to draw.
_ZERO_NS = 1


def cdf_points(encoded: str) -> tuple[list[float], list[float], int]:
    """(latency_ms, fraction of samples at or below it, count) from an encoded histogram, one point per recorded
    bucket (a bucket's upper bound, so the curve never claims an operation was faster than it was)."""
    if not encoded:
        return [], [], 0
    h = LatencyHistogram.decode(encoded)
    total = h.count
    if not total or h.max_ns <= _ZERO_NS:
        return [], [], total
    high_ns, counts = h.recorded_buckets()
    return (high_ns / 1e6).tolist(), (counts.cumsum() / total).tolist(), total


def write_plots(doc: dict, directory: str | os.PathLike, figures: tuple[str, ...] | None = None) -> list[str]:
    """Write every figure the document has data for into `directory` (created if needed); return their paths.
    `figures` limits it to some of FIGURES (by file name)."""
    unknown = set(figures or ()) - set(FIGURES)
    if unknown:
        raise ValueError(f"unknown figures {sorted(unknown)}; known: {', '.join(FIGURES)}")
    draws = (
        ("latency_cdf.png", _tier_cdf),
        ("request_latency_cdf.png", _request_cdf),
        ("throughput.png", _throughput),
        ("tier_occupancy.png", _occupancy),
        ("autoscaling.png", _autoscaling),
        ("qos_latency.png", _qos),
        ("rounds.png", _rounds),  # kvtier bench --prefix-model chained
    )
    chosen = [(name, draw) for name, draw in draws if figures is None or name in figures]
    return save_figures(directory, _run_title(doc), chosen, doc)


def write_replay_plots(
    summary: dict[str, Any], requests: Iterable[dict[str, Any]], directory: str | os.PathLike
) -> list[str]:
    """Write REPLAY_FIGURES that the run has data for into `directory` (created if needed); return their paths.
    `requests`: the per-request detail rows (timestamps in ns since the run's start), read once."""
    spans = _request_spans(requests)
    title = f"kvtier replay {summary.get('model', '?')}, {summary.get('source', '?')} workload"
    draws = (
        ("latency_cdf.png", _replay_cdf),
        ("timeline.png", lambda plt, s: _timeline(plt, spans)),
        ("rounds.png", _rounds),
        ("round_bytes.png", _round_bytes),
    )
    return save_figures(directory, title, draws, summary)


def save_figures(
    directory: str | os.PathLike, title: str, draws: Iterable[tuple[str, Callable[[Any, Any], Any]]], data: Any
) -> list[str]:
    """Draw each figure (`draw(plt, data)`: a figure, or why it is skipped), label it with `title`, save as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    for name, draw in draws:
        with plt.style.context("default"):
            fig = draw(plt, data)
            if isinstance(fig, str):
                log.info("plots: skipped %s (%s)", name, fig)
                continue
            fig.text(0.995, 0.005, title, ha="right", va="bottom", fontsize=7, color="0.45")
            literal_texts(fig)
            path = out / name
            with atomic_path(path, suffix=".png") as tmp:  # written whole: a temp file, then a rename
                fig.savefig(tmp, dpi=_DPI)
            plt.close(fig)
            written.append(str(path))
    return written


def literal_texts(fig: Any) -> None:
    """Every text of `fig` shown as typed: matplotlib reads a string with two `$` as TeX (mathtext), and one it cannot
    parse fails the save. Names in figures are mostly the user's (model, tier, configuration, trace names) and none of
    ours is TeX, so each `$` is escaped (`\\$`, which matplotlib draws as `$`). Tick labels are drawn later by their
    formatters, which may use TeX of their own."""
    from matplotlib.text import Text

    for t in fig.findobj(Text):
        s = t.get_text()
        if "$" in s:
            t.set_text(s.replace("$", r"\$"))


def _run_title(doc: dict) -> str:
    model = (doc.get("model") or {}).get("name", "?")
    return f"kvtier {model}, {doc.get('started_at', '')}, status {doc.get('status', '?')}"


def _fmt_ms(ms: float) -> str:
    if ms >= 1000:
        return f"{ms / 1000:.3g} s"
    if ms >= 1:
        return f"{ms:.3g} ms"
    return f"{ms * 1000:.3g} µs"


def _ms_axis(ax) -> None:
    """Log x axis in ms with readable tick labels (0.001 ms ... 10,000 ms) instead of powers of ten."""
    from matplotlib.ticker import FuncFormatter, LogFormatter

    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
    # An axis spanning less than a decade labels minor ticks: plain numbers there too, not 4.2 x 10^0.
    ax.xaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False))


def _cdf_frame(ax, xlabel: str, ylabel: str, title: str) -> None:
    """Log-ms x axis, 0..1 y axis with p50/p99 guides, labels and grid: the frame every latency CDF shares."""
    _ms_axis(ax)
    _percentile_guides(ax)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")


def _percentile_guides(ax) -> None:
    # Labelled on a right-hand axis, where no legend or curve can cover them.
    for q in (0.5, 0.99):
        ax.axhline(q, color="0.6", lw=0.8, ls=":", zorder=0)
    right = ax.secondary_yaxis("right")
    right.set_yticks([0.5, 0.99], ["p50", "p99"], fontsize=8, color="0.35")
    right.tick_params(length=0)


def _draw_cdf(ax, xs, ys, **kw) -> None:
    # A step curve starting at 0 just below the first bucket: the share is flat between recorded values.
    ax.step([xs[0] * 0.98, *xs], [0.0, *ys], where="post", **kw)


def _tier_cdf(plt, doc: dict):
    tiers = doc.get("tiers") or {}
    curves = []
    for name, t in tiers.items():
        for op in OPS:
            enc = ((t.get(op) or {}).get("histograms") or {}).get("total")
            xs, ys, n = cdf_points(enc) if enc else ([], [], 0)
            if xs:
                curves.append((name, op, xs, ys, n, (t[op].get("latency_ms") or {}).get("p99")))
    if not curves:
        return "no per-tier latency histograms in the results"
    fig, ax = plt.subplots(figsize=(9, 5.2))
    colors = _tier_colors(list(tiers))
    for name, op, xs, ys, n, p99 in curves:
        p99_text = f", p99 {_fmt_ms(p99)}" if p99 is not None else ""
        _draw_cdf(ax, xs, ys, color=colors[name], ls=_OP_STYLE[op], lw=1.8, label=f"{name} {op}  ({n:,} ops{p99_text})")
    _cdf_frame(
        ax,
        "latency of one tier operation (ms, log scale)",
        "fraction of operations done within x",
        "Tier operation latency CDF (solid: read, dashed: write)",
    )
    ax.legend(loc="best", fontsize=9)
    fig.tight_layout()
    return fig


def _request_cdf(plt, doc: dict):
    hists = doc.get("request_histograms") or {}
    curves, zero = [], []
    for key, label in _REQUEST_HISTS:
        xs, ys, n = cdf_points(hists.get(key) or "")
        if xs:
            curves.append((label, xs, ys, n))
        elif n:
            zero.append(label)
    if not curves:
        return "no request latency histograms in the results"
    fig, ax = plt.subplots(figsize=(9, 5.2))
    for label, xs, ys, n in curves:
        _draw_cdf(ax, xs, ys, lw=1.8, label=f"{label}  ({n:,} requests)")
    _cdf_frame(ax, "latency per request (ms, log scale)", "fraction of requests done within x", "Request latency CDF")
    for label in zero:  # said in the legend, where it cannot cover a curve
        ax.plot([], [], " ", label=f"{label}: zero for every request, not drawn")
    ax.legend(loc="best", fontsize=9)
    fig.tight_layout()
    return fig


def _tier_colors(names: list[str]) -> dict[str, str]:
    palette = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive"]
    return {n: palette[i % len(palette)] for i, n in enumerate(names)}


def _throughput(plt, doc: dict):
    ts = timeline_series(doc)
    if not ts or len(ts["t_s"]) < 2:
        return "fewer than two timeline samples"
    # Each rate belongs to the interval ending at its sample; the first interval starts at 0 s.
    t = [0.0, *ts["t_s"]]

    def steps(values):
        return [values[0], *values]

    end = ts["t_s"][-1]
    samples = sorted(doc["timeline"], key=lambda s: s["t_s"])
    mean_rps = samples[-1].get("requests", 0) / end
    mean_rd = samples[-1].get("read_bytes", 0) / GB / end
    mean_wr = samples[-1].get("written_bytes", 0) / GB / end
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True, gridspec_kw={"height_ratios": [1, 1.4]})
    ax1.step(t, steps(ts["requests_per_s"]), where="pre", color="tab:blue", lw=1.6, label="completed requests/s")
    ax1.axhline(mean_rps, color="tab:blue", ls=":", lw=1, label=f"mean {mean_rps:.2f}/s")
    ax1.legend(loc="upper right", fontsize=9)
    ax1.set_ylabel("completed requests/s")
    # Headroom above the highest step for the legend.
    ax1.set_ylim(0, max(max(ts["requests_per_s"]), mean_rps, 1e-9) * 1.35)
    ax1.set_title("Throughput over time (each step: the rate since the previous sample)")
    ax1.grid(alpha=0.3)
    ax2.step(
        t,
        steps(ts["read_gbps"]),
        where="pre",
        color="tab:green",
        lw=1.6,
        label=f"read, all tiers (mean {mean_rd:.2f} GB/s)",
    )
    ax2.step(
        t,
        steps(ts["write_gbps"]),
        where="pre",
        color="tab:red",
        lw=1.6,
        label=f"write, all tiers (mean {mean_wr:.2f} GB/s)",
    )
    ax2.set_ylabel("bandwidth (GB/s)")
    ax2.set_xlabel("time since the run started (s)")
    ax2.set_ylim(0, max(*ts["read_gbps"], *ts["write_gbps"], 1e-9) * 1.3)
    ax2.set_xlim(left=0)
    ax2.grid(alpha=0.3)
    ax2.legend(loc="upper right", fontsize=9)
    fig.tight_layout()
    return fig


def _occupancy(plt, doc: dict):
    ts = timeline_series(doc)
    if not ts or not ts["used_gb"]:
        return "no tier occupancy in the timeline"
    names = list(ts["used_gb"])
    tiers = doc.get("tiers") or {}
    colors = _tier_colors(list(tiers) + [n for n in names if n not in tiers])
    cfg = doc.get("config") or {}
    ratio = (cfg.get("eviction") or {}).get("target_usage_ratio", cfg.get("target_usage_ratio"))
    fig, axes = plt.subplots(len(names), 1, figsize=(9, 1.2 + 2.2 * len(names)), sharex=True, squeeze=False)
    for ax, name in zip(axes[:, 0], names):
        cap_b = (tiers.get(name) or {}).get("capacity_bytes")
        cap = cap_b / GB if cap_b else None
        peak = max(ts["used_gb"][name], default=0.0)
        # GB, or MB for a tier that never reaches 1 GB (a small test tier would read 0.0 GB otherwise)
        scale, unit = (1.0, "GB") if max(cap or 0.0, peak) >= 1 else (1e3, "MB")
        used = [v * scale for v in ts["used_gb"][name]]
        # A gauge sampled at instants: a line through the samples (not steps, which would claim each value held).
        ax.fill_between(ts["t_s"], used, color=colors[name], alpha=0.25)
        ax.plot(ts["t_s"], used, color=colors[name], lw=1.6, marker=".", ms=4, label="used")
        top = peak * scale
        title = f"{name} tier"
        if cap:
            title += f" (capacity {cap * scale:,.3g} {unit}; peak {top:,.3g} {unit} = {peak / cap:.0%})"
            # Draw the capacity only when it is on the scale of what was used; else it flattens the curve.
            if cap <= 2.5 * max(peak, 1e-12):
                ax.axhline(cap * scale, color="0.3", ls="--", lw=1, label="capacity")
                if ratio:
                    ax.axhline(cap * scale * ratio, color="0.55", ls=":", lw=1, label=f"eviction target ({ratio:.0%})")
                top = max(top, cap * scale)
        else:
            title += f" (peak {top:,.3g} {unit})"
        ax.set_ylim(0, top * 1.12 if top else 1)
        ax.set_title(title, fontsize=10, loc="left")
        ax.set_ylabel(f"{unit} held")
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=8)
    axes[-1, 0].set_xlabel("time since the run started (s)")
    axes[-1, 0].set_xlim(left=0)
    fig.suptitle("Tier occupancy over time")
    fig.tight_layout()
    return fig


_ACTION_STYLE = {
    "scale_up": ("^", "tab:green"),
    "scale_down": ("v", "tab:red"),
    "hold": ("o", "0.5"),
    "peak_found": ("*", "tab:purple"),
}


def _autoscaling(plt, doc: dict):
    steps = [s for s in doc.get("autoscaling_stats") or [] if "t_s" in s]
    if not steps:
        return "no autoscaling_stats in the results"
    t = [s["t_s"] for s in steps]
    has_sat = any(s.get("saturation") is not None for s in steps)
    fig, axes = plt.subplots(3 if has_sat else 2, 1, figsize=(9, 7.5 if has_sat else 6), sharex=True)
    ax1, ax2 = axes[0], axes[1]
    # Each step's users and tokens/s were measured over the interval that ends at its time; the decision (marker)
    # takes effect after it. So both are drawn as steps over the interval before each point, from 0 s.
    t0 = [0.0, *t]
    users = [s.get("users") for s in steps]
    ax1.step(t0, [users[0], *users], where="pre", color="tab:blue", lw=1.6, label="users")
    seen = set()
    for s in steps:
        marker, color = _ACTION_STYLE.get(s.get("action"), ("x", "black"))
        label = s.get("action") if s.get("action") not in seen else None
        seen.add(s.get("action"))
        ax1.plot([s["t_s"]], [s.get("users")], marker=marker, color=color, ms=8, ls="none", label=label)
    ax1.set_ylabel("simulated users")
    ax1.set_ylim(bottom=0)
    ax1.set_title("Autoscaler steps (marker: the decision taken at the end of each step)")
    ax1.grid(alpha=0.3)
    ax1.legend(loc="upper left", fontsize=8, ncol=5)
    tput = [s.get("throughput_tokens_per_sec") for s in steps]
    ax2.step(t0, [tput[0], *tput], where="pre", color="tab:orange", lw=1.6)
    ax2.plot(t, tput, "o", color="tab:orange", ms=4)
    ax2.set_ylabel("tokens/s over the step")
    ax2.yaxis.set_major_formatter(_thousands())
    ax2.set_ylim(bottom=0)
    ax2.grid(alpha=0.3)
    if has_sat:
        ax3 = axes[2]
        sat = [s.get("saturation") for s in steps]
        ax3.step(t0, [sat[0], *sat], where="pre", color="tab:gray", lw=1.6, label="I/O saturation over the step")
        ax3.plot(t, sat, "o", color="tab:gray", ms=4)
        target = (doc.get("config") or {}).get("target_saturation")
        if isinstance(target, (int, float)):
            ax3.axhline(target, color="tab:red", ls="--", lw=1, label=f"target {target:.0%}")
        ax3.set_ylim(0, 1.05)
        ax3.set_ylabel("I/O workers busy")
        ax3.yaxis.set_major_formatter(_percent())
        ax3.grid(alpha=0.3)
        ax3.legend(loc="lower right", fontsize=8)
    axes[-1].set_xlabel("time since the run started (s)")
    axes[-1].set_xlim(left=0)
    fig.tight_layout()
    return fig


def _thousands():
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda v, _: f"{v:,.0f}")


def _percent():
    from matplotlib.ticker import PercentFormatter

    return PercentFormatter(1.0)


def _qos(plt, doc: dict):
    classes = (doc.get("summary") or {}).get("qos_metrics") or {}
    if not classes:
        return "no qos_metrics in the results"
    import numpy as np

    names = sorted(classes, key=lambda c: -(classes[c].get("priority") or 0))
    x = np.arange(len(names))
    width = 0.2
    fig, ax = plt.subplots(figsize=(max(7, 2.2 * len(names) + 3), 5.2))
    series = (
        ("service_latency_ms", "p95", "service p95", "tab:blue", -1.5),
        ("service_latency_ms", "p99", "service p99", "tab:cyan", -0.5),
        ("end_to_end_latency_ms", "p95", "end-to-end p95", "tab:orange", 0.5),
        ("end_to_end_latency_ms", "p99", "end-to-end p99", "navajowhite", 1.5),
    )
    for key, pct, label, color, off in series:
        vals = [((classes[c].get(key) or {}).get(pct)) or 0.0 for c in names]
        ax.bar(x + off * width, vals, width, label=label, color=color, edgecolor="0.3", lw=0.5)
    # SLA targets: a black bar across the service p95/p99 bars they judge.
    drew_target = False
    for i, c in enumerate(names):
        sla = classes[c].get("sla") or {}
        for pct, off in (("target_p95_ms", -1.5), ("target_p99_ms", -0.5)):
            if sla.get(pct):
                ax.hlines(
                    sla[pct],
                    x[i] + off * width - width * 0.6,
                    x[i] + off * width + width * 0.6,
                    color="black",
                    lw=2.2,
                    label=None if drew_target else "SLA target (p95, p99)",
                )
                drew_target = True
    # Bars on a log axis have no honest baseline: linear unless the classes span more than 50x.
    shown = [
        v
        for c in names
        for key in ("service_latency_ms", "end_to_end_latency_ms")
        for v in ((classes[c].get(key) or {}).get("p95"), (classes[c].get(key) or {}).get("p99"))
        if v
    ]
    shown += [
        v
        for c in names
        for v in (
            (classes[c].get("sla") or {}).get("target_p95_ms"),
            (classes[c].get("sla") or {}).get("target_p99_ms"),
        )
        if v
    ]
    log_scale = bool(shown) and max(shown) / max(min(shown), 1e-9) > 50
    if log_scale:
        ax.set_yscale("log")
        ax.set_ylim(min(shown) / 2, max(shown) * 2)
    from matplotlib.ticker import FuncFormatter

    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
    ax.set_xticks(x, [_qos_label(c, classes[c]) for c in names])
    colors = {"met": "tab:green", "missed": "tab:red"}
    for tick, c in zip(ax.get_xticklabels(), names):
        tick.set_color(colors.get(sla_verdict_text(classes[c]), "black"))
    ax.set_ylabel("latency (ms, log scale)" if log_scale else "latency (ms)")
    ax.set_title("QoS classes: latency against SLA targets (SLA judged on service latency)")
    ax.grid(alpha=0.3, axis="y", which="both")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig


def _qos_label(name: str, c: dict) -> str:
    verdict = {"met": "SLA met", "missed": "SLA missed"}.get(sla_verdict_text(c), "no data")
    return f"{name}\npriority {c.get('priority', '?')}, {c.get('requests', 0):,} req\n{verdict}"


# ---------------------------------------------------------------- kvtier replay


def _replay_cdf(plt, summary: dict):
    """TTFT and inter-token latency CDFs side by side (always drawn: an empty panel says the run had no data)."""
    hists = summary.get("histograms") or {}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6))
    for ax, key, what, share in (
        (axes[0], "ttft_ms", "TTFT", "requests"),
        (axes[1], "itl_ms", "Inter-token latency", "tokens"),
    ):
        xs, ys, n = cdf_points(hists.get(key) or "")
        if xs:
            _draw_cdf(ax, xs, ys, color="tab:blue", lw=1.8)
        else:
            ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="0.45")
        _cdf_frame(ax, f"{what} (ms, log scale)", f"fraction of {share} within x", f"{what} CDF (n={n:,})")
    fig.tight_layout()
    return fig


def _request_spans(rows: Iterable[dict[str, Any]]) -> list[tuple[int, float, float, float | None, bool]]:
    """(request id, sent s, end s, first token s or None, success) of each request that was sent."""
    spans = []
    for r in rows:
        if r.get("sent_ns") is None:
            continue
        end = next(v for v in (r.get("last_chunk_ns"), r.get("first_byte_ns"), r["sent_ns"]) if v is not None)
        first = r.get("first_token_ns")
        spans.append(
            (r["request_id"], r["sent_ns"] / 1e9, end / 1e9, None if first is None else first / 1e9, r["success"])
        )
    return spans


def _timeline(plt, spans: list[tuple[int, float, float, float | None, bool]]):
    if not spans:
        return "no request was sent"
    fig, ax = plt.subplots(figsize=(10, 4))
    for rid, sent, end, first, ok in spans:
        ax.plot([sent, end], [rid, rid], color="tab:blue" if ok else "tab:red", lw=1)
        if first is not None:
            ax.plot([first], [rid], ".", color="black", ms=2)
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("request id")
    ax.set_title("Request timeline (line: sent to last chunk, dot: first token, red: failed)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def _rounds(plt, summary: dict):
    rounds = summary.get("rounds")
    if not rounds:
        return "not a run in rounds"
    from matplotlib.ticker import MaxNLocator

    def values(key):
        return [float("nan") if r[key] is None else r[key] for r in rounds]

    xs = [r["round"] for r in rounds]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    bench = "predicted_hit_rate" in rounds[0]  # kvtier bench's rows: hits counted in the store, plan's prediction
    axes[0].plot(
        xs, values("hit_rate"), "o-", label="measured (tiered store)" if bench else "measured (server /metrics)"
    )
    axes[0].plot(xs, values("ideal_hit_rate"), "s--", label="ideal (reusable prefix)")
    if bench:
        axes[0].plot(xs, values("predicted_hit_rate"), "x:", label="kvtier plan's prediction")
    axes[0].set_ylim(0, 1.05)
    axes[0].set_ylabel("prefix hit rate")
    axes[1].plot(xs, values("ttft_p50_ms"), "o-", label="p50")
    axes[1].plot(xs, values("ttft_p95_ms"), "s-", label="p95")
    axes[1].set_ylabel("TTFT (ms)")
    for ax in axes:
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend()
        ax.grid(alpha=0.3)
    fig.suptitle("Per-round prefix reuse and TTFT")
    fig.tight_layout()
    return fig


def _round_bytes(plt, summary: dict):
    """Accumulated KV bytes written per round: one line per kvtier tier when the exporter was scraped, else the
    server's total (recompute rewrites show as a steeper line once reuse collapses)."""
    rounds = summary.get("rounds")
    if not rounds:
        return "not a run in rounds"
    from matplotlib.ticker import MaxNLocator

    tiers: list[str] = []
    for r in rounds:
        for t in r.get("kv_bytes_by_tier") or {}:
            if t not in tiers:
                tiers.append(t)
    series: dict[str, list[float]] = {}
    if tiers:
        for t in tiers:
            series[f"tier {t}"] = [((r.get("kv_bytes_by_tier") or {}).get(t) or {}).get("write", 0.0) for r in rounds]
    elif any(r.get("kv_written_bytes") is not None for r in rounds):
        series["KV written (server /metrics)"] = [r.get("kv_written_bytes") or 0.0 for r in rounds]
    else:
        return "no KV bytes written in the server's /metrics"
    xs = [r["round"] for r in rounds]
    grand = sum(sum(v) for v in series.values())
    unit, scale = ("GB", GB) if grand >= GB else ("MB", GB / 1000)  # a small run reads better in MB
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for label, per_round in series.items():
        acc, total = [], 0.0
        for v in per_round:
            total += v
            acc.append(total / scale)
        ax.plot(xs, acc, "o-", label=label)
    ax.set_xlabel("round")
    ax.set_ylabel(f"KV bytes written, accumulated ({unit})")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("KV written per tier, accumulated over the rounds")
    fig.tight_layout()
    return fig
