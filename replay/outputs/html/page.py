"""One self-contained HTML page of one or more runs of the same kind: nothing is fetched when it is viewed.

plotly's bundled JavaScript is inlined once in the head and every figure is a div drawn by it (zoom, hover with
values); tables are plain HTML. Each value cell carries the number it shows (`data-value`, full precision) and, when
the number is read straight from the document, where from (`data-path`, keys joined by "/"), so what the page says
can be checked against the JSON.
"""

from __future__ import annotations

import html
import json
from typing import Any

import plotly.io as pio
from plotly.offline import get_plotlyjs

from ..compare_rows import Row, format_ratio, format_value, metric_label, ratio, ratio_verdict, value_at
from ..provenance import kvtier_version
from .kinds import FAMILY, KIND_TITLES, ReportError, Run
from .plot_text import literal_figure
from .sections import VIEWS, overlay_style

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;max-width:1400px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd}
.sub{color:#666;font-size:13px}
.banner{padding:10px 14px;margin:8px 0;border-radius:4px;font-weight:600}
.banner.error{background:#fde2e1;border:1px solid #e0605a;color:#8a1c17}
.banner.warn{background:#fff4d6;border:1px solid #e0b040;color:#6b4d00}
.banner.note{background:#eef4fb;border:1px solid #9bbbe0;color:#24476b;font-weight:400}
table{border-collapse:collapse;font-size:13px;margin:6px 0}
th,td{border:1px solid #ddd;padding:3px 8px} th{background:#f4f4f4;text-align:left}
td.num{text-align:right;font-variant-numeric:tabular-nums}
td.good{color:#17702a} td.bad{color:#b3261e} td.warn{color:#8a5a00} td.skip{color:#777}
tr.trial-total td{font-weight:600;background:#fafafa}
details{margin:6px 0} summary{cursor:pointer;font-weight:600}
.kv td:first-child{color:#555;white-space:nowrap} .kv td{vertical-align:top}
.plots{display:grid;grid-template-columns:1fr 1fr;gap:12px}
.plot{min-width:0;overflow:hidden}
@media (max-width:1000px){.plots{grid-template-columns:1fr}}
"""


def _cell(value: Any, unit: str, path: str | None) -> str:
    attrs = ""
    if isinstance(value, int | float) and not isinstance(value, bool):
        attrs += f' data-value="{value!r}"'
    if path:
        attrs += f' data-path="{html.escape(path)}"'
    cls = "num" if isinstance(value, int | float) else ""
    return f'<td class="{cls}"{attrs}>{html.escape(format_value(value, unit))}</td>'


def _summary_table(runs: list[Run], rows: list[Row]) -> str:
    head = "<tr><th>metric</th>"
    for i, run in enumerate(runs):
        head += f"<th>{html.escape(run.label)}</th>" + ("<th>ratio</th>" if i else "")
    out = [f'<table class="summary"><thead>{head}</tr></thead><tbody>']
    for row in rows:
        values = [value_at(r.doc, row.get) for r in runs]
        if all(v is None for v in values):
            continue
        path = "/".join(row.get) if isinstance(row.get, tuple) else None
        cells = [f'<td class="metric">{html.escape(metric_label(row.metric, row.unit))}</td>']
        for i, v in enumerate(values):
            cells.append(_cell(v, row.unit, path))
            if i:
                r = ratio(v, values[0])
                verdict = ratio_verdict(r, row.better)
                cls = f"num {verdict}" if verdict else "num"
                attr = "" if r is None else f' data-value="{r!r}"'
                cells.append(f'<td class="{cls} ratio"{attr}>{format_ratio(r)}</td>')
        out.append(f"<tr>{''.join(cells)}</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _kv_table(obj: Any, depth: int = 0) -> str:
    """A nested mapping as nested key/value tables (lists of scalars on one line)."""
    if isinstance(obj, dict):
        if not obj:
            return "<i>empty</i>"
        rows = "".join(
            f"<tr><td>{html.escape(str(k))}</td><td>{_kv_table(v, depth + 1)}</td></tr>" for k, v in obj.items()
        )
        return f'<table class="kv">{rows}</table>'
    if isinstance(obj, list) and any(isinstance(v, dict | list) for v in obj):
        return "".join(_kv_table(v, depth + 1) for v in obj[:50]) + ("<i>...</i>" if len(obj) > 50 else "")
    if isinstance(obj, list):
        return html.escape(", ".join(map(str, obj)))
    return html.escape("-" if obj is None else str(obj))


def _banners(runs: list[Run]) -> str:
    out = []
    for run in runs:
        for level, text in VIEWS[run.kind].banners(run):
            prefix = f"{run.label}: " if len(runs) > 1 or level != "note" else ""
            out.append(f'<div class="banner {level}" data-level="{level}">{html.escape(prefix + text)}</div>')
    return "".join(out)


def render_report(runs: list[Run], title: str | None = None) -> str:
    """The whole page for `runs` (labels set; all of one kind, or of kvtier bench's family)."""
    kinds = {FAMILY.get(r.kind, r.kind) for r in runs}
    if len(kinds) > 1:
        listing = ", ".join(f"{r.path} ({KIND_TITLES[r.kind]})" for r in runs)
        raise ReportError(f"cannot overlay results of different kinds in one report: {listing}")
    view = VIEWS[runs[0].kind]
    kind_title = " / ".join(dict.fromkeys(KIND_TITLES[r.kind] for r in runs))
    title = title or f"{kind_title}: {', '.join(r.label for r in runs)}"
    figs = view.figures(runs)
    if len(runs) > 1:
        overlay_style(figs, [r.label for r in runs])
    plots = "".join(
        '<div class="plot">'
        + pio.to_html(
            literal_figure(f),  # user text drawn as typed, not as plotly's markup
            full_html=False,
            include_plotlyjs=False,
            div_id=f"plot-{i}",
            config={"responsive": True},
            default_width="100%",
            default_height="420px",
        )
        + "</div>"
        for i, f in enumerate(figs)
    )
    ratio_note = f" (ratio: each run / {html.escape(runs[0].label)})" if len(runs) > 1 else ""
    runs_list = "".join(
        f"<li><b>{html.escape(r.label)}</b>: {html.escape(r.path)} ({html.escape(KIND_TITLES[r.kind])})</li>"
        for r in runs
    )
    details = "".join(
        f"<h3>{html.escape(r.label)}</h3>"
        f"<details><summary>configuration</summary>{_kv_table(view.config(r))}</details>"
        f"<details><summary>system</summary>{_kv_table(view.system(r))}</details>"
        for r in runs
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<meta name="generator" content="kvtier {html.escape(kvtier_version())}">
<style>{CSS}</style>
<script type="text/javascript">{get_plotlyjs()}</script>
</head><body data-kind="{html.escape(runs[0].kind)}">
<h1>{html.escape(title)}</h1>
<div class="sub">kvtier report, kvtier {html.escape(kvtier_version())}; every plot zooms (drag) and shows values on
hover; double-click resets.</div>
<ul class="runs">{runs_list}</ul>
{_banners(runs)}
<h2>Summary{ratio_note}</h2>
{_summary_table(runs, view.rows(runs))}
{view.tables(runs) if view.tables else ""}
<h2>Plots</h2>
<div class="plots">{plots or "<p>no plottable data in these results</p>"}</div>
<h2>Configuration and system</h2>
{details}
<script type="application/json" id="kvtier-runs">{_runs_json(runs)}</script>
</body></html>
"""


def _runs_json(runs: list[Run]) -> str:
    # the page's own list of what it shows (for scripts reading the page); "</" escaped so it cannot end the tag
    return json.dumps([{"label": r.label, "path": r.path, "kind": r.kind} for r in runs]).replace("</", "<\\/")
