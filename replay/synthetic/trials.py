"""`kvtier bench --trials N`: N runs of one configuration, each with a fresh cache, and their spread.

The MLPerf KV Cache spec asks for 3-5 trials per configuration and the median of each metric (its trials vary with a
CV of 50-125%). Each trial is a whole `kvtier bench` run (`run_single`, or `run_clients` with --num-clients): its own
cache directory, created empty and removed after, and its own results file beside the output,
`<output stem>-trial<i>.json`, written as the trial ends. Every trial uses the same seed (the spec's `--seed 42`
for all five) unless --vary-seed gives trial i seed + i - 1.

The output file holds the trials document: `per_trial` (each trial's file, status, seed and summary), `aggregate`
(per summary figure: median, min, max, CV and the per-trial values, over the completed trials) and `summary`, the
medians in the shape of a run's summary, so readers of `summary.<key>` get the median. Medians are taken across the
trials' own figures; a percentile stays what its trial's histogram says (percentiles are never pooled or averaged).

A stop signal ends the trial under way the way it ends any run (its partial results in its file) and no further
trial starts; the trials that completed are aggregated and the exit status is the signal's (130, 143).

Other outputs are per trial: --xlsx-output, --csv-output and --io-trace-log get the same `-trial<i>` suffix,
--plots DIR gets DIR/trial<i>/ for each trial's figures and DIR/trials.png for the spread across trials.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys

from rich.table import Table

from ..common.cli import Interrupted, stop_signals_raise
from ..outputs.paths import write_results
from ..outputs.terminal import console as terminal_console
from .config import AUTO_KEYS, BenchConfig
from .finish import PROG, bench_fail
from .lifecycle import run_single
from .multiclient import run_clients
from .trial_paths import KEYED_OUTPUTS, suffixed, trial_path

# Figures shown in the closing table (the spec's metrics first); every numeric figure is in `aggregate`.
TABLE_KEYS = (
    "cache_stats.decode_bytes_read_gb",
    "avg_throughput_tokens_per_sec",
    "storage_throughput_tokens_per_sec",
    "cache_stats.nvme_read_device_p95_ms",
    "cache_stats.nvme_write_device_p95_ms",
    "end_to_end_latency_ms.p95",
    "storage_io_latency_ms.p95",
    "cache_stats.cache_hit_rate",
    "total_requests",
)
# Parts of a summary that are not figures to aggregate: encoded histograms, and maps keyed by data.
_SKIP = {"histograms", "requests_by_profile", "window"}


def flatten(summary: dict, prefix: str = "") -> dict[str, float]:
    """Numeric leaves of a summary as dotted keys (`cache_stats.decode_bytes_read_gb`); booleans are not numbers."""
    out: dict[str, float] = {}
    for k, v in summary.items():
        if k in _SKIP:
            continue
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[f"{prefix}{k}"] = v
    return out


def spread(values: list[float]) -> dict:
    """median, min, max and CV (sample standard deviation / mean; None for one trial or a zero mean)."""
    mean = statistics.fmean(values)
    cv = statistics.stdev(values) / mean if len(values) > 1 and mean else None
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "cv": None if cv is None or math.isnan(cv) else round(cv, 4),
        "n": len(values),
        "values": values,
    }


def aggregate(summaries: list[dict]) -> dict[str, dict]:
    """Per figure, its spread over the given trials' summaries (a figure missing from a trial is left out there)."""
    flat = [flatten(s) for s in summaries]
    keys = list(dict.fromkeys(k for f in flat for k in f))
    return {k: spread([f[k] for f in flat if k in f]) for k in keys}


def median_summary(summaries: list[dict], agg: dict[str, dict], prefix: str = "") -> dict:
    """The first summary's shape with each aggregated figure replaced by its median across the trials. Any other
    value (a status, an SLA verdict, a reason) is kept where every trial has the same one, else None: one trial's
    verdict is not the trials'."""
    out = {}
    for k, v in summaries[0].items():
        if k in _SKIP:
            continue
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out[k] = median_summary([s.get(k) or {} for s in summaries], agg, f"{key}.")
        elif key in agg:
            out[k] = agg[key]["median"]
        else:
            out[k] = v if all(s.get(k) == v for s in summaries) else None
    return out


def trials_document(cfg: BenchConfig, per_trial: list[dict], docs: list[dict], requested: int, status: str) -> dict:
    done = [d for t, d in zip(per_trial, docs) if t["status"] == "completed"]
    agg = aggregate([d["summary"] for d in done]) if done else {}
    first = (done or docs or [{}])[0]
    return {
        "kind": "kvtier-bench-trials",
        "status": status,
        "trials_requested": requested,
        "trials_completed": len(done),
        "note": "summary holds each figure's median over the completed trials; aggregate has min, max, CV and "
        "the per-trial values; each trial's own results are in its file (per_trial[].file)",
        # as the trials ran: what a trial's file records for a key left to the run (--gpu-mem-gb: the host's CUDA)
        "config": cfg.as_run(**{k: (first.get("config") or {}).get(k) for k in AUTO_KEYS}).model_dump(mode="json"),
        "request_model": cfg.request_model,
        "size_unit": cfg.size_unit,
        "model": first.get("model"),
        "environment": first.get("environment"),
        "per_trial": per_trial,
        "aggregate": agg,
        "summary": median_summary([d["summary"] for d in done], agg) if done else {},
    }


def trials_table(doc: dict) -> Table:
    """The spec's figures over the trials; every figure with its per-trial values is in the document's aggregate."""
    t = Table(title=f"kvtier bench: median of {doc['trials_completed']} of {doc['trials_requested']} trials")
    t.add_column("figure (summary.)", no_wrap=True)  # whole: it is what to look up in the JSON
    for head in ("median", "min", "max", "CV"):
        t.add_column(head, justify="right", no_wrap=True)
    for key in TABLE_KEYS:
        a = doc["aggregate"].get(key)
        if a is not None:
            cv = "-" if a["cv"] is None else f"{a['cv']:.1%}"
            t.add_row(key, *(f"{a[k]:,.4g}" for k in ("median", "min", "max")), cv)
    return t


def write_trials_plot(doc: dict, directory: str) -> str | None:
    """`<directory>/trials.png`: per figure of the closing table, each trial's value (dots, by trial number) and the
    median (line), the CV in the panel's title: how far one trial may stray from the median. None when no figure
    has a value."""
    keys = [k for k in TABLE_KEYS if k in doc["aggregate"]]
    if not keys:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 3
    rows = math.ceil(len(keys) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(11, 2.6 * rows), squeeze=False)
    for ax, key in zip(axes.flat, keys):
        a = doc["aggregate"][key]
        xs = range(1, len(a["values"]) + 1)
        ax.plot(xs, a["values"], "o", color="tab:blue")
        ax.axhline(a["median"], color="tab:orange", lw=1.5, label="median")
        cv = "-" if a["cv"] is None else f"{a['cv']:.0%}"
        ax.set_title(f"{key.removeprefix('cache_stats.')}\nCV {cv}", fontsize=9)
        ax.set_xticks(list(xs))
        ax.set_xlabel("trial", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.set_ylim(bottom=0)
    for ax in list(axes.flat)[len(keys) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(f"kvtier bench: {doc['trials_completed']} trials, {(doc.get('model') or {}).get('name', '?')}")
    fig.tight_layout()
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "trials.png")
    tmp = path + ".tmp.png"
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)  # whole or not at all
    return path


def run_trials(cfg: BenchConfig, output: str, is_default: bool, trials: int, vary_seed: bool = False) -> int:
    """Run `trials` trials of `cfg`, write each trial's results and the trials document; return the exit code."""
    if cfg.seed is None:  # one seed for every trial, chosen now and recorded
        cfg = cfg.model_copy(update={"seed": int.from_bytes(os.urandom(4), "little") % 2**31})
    plans = []
    for i in range(1, trials + 1):
        plans.append(
            cfg.model_copy(
                update={
                    "output": trial_path(output, i),
                    "seed": cfg.seed + (i - 1 if vary_seed else 0),
                    "plots": os.path.join(cfg.plots, f"trial{i}") if cfg.plots else None,
                    "html_output": None,  # one page, of the trials document (below)
                    **{key: suffixed(getattr(cfg, key), i) for key, _ in KEYED_OUTPUTS},
                }
            )
        )
    per_trial: list[dict] = []
    docs: list[dict] = []
    code, status = 0, "completed"
    try:
        with stop_signals_raise():  # a signal between two trials stops like one during a trial
            for i, plan in enumerate(plans, 1):
                print(f"{PROG}: trial {i} of {trials} (seed {plan.seed}) -> {plan.output}", file=sys.stderr)
                run = run_clients if plan.num_clients > 1 else run_single
                code = run(plan, plan.output, is_default)
                try:
                    with open(plan.output) as f:
                        doc = json.load(f)
                except (OSError, ValueError):
                    doc = None
                if doc is not None:
                    per_trial.append(
                        {
                            "trial": i,
                            "file": plan.output,
                            "status": doc["status"],
                            "seed": plan.seed,
                            "exit_code": code,
                            "summary": {k: v for k, v in doc["summary"].items() if k != "qos_metrics"},
                        }
                    )
                    docs.append(doc)
                if code != 0:
                    status = "interrupted" if code > 128 else "failed"
                    break
    except Interrupted as exc:
        code, status = exc.exit_code, "interrupted"
    if not docs:
        return bench_fail(f"no trial finished; nothing to aggregate (exit {code})", code or 1)
    doc = trials_document(cfg, per_trial, docs, trials, status)
    try:
        written, moved = write_results(output, doc, is_default=is_default)
    except OSError as exc:
        return bench_fail(f"{exc}; the trials document could not be saved (each trial's file is kept)", 1)
    if moved:
        print(f"{PROG}: {moved}; trials document written to {written} instead", file=sys.stderr)
    terminal_console().print(trials_table(doc))
    missing = []  # outputs asked for and not made: exit 1 once the others are written
    if cfg.plots:
        try:
            plot = write_trials_plot(doc, cfg.plots)
        except OSError as exc:  # the trials document holds every value; the figure can be drawn again from it
            missing.append(f"--plots {cfg.plots}: trials.png not written ({exc.strerror or exc})")
            print(f"{PROG}: {missing[-1]}", file=sys.stderr)
        else:
            if plot:
                print(f"{PROG}: trials figure: {plot}", file=sys.stderr)
    if cfg.html_output:
        from ..outputs.html import write_html

        try:
            write_html(doc, cfg.html_output, written)
        except OSError as exc:  # as the figure: `kvtier report` makes it again from the trials document
            missing.append(f"--html-output {cfg.html_output}: not written ({exc.strerror or exc})")
            print(f"{PROG}: {missing[-1]}", file=sys.stderr)
        else:
            print(f"{PROG}: report: {cfg.html_output}", file=sys.stderr)
    print(f"{PROG}: {doc['trials_completed']} of {trials} trials completed; medians in {written}", file=sys.stderr)
    if code == 0 and missing:
        return bench_fail(f"{'; '.join(missing)}; the trials document is {written}", 1)
    return code
