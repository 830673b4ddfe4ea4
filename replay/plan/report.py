"""What `kvtier plan` shows: one per-round table of every configuration, and one figure (plan.png).

Both read the plan document (replay/plan/cli.py's `plan_document`), so a saved plan.json draws the same way.
"""

from __future__ import annotations

import os
from typing import Any

from rich.table import Table

from kvconnector.units import human_bytes

from ..outputs.plots import save_figures
from ..outputs.tables import rows_table

__all__ = ["PLAN_FIGURE", "plan_table", "summary_lines", "write_plan_plot"]

PLAN_FIGURE = "plan.png"


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
