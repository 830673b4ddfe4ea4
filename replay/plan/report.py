"""What `kvtier plan` shows: one per-round table of every configuration, and one figure (plan.png).

Both read the plan document (replay/plan/cli.py's `plan_document`), so a saved plan.json draws the same way.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from rich.table import Table

from kvconnector.units import human_bytes

from ..common.cli import fail
from ..outputs.paths import write_results
from ..outputs.plots import save_figures
from ..outputs.tables import rows_table

__all__ = [
    "PLAN_FIGURE",
    "TRACE_FIGURE",
    "plan_table",
    "summary_lines",
    "trace_tables",
    "write_outputs",
    "write_plan_plot",
    "write_trace_plot",
]

PLAN_FIGURE = "plan.png"
TRACE_FIGURE = "plan-trace.png"


def _gb(n: float) -> str:
    """Bytes in GB with thousands separators: one unit down a column, so rows compare at a glance."""
    return f"{n / 1e9:,.1f} GB" if n >= 1e8 or n == 0 else human_bytes(n)


def _rate(v: float | None) -> str:
    return "-" if v is None else f"{v:.4f}"


def summary_lines(doc: dict) -> list[str]:
    """Per configuration: collapse, first eviction, rounds held, bytes written (and against the first)."""
    out = []
    for c in doc["configurations"]:
        collapse = f"collapses in round {c['collapse_round']}" if c["collapse_round"] else "does not collapse"
        evict = f"first eviction in round {c['first_eviction_round']}" if c["first_eviction_round"] else "no eviction"
        held = c["rounds_largest_tier_holds"]
        largest = max(c["tiers"], key=lambda t: t["capacity_bytes"])["name"]
        ratio = c.get("bytes_written_vs_first")
        first = doc["configurations"][0]["name"]
        vs = f" ({first} wrote {1 / ratio:.2f}x this)" if ratio and c is not doc["configurations"][0] else ""
        order = ", sessions in a new random order each round" if c.get("order") == "shuffled" else ""
        out.append(
            f"{c['name']}{order}: {collapse}, {evict}; {largest} alone holds "
            f"{'every' if held is None else f'{held:,}'} rounds; wrote {_gb(c['bytes_written_total'])}{vs}"
        )
    return out


def plan_table(doc: dict) -> Table:
    configs = doc["configurations"]
    cols = [
        ("round", "round"),
        ("prompt", "prompt tok"),
        ("ws", "working set"),
        ("ideal", "ideal hit"),
    ]
    for c in configs:
        cols += [(f"{c['name']}:hit", f"{c['name']} hit"), (f"{c['name']}:w", f"{c['name']} written")]
    rows: list[dict[str, Any]] = []
    first = configs[0]["rounds"] if configs else []
    for i, r in enumerate(first):
        row = {
            "round": r["round"],
            "prompt": f"{r['prompt_tokens_per_request']:,}",
            "ws": _gb(r["working_set_bytes"]),
            "ideal": _rate(r["ideal_hit_rate"]),
        }
        for c in configs:
            cr = c["rounds"][i]
            row[f"{c['name']}:hit"] = _rate(cr["predicted_hit_rate"])
            row[f"{c['name']}:w"] = _gb(cr["bytes_written"])
        rows.append(row)
    w = doc["workload"]
    t = rows_table(
        f"kvtier plan: {w['concurrency']} sessions x {w['rounds']} rounds, block {w['block_size']}, "
        f"{human_bytes(w['kv_bytes_per_token'])}/token, answers {configs[0]['answer_kv'] if configs else '?'}",
        rows,
        cols,
    )
    t.caption = "\n".join(summary_lines(doc))
    t.caption_justify = "left"
    if doc.get("status") == "interrupted":
        t.caption += "\nINTERRUPTED: configurations not simulated are missing"
    return t


def _draw(plt, doc: dict):
    configs = doc["configurations"]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    xs = [r["round"] for r in configs[0]["rounds"]]
    # The ideal on top: a configuration that tracks it would hide it otherwise.
    ideal = [r["ideal_hit_rate"] for r in configs[0]["rounds"]]
    ax.plot(xs, ideal, "k--", lw=1.5, zorder=5, label="ideal (infinite cache)")
    markers = "os^vDx"
    for i, c in enumerate(configs):
        label = c["name"] + (f" (collapses in round {c['collapse_round']})" if c["collapse_round"] else "")
        m = markers[i % len(markers)]
        (line,) = ax.plot(xs, [r["predicted_hit_rate"] for r in c["rounds"]], m + "-", ms=4, lw=2.5, label=label)
        if c["first_eviction_round"]:
            ax.axvline(c["first_eviction_round"], color=line.get_color(), ls=":", lw=1)
        ax2.plot(xs, [r["bytes_written_total"] / 1e9 for r in c["rounds"]], m + "-", ms=4, label=c["name"])
    ax.set_ylim(-0.02, 1.02)
    ax.set_ylabel("prefix hit rate (hit tokens / prompt tokens)")
    ax.set_title("Predicted hit rate per round (dotted: first eviction)")
    ax2.set_ylabel("KV written, accumulated (GB)")
    ax2.set_title("Bytes written (recompute rewrites)")
    from matplotlib.ticker import MaxNLocator

    for a in (ax, ax2):
        a.set_xlabel("round")
        a.xaxis.set_major_locator(MaxNLocator(integer=True))
        a.grid(alpha=0.3)
        a.legend(fontsize=8, loc="center right" if a is ax else "upper left")
    w = doc["workload"]
    fig.suptitle(
        f"{w['concurrency']} sessions, first prompt {w['first_input_len']:,} tok, +{w['output_len']:,} out "
        f"+{w['input_len']:,} in per round, block {w['block_size']}, {human_bytes(w['kv_bytes_per_token'])}/token",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


def write_plan_plot(doc: dict, directory: str | os.PathLike) -> list[str]:
    """Write DIR/plan.png: hit rate per round per configuration with the ideal, and bytes written accumulated."""
    return save_figures(directory, f"kvtier plan, {doc.get('created_at', '')}", [(PLAN_FIGURE, _draw)], doc)


# ---- kvtier plan --trace -------------------------------------------------------------------------------------------


def _tokens(n: float) -> str:
    """Tokens in the paper's terms: 3M, 50M, 1.2G."""
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.0f}"


def trace_tables(doc: dict) -> list[Table]:
    """Per trace its tiers' hit rates and the maximum; then the capacity sweep, one column per trace."""
    traces = doc["traces"]
    tier_names = [t["name"] for t in traces[0]["tiers"]] if traces else []
    cols = [("name", "trace"), ("requests", "requests"), ("prompt", "prompt tok"), ("unique", "distinct tok")]
    cols += [(f"t:{n}", f"{n} hit") for n in tier_names]
    if tier_names:
        cols += [("all", "tiers hit"), ("share", "of max")]
    cols += [("max", "max hit")]
    rows = []
    for t in traces:
        row = {
            "name": t["name"],
            "requests": f"{t['requests']:,}",
            "prompt": _tokens(t["prompt_tokens"]),
            "unique": _tokens(t["unique_tokens"]),
            "max": _rate(t["max_hit_rate"]),
        }
        for tier in t["tiers"]:
            row[f"t:{tier['name']}"] = _rate(tier["hit_rate"])
        if tier_names:
            row["all"] = _rate(t["tiers_hit_rate"])
            row["share"] = "-" if t["share_of_max"] is None else f"{t['share_of_max']:.0%}"
        rows.append(row)
    block = traces[0]["block_tokens"] if traces else "?"
    sizes = ", ".join(f"{t['name']} {_tokens(t['capacity_tokens'])} tok" for t in traces[0]["tiers"]) if traces else ""
    first = rows_table(f"kvtier plan --trace: prefix hit rate, block {block} tokens; {sizes or 'no tiers'}", rows, cols)
    if doc.get("status") == "interrupted":
        first.caption = "INTERRUPTED: traces not simulated are missing"
    elif doc.get("order"):
        first.caption = f"request order: {doc['order']}"
    sweep_cols = [("cap", "capacity tok")] + [(t["name"], t["name"]) for t in traces]
    sweep_rows = []
    for i, cap in enumerate(doc["capacities_tokens"]):
        r = {"cap": _tokens(cap)}
        for t in traces:
            r[t["name"]] = _rate(t["curve"][i]["hit_rate"])
        sweep_rows.append(r)
    return [first, rows_table("hit rate against cache capacity (LRU, prefix rule)", sweep_rows, sweep_cols)]


def _draw_trace(plt, doc: dict):
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    markers = "os^vDx"
    traces = doc["traces"]
    for i, t in enumerate(traces):
        xs = [p["capacity_tokens"] for p in t["curve"]]
        label = t["name"] + (f": {t['share_of_max']:.0%} of its max in the tiers" if t["tiers"] else "")
        (line,) = ax.plot(xs, [p["hit_rate"] for p in t["curve"]], markers[i % 6] + "-", ms=3.5, lw=2, label=label)
        ax.axhline(t["max_hit_rate"], color=line.get_color(), ls=":", lw=0.8)
        if t["tiers"]:  # where the tiers' capacity meets the curve
            cap = sum(x["capacity_tokens"] for x in t["tiers"])
            ax.plot([cap], [t["tiers_hit_rate"]], "o", ms=8, mfc="none", mec=line.get_color(), mew=1.5)
    bound = 0.0
    for tier in traces[0]["tiers"] if traces else []:
        bound += tier["capacity_tokens"]
        ax.axvline(bound, color="0.3", ls="--", lw=1)
        ax.text(
            bound,
            1.0,
            f" {tier['name']} {_tokens(bound)}",
            transform=ax.get_xaxis_transform(),
            fontsize=8,
            va="top",
            color="0.3",
        )
    ax.set_xscale("log")
    ax.set_xlabel("cache capacity (tokens)")
    ax.set_ylabel("prefix hit rate (hit tokens / prompt tokens)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title("Hit rate against capacity (dotted: each trace's maximum; dashed: the tiers)", fontsize=10)
    fig.tight_layout()
    return fig


def write_trace_plot(doc: dict, directory: str | os.PathLike) -> list[str]:
    """Write DIR/plan-trace.png: each trace's hit rate against capacity, its maximum, the tiers' capacities."""
    return save_figures(
        directory, f"kvtier plan --trace, {doc.get('created_at', '')}", [(TRACE_FIGURE, _draw_trace)], doc
    )


def write_outputs(
    prog: str,
    doc: dict,
    output: str | None,
    plots: str | None,
    plot: Callable[[dict, str], Any] | None,
    html: str | None = None,
) -> int:
    """Write --output (the JSON; to the default place if its path fails now), the figures under --plots (`plot`,
    None when there is nothing to draw) and the --html-output page; 1 when one of them could not be written at all
    (said on stderr)."""
    rc = 0
    path = None
    if output:
        try:
            path, err = write_results(output, doc)
            if err:
                print(f"{prog}: {err}; wrote {path} instead", file=sys.stderr)
        except OSError as exc:
            rc = fail(prog, str(exc), 1)
    if html:
        from ..outputs.html import write_html  # plotly only when asked

        try:
            write_html(doc, html, path)
        except OSError as exc:
            rc = fail(prog, f"--html-output {html}: not written ({exc.strerror or exc})", 1)
    if plots and plot is not None:
        try:
            plot(doc, plots)
        except OSError as exc:
            rc = fail(prog, f"--plots {plots}: not written ({exc.strerror or exc})", 1)
    return rc
