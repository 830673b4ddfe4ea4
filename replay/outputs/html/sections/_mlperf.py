"""A run of the MLPerf Storage KV cache harness (`kvtier mlperf run` or mlpstorage): the headline of Rules.md 6.3.4.5
per Option (read GB/s, device read and write p95, storage tokens/s) and the total ranks in the summary table; the
rules' verdicts by rule ID and the Options x trials x ranks table below it; per trial, each rank's share of the
trial's figure (stacked bars: a trial's bar is the sum the aggregation takes) with the Option's headline across.

The document is replay/mlperf/report_doc.py's: this module only draws it (a sink knows nothing of the harness's
package). A figure the summary lacks (mlpstorage's summary has no device p95s) is the maximum over the rank files,
as the aggregation takes it, shown without a JSON path and named "(from the rank files)".
"""

from __future__ import annotations

import html
from collections import defaultdict
from typing import Any

import plotly.graph_objects as go

from ...compare_rows import Row, format_value
from ..kinds import Run
from ._shared import PALETTE, KindView, kept, new_figure

# The headline of one Option: (words, unit, summary key, rank figure it aggregates, better)
HEADLINE = (
    ("read GB/s", "GB/s", "aggregated_read_bandwidth_gbps", "read_gbps", "higher"),
    ("device read p95", "ms", "aggregated_device_read_p95_ms", "device_read_p95_ms", "lower"),
    ("device write p95", "ms", "aggregated_device_write_p95_ms", "device_write_p95_ms", "lower"),
    ("storage tokens/s", "tokens/s", "aggregated_storage_throughput_tokens_per_sec", "storage_tokens_per_s", "higher"),
)
# Shown after the headline: the rest of the summary's figures per Option.
MORE = (
    ("write GB/s", "GB/s", "aggregated_write_bandwidth_gbps", "write_gbps", "higher"),
    ("tokens/s", "tokens/s", "aggregated_avg_throughput_tokens_per_sec", "avg_tokens_per_s", "higher"),
    ("storage I/O p95 (mlpstorage scores)", "ms", "aggregated_p95_latency_ms", "io_p95_ms", "lower"),
)
# The rank table's figures: (column, unit, key of a rank entry, how a trial's ranks combine)
RANK_COLUMNS = (
    ("read GB/s", "GB/s", "read_gbps", sum),
    ("write GB/s", "GB/s", "write_gbps", sum),
    ("storage tokens/s", "tokens/s", "storage_tokens_per_s", sum),
    ("tokens/s", "tokens/s", "avg_tokens_per_s", sum),
    ("I/O p95 ms", "ms", "io_p95_ms", max),
    ("device read p95 ms", "ms", "device_read_p95_ms", max),
    ("device write p95 ms", "ms", "device_write_p95_ms", max),
)


def _options(doc: dict) -> list[str]:
    return sorted(doc["summary"]["options"], key=lambda o: (not o.isdigit(), int(o) if o.isdigit() else 0, o))


def _ranks_of(doc: dict, option: str) -> list[dict]:
    return [r for r in doc["ranks"] if str(r["option"]) == option and "error" not in r]


def _from_ranks(option: str, key: str) -> Any:
    """An Option's p95 the summary lacks: the maximum over its ranks and trials, as the aggregation takes it."""

    def get(doc: dict) -> Any:
        values = [r[key] for r in _ranks_of(doc, option) if isinstance(r.get(key), int | float)]
        return max(values) if values else None

    return get


def summary_rows(runs: list[Run]) -> list[Row]:
    doc = runs[0].doc
    rows = [
        Row("mode", "", ("record", "mode")),
        Row("total ranks", "", ("summary", "total_ranks")),
        Row(
            "ranks per host x hosts", "", lambda d: f"{d['summary'].get('npernode')} x {d['summary'].get('host_count')}"
        ),
        Row("trials per Option", "", ("summary", "trials_per_option")),
    ]
    for o in _options(doc):
        entry = doc["summary"]["options"][o]
        for words, unit, key, rank_key, better in HEADLINE + MORE:
            at = ("summary", "options", o, key)
            if key in entry:
                rows.append(Row(f"Option {o}: {words}", unit, at, better))
            elif key.startswith("aggregated_device_"):
                rows.append(Row(f"Option {o}: {words} (from the rank files)", unit, _from_ranks(o, rank_key), better))
    return rows


def banners(run: Run) -> list[tuple[str, str]]:
    d = run.doc
    out = []
    if d["record"].get("status") not in (None, "", "completed"):
        out.append(("error", f"the run's status: {d['record']['status']} (partial results)"))
    if d["summary"].get("partial_failure"):
        missing = [m for o in d["summary"]["options"].values() for m in o.get("missing_files") or []]
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        out.append(("error", f"partial failure: {len(missing)} rank files missing or unreadable ({shown})"))
    if d["failing"]:
        out.append(
            ("error", f"rules failing ({d['record'].get('mode') or 'mode not recorded'}): {', '.join(d['failing'])}")
        )
    else:
        out.append(("note", "every rule a validator can check holds (verdicts below)"))
    if d.get("summary_computed"):
        out.append(("warn", "no run summary of this run: its figures are the aggregation of the rank files, made here"))
    cpu = [r for o in d["summary"]["options"].values() for r in o.get("cpu_tier_ranks") or []]
    if cpu:
        out.append(("warn", f"{len(cpu)} rank files CPU-tier (storage_entries 0): no storage read measured there"))
    return out


def _td(value: Any, unit: str = "", path: str | None = None, cls: str = "") -> str:
    attrs = ""
    if isinstance(value, int | float) and not isinstance(value, bool):
        attrs += f' data-value="{value!r}"'
        cls = f"num {cls}".strip()
    if path:
        attrs += f' data-path="{html.escape(path)}"'
    return f'<td class="{cls}"{attrs}>{html.escape(format_value(value, unit))}</td>'


def _verdict_class(verdict: str, mode: str) -> str:
    if verdict == "FAIL" or (verdict == "OPEN" and mode == "closed"):
        return "bad"
    return {"PASS": "good", "OPEN": "warn"}.get(verdict, "skip")


def _verdicts(doc: dict) -> str:
    mode = doc["record"].get("mode") or ""
    findings = doc["findings"]
    rules = {f["rule"] for f in findings if f["verdict"] != "SKIP"}
    failing = set(doc["failing"])
    head = (
        f'<p class="sub">{len(rules - failing)} of {len(rules)} rules hold'
        + (f"; failing: {html.escape(', '.join(sorted(failing)))}" if failing else "")
        + " (FAIL fails the run; OPEN is acceptable in an OPEN run only; SKIP: not applicable or not checkable)</p>"
    )
    rows = "".join(
        f'<tr class="finding" data-rule="{html.escape(f["rule"])}" data-verdict="{html.escape(f["verdict"])}">'
        f'<td class="{_verdict_class(f["verdict"], mode)}">{html.escape(f["verdict"])}</td>'
        f"<td>{html.escape(f['rule'])}</td><td>{html.escape(f['section'])}</td>"
        f"<td>{html.escape(f['detail'])}</td></tr>"
        for f in findings
    )
    return (
        "<h2>Rules (Rules.md section 6)</h2>"
        + head
        + '<table class="verdicts"><thead><tr><th>verdict</th><th>rule</th><th>section</th><th>finding</th></tr>'
        + f"</thead><tbody>{rows}</tbody></table>"
    )


def _rank_table(doc: dict) -> str:
    by_trial: dict[tuple[int, int], list[dict]] = defaultdict(list)
    for i, r in enumerate(doc["ranks"]):
        by_trial[(r["option"], r["trial"])].append(r | {"_i": i})
    head = "".join(f"<th>{html.escape(c)}</th>" for c, *_ in RANK_COLUMNS)
    out = [
        "<h2>Options x trials x ranks</h2>",
        '<p class="sub">each rank file\'s figures as the aggregation reads them (0 where the file has none); a'
        " trial's row sums the ranks' bandwidths and throughputs and takes the maximum of their p95s</p>",
        '<table class="ranks"><thead><tr><th>Option</th><th>trial</th><th>rank</th>'
        f"{head}<th>storage entries</th><th>file</th></tr></thead><tbody>",
    ]
    total_ranks = doc["summary"].get("total_ranks")
    for (option, trial), ranks in sorted(by_trial.items()):
        have = {r["rank"] for r in ranks}
        for rank in range(total_ranks if isinstance(total_ranks, int) else 0):
            if rank not in have:  # a rank that left no file: a row saying so, where its figures would be
                ranks.append(
                    {"rank": rank, "error": "no results file", "path": f"option_{option}/trial_{trial}/rank_{rank}/"}
                )
        for r in sorted(ranks, key=lambda r: r["rank"]):
            at = f'<td class="num">{option}</td><td class="num">{trial}</td><td class="num">{r["rank"]}</td>'
            if "error" in r:
                cells = f'<td class="bad" colspan="{len(RANK_COLUMNS) + 1}">{html.escape(_missing(r))}</td>'
            else:
                cells = "".join(_td(r.get(key), unit, f"ranks/{r['_i']}/{key}") for _, unit, key, _ in RANK_COLUMNS)
                cells += _td(
                    r.get("storage_entries"),
                    "",
                    f"ranks/{r['_i']}/storage_entries",
                    "warn" if r.get("cpu_tier") else "",
                )
            out.append(f'<tr class="rank">{at}{cells}<td>{html.escape(r["path"])}</td></tr>')
        good = [r for r in ranks if "error" not in r]
        total = "".join(
            _td(combine(r[key] for r in good) if good else None, unit) for _, unit, key, combine in RANK_COLUMNS
        )
        out.append(
            f'<tr class="trial-total"><td class="num">{option}</td><td class="num">{trial}</td><td>trial</td>'
            f"{total}<td></td><td></td></tr>"
        )
    out.append("</tbody></table>")
    return "".join(out)


def _missing(r: dict) -> str:
    return r["error"] if r["error"] == "no results file" else f"unreadable: {r['error']}"


def tables(runs: list[Run]) -> str:
    return "".join(_verdicts(r.doc) + _rank_table(r.doc) for r in runs)


def _x(ranks: list[dict]) -> list[list[str]]:
    """Two-level categories: the Option, then the trial."""
    return [[f"Option {r['option']}" for r in ranks], [f"trial {r['trial']}" for r in ranks]]


def _trials(doc: dict) -> list[tuple[int, int]]:
    return sorted({(r["option"], r["trial"]) for r in doc["ranks"] if "error" not in r})


def _headline_lines(fig: go.Figure, doc: dict, key: str, rank_key: str) -> None:
    """The Option's figure of the summary across its trials (dashed): the mean of the trials' sums, or the
    maximum of the p95s."""
    trials = _trials(doc)
    first = True
    for o in _options(doc):
        value = doc["summary"]["options"][o].get(key)
        if value is None and key.startswith("aggregated_device_"):
            value = _from_ranks(o, rank_key)(doc)
        xs = [t for t in trials if str(t[0]) == o]
        if not isinstance(value, int | float) or not xs:
            continue
        fig.add_trace(
            go.Scatter(
                x=_x([{"option": a, "trial": b} for a, b in xs]),
                y=[value] * len(xs),
                name="Option's figure (summary)",
                legendgroup="headline",
                showlegend=first,
                mode="lines+markers" if len(xs) == 1 else "lines",
                line={"dash": "dash", "color": "#222"},
                marker={"symbol": "line-ew-open", "size": 24},
            )
        )
        first = False


def _stacked(doc: dict, title: str, unit: str, rank_key: str, key: str) -> go.Figure:
    fig = new_figure(title, "Option, trial", unit)
    by_rank: dict[int, list[dict]] = defaultdict(list)
    for r in sorted(doc["ranks"], key=lambda r: (r["option"], r["trial"])):
        if "error" not in r:
            by_rank[r["rank"]].append(r)
    for rank, ranks in sorted(by_rank.items()):
        fig.add_trace(
            go.Bar(
                x=_x(ranks),
                y=[r[rank_key] for r in ranks],
                name=f"rank {rank}",
                marker={"color": PALETTE[rank % len(PALETTE)]},
                hovertemplate="%{x}: %{y:.4g}<extra>%{fullData.name}</extra>",
            )
        )
    fig.update_layout(barmode="stack")
    if fig.data:
        _headline_lines(fig, doc, key, rank_key)
    return fig


def _p95s(doc: dict) -> go.Figure:
    fig = new_figure("Device p95 per rank", "Option, trial", "ms")
    ranks = sorted((r for r in doc["ranks"] if "error" not in r), key=lambda r: (r["option"], r["trial"], r["rank"]))
    for i, (words, rank_key) in enumerate((("read", "device_read_p95_ms"), ("write", "device_write_p95_ms"))):
        if ranks:
            fig.add_trace(
                go.Scatter(
                    x=_x(ranks),
                    y=[r[rank_key] for r in ranks],
                    customdata=[f"rank {r['rank']}" for r in ranks],
                    name=f"device {words} p95",
                    mode="markers",
                    marker={"size": 9, "color": PALETTE[i], "symbol": ("circle", "diamond")[i]},
                    hovertemplate="%{x}, %{customdata}: %{y:.4g} ms<extra>%{fullData.name}</extra>",
                )
            )
    return fig


def figures(runs: list[Run]) -> list[go.Figure]:
    figs = []
    for run in runs:
        d = run.doc
        figs += [
            _stacked(d, "Read bandwidth per trial, by rank", "GB/s", "read_gbps", "aggregated_read_bandwidth_gbps"),
            _stacked(
                d,
                "Storage throughput per trial, by rank",
                "tokens/s",
                "storage_tokens_per_s",
                "aggregated_storage_throughput_tokens_per_sec",
            ),
            _stacked(d, "Write bandwidth per trial, by rank", "GB/s", "write_gbps", "aggregated_write_bandwidth_gbps"),
            _p95s(d),
        ]
    return kept(figs)


def _config(run: Run) -> dict:
    return {k: v for k, v in run.doc["record"].items() if k != "commands"} | {
        "commands": [f"Option {c['option']} trial {c['trial']}: {c['command']}" for c in run.doc["record"]["commands"]]
    }


VIEW = KindView(
    summary_rows,
    banners,
    figures,
    _config,
    lambda run: {
        "run directory": run.doc["run_dir"],
        "run summary": run.doc.get("summary_path") or "(none: aggregated here)",
        "other summaries": run.doc.get("other_summaries") or [],
        "summary schema": run.doc["summary"].get("schema_version"),
        "run_datetime": run.doc["summary"].get("run_datetime"),
    },
    tables,
)
