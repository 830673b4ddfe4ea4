"""`kvtier check RESULTS.json...`: the MLPerf KV Cache spec's submission checklist (its section 6) over results files.

The spec: "MLPerf Storage v3.0 KV Cache Benchmark: Technical Specification and Implementation Guide" (Hazem
Awadallah, Kingston Digital, January 2026), whose reference implementation is kv_cache_benchmark/ of the
hazemawadalla/storage fork of mlcommons/storage.

Input: `kvtier bench` results, one file per trial (the spec's `mlperf_stress_8b_trial{1..5}.json`), and/or trials
documents of `kvtier bench --trials N`. Runs with the same configuration (everything but seed and output paths) form
one configuration; its trials are the completed runs. One line per checklist item, PASS or FAIL with what was found,
then each configuration's medians of the figures the spec reports for its cpu_mem setting (computed here from the
per-trial values; percentiles are each trial's own, from its histograms). Exit 0 when every item passes, 1 when one
fails, 2 when a file cannot be read or is not a `kvtier bench` result.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

from rich.table import Table

from kvconnector.errors import UserError

from ..common.cli import OneLineParser, command
from ..outputs.results_file import ResultsFileError, load_results_file
from ..outputs.terminal import console as terminal_console

PROG = "kvtier check"

EXAMPLES = """\
examples:
  kvtier check mlperf_stress_8b_trial*.json mlperf_stress_70b_trial*.json
  kvtier bench --trials 5 --seed 42 --duration 300 --gpu-mem-gb 0 --cpu-mem-gb 0 --generation-mode none \\
      --model llama3.1-8b --num-users 200 --output stress_8b.json && kvtier check stress_8b.json

exit status: 0 every item passes; 1 an item fails; 2 a file cannot be read or is not a kvtier bench result.

kvtier check RUN_DIR: a run directory of the MLPerf harness (mlpstorage's or `kvtier mlperf run`'s) against the
kvcache rules of Rules.md section 6, one line per finding naming the rule's ID (PASS, FAIL, SKIP, OPEN: acceptable
in OPEN only); exit 0 every rule holds, 1 a rule fails, 2 not a run directory.
"""

# The spec's metrics per cpu_mem setting (section 6, "Correct metrics for cpu_mem setting"), as summary keys.
DEVICE_P95 = ("cache_stats.nvme_read_device_p95_ms", "cache_stats.nvme_write_device_p95_ms")
METRICS = {
    0.0: ("cache_stats.decode_bytes_read_gb", "avg_throughput_tokens_per_sec", *DEVICE_P95),
    4.0: ("storage_throughput_tokens_per_sec", *DEVICE_P95),
}
MODELS = ("llama3.1-8b", "llama3.1-70b-instruct")
# Config keys that do not make two runs different configurations.
_PER_RUN = {
    "seed",
    "output",
    "xlsx_output",
    "csv_output",
    "html_output",
    "plots",
    "io_trace_log",
    "io_op_log",
    "progress",
    "cache_dir",
}


class BadInput(UserError):
    """A file that is not a kvtier bench result: one line, exit status 2."""


def _get(summary: dict, dotted: str):
    v = summary
    for part in dotted.split("."):
        if not isinstance(v, dict) or part not in v:
            return None
        v = v[part]
    return v


def load_runs(paths: list[str]) -> list[dict]:
    """Every run in the files, as {file, config, status, summary, environment, model}; a trials document gives one
    run per trial (its per-trial summaries)."""
    runs = []
    seen: set[str] = set()  # a trial given twice (its own file and a trials document naming it) counts once

    def add(identity: str, run: dict) -> None:
        if os.path.realpath(identity) not in seen:
            seen.add(os.path.realpath(identity))
            runs.append(run)

    for path in paths:
        try:
            doc = load_results_file(path)
        except ResultsFileError as exc:
            raise BadInput(str(exc)) from None
        if not isinstance(doc.get("config"), dict):
            raise BadInput(f"{path}: not a kvtier bench result (no config)")
        model = (doc.get("model") or {}).get("name") or doc["config"].get("model")
        if doc.get("kind") == "kvtier-bench-trials":
            for t in doc.get("per_trial") or []:
                add(
                    t.get("file") or f"{path}#{t['trial']}",
                    {
                        "file": f"{path} trial {t['trial']}",
                        "config": doc["config"] | {"seed": t["seed"]},
                        "status": t["status"],
                        "summary": t["summary"],
                        "environment": doc.get("environment") or {},
                        "model": model,
                    },
                )
        elif isinstance((doc.get("summary") or {}).get("cache_stats"), dict):  # a replay result has no cache_stats
            add(
                path,
                {
                    "file": path,
                    "config": doc["config"],
                    "status": doc.get("status"),
                    "summary": doc["summary"],
                    "environment": doc.get("environment") or {},
                    "model": model,
                },
            )
        else:
            raise BadInput(f"{path}: not a kvtier bench result (no summary.cache_stats)")
    return runs


def configurations(runs: list[dict]) -> dict[str, list[dict]]:
    """Runs grouped by configuration, named by what a submission names: model, cpu_mem, users, duration."""
    groups: dict[str, list[dict]] = {}
    names: dict[str, str] = {}  # configuration (as JSON) -> its name
    for r in runs:
        c = r["config"]
        key = json.dumps({k: v for k, v in c.items() if k not in _PER_RUN}, sort_keys=True, default=str)
        if key not in names:
            head = f"{r['model']} cpu_mem={c.get('cpu_mem_gb'):g}{c.get('size_unit', 'GB')} users={c.get('num_users')}"
            head += f" duration={c.get('duration'):g}s"
            same = sum(1 for v in names.values() if v.split(" #")[0] == head)  # other settings: numbered
            names[key] = f"{head} #{same + 1}" if same else head
        groups.setdefault(names[key], []).append(r)
    return groups


def _line(ok: bool, item: str, detail: str) -> tuple[bool, str]:
    return ok, f"{'PASS' if ok else 'FAIL'}  {item}: {detail}"


def check(runs: list[dict]) -> tuple[list[tuple[bool, str]], dict[str, dict[str, dict]]]:
    """The checklist's lines (ok, text) and, per configuration, the medians of its metrics."""
    groups = configurations(runs)
    lines = []

    def every(item: str, bad: list[str], good: str) -> None:
        lines.append(_line(not bad, item, good if not bad else "; ".join(bad)))

    every(
        "runs completed",
        [f"{r['file']} {r['status']}" for r in runs if r["status"] != "completed"],
        f"{len(runs)} runs, all completed",
    )
    every(
        "--seed 42 used",
        [f"{r['file']} seed {r['config'].get('seed')}" for r in runs if r["config"].get("seed") != 42],
        "every run",
    )
    every(
        "--gpu-mem-gb 0 (storage isolation)",
        [f"{r['file']} gpu_mem_gb {r['config'].get('gpu_mem_gb')}" for r in runs if r["config"].get("gpu_mem_gb") != 0],
        "every run",
    )
    every(
        "--generation-mode none (pure storage)",
        [
            f"{r['file']} {r['config'].get('generation_mode')}"
            for r in runs
            if r["config"].get("generation_mode") != "none"
        ],
        "every run",
    )
    every(
        "the reference's semantics (its request model, sizes in GiB, device I/O)",
        [
            f"{r['file']} {problem}"
            for r in runs
            for problem in (
                f"--request-model {r['config'].get('request_model')}"
                if r["config"].get("request_model") != "reference"
                else None,
                # files written before size_unit existed read their sizes in GB
                f"sizes in {r['config'].get('size_unit', 'GB')}"
                if r["config"].get("size_unit", "GB") != "GiB"
                else None,
                "trace-only (--io-trace-log): no device I/O" if r["config"].get("io_trace_log") else None,
            )
            if problem
        ],
        "every run",
    )
    every(
        "--duration >= 300 s",
        [f"{r['file']} {r['config'].get('duration'):g} s" for r in runs if (r["config"].get("duration") or 0) < 300],
        "every run",
    )
    done = {name: [r for r in rs if r["status"] == "completed"] for name, rs in groups.items()}
    every(
        "3-5 trials per configuration",
        [f"{name}: {len(rs)} completed" for name, rs in done.items() if not 3 <= len(rs) <= 5],
        ", ".join(f"{name}: {len(rs)}" for name, rs in done.items()),
    )
    medians: dict[str, dict[str, dict]] = {}
    wrong_metrics = []
    for name, rs in done.items():
        cpu = float(rs[0]["config"].get("cpu_mem_gb", -1)) if rs else -1.0
        keys = METRICS.get(cpu)
        if keys is None:
            wrong_metrics.append(f"{name}: cpu_mem {cpu:g} is neither 0 nor 4")
            continue
        medians[name] = {}
        for key in keys:
            values = [_get(r["summary"], key) for r in rs]
            missing = [r["file"] for r, v in zip(rs, values) if not isinstance(v, (int, float)) or v <= 0]
            if missing:
                wrong_metrics.append(f"{name}: {key} missing or 0 in {', '.join(missing)}")
                continue
            medians[name][key] = {"median": statistics.median(values), "values": values}
    every(
        "correct metrics for the cpu_mem setting",
        wrong_metrics,
        "cpu_mem=0: decode_bytes_read_gb, avg_throughput_tokens_per_sec, device p95; "
        "cpu_mem=4: storage_throughput_tokens_per_sec, device p95",
    )
    every(
        "median values reported",
        [f"{name}: no completed trial" for name, rs in done.items() if not rs],
        "medians of each configuration's per-trial values, below",
    )
    models = {r["model"] for r in runs}
    every("both 8B and 70B results included", [f"no {m} run" for m in MODELS if m not in models], ", ".join(MODELS))
    sys_bad = []
    for r in runs:
        env = r["environment"]
        drive = env.get("drive") or {}
        lacks = [k for k, v in (("CPU", env.get("cpu_model")), ("RAM", env.get("memory_bytes"))) if not v]
        lacks += [f"drive {k}" for k in ("model", "firmware") if not drive.get(k)]
        if lacks:
            sys_bad.append(f"{r['file']}: no {', '.join(lacks)}" + (f" ({drive['note']})" if drive.get("note") else ""))
    first = runs[0]["environment"] if runs else {}
    drive = first.get("drive") or {}
    every(
        "system info documented (CPU, RAM, drive model and firmware)",
        sys_bad,
        f"{first.get('cpu_model')}, {(first.get('memory_bytes') or 0) / 2**30:.0f} GiB, "
        f"{drive.get('model')} firmware {drive.get('firmware')}",
    )
    return lines, medians


def medians_tables(medians: dict[str, dict[str, dict]]) -> list[Table]:
    """One table per configuration: each figure's median and its per-trial values."""
    tables = []
    for name, figures in medians.items():
        t = Table(title=f"{name}: medians across trials")
        t.add_column("figure (summary.)", no_wrap=True)  # whole: it is what to look up in the JSON
        t.add_column("median", justify="right", no_wrap=True)
        t.add_column("per trial")
        for key, m in figures.items():
            t.add_row(key, f"{m['median']:,.4g}", "  ".join(f"{v:,.4g}" for v in m["values"]))
        tables.append(t)
    return tables


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog=PROG,
        description="Check kvtier bench results against the MLPerf KV Cache spec's submission checklist "
        "(seed 42, GPU tier off, generation none, >= 300 s, 3-5 trials, medians, the metrics for the cpu_mem "
        "setting, 8B and 70B, system info with the drive's model and firmware).",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "results", nargs="+", help="kvtier bench results files or --trials documents; or one harness RUN_DIR"
    )
    return p


@command("check")
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    runs = load_runs(args.results)  # BadInput: replay/cli.py says it in one line, exit 2
    lines, medians = check(runs)
    for _, text in lines:
        print(text)
    for table in medians_tables(medians):
        terminal_console().print(table)
    failed = sum(not ok for ok, _ in lines)
    print(f"{PROG}: {len(lines) - failed} of {len(lines)} items pass", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":  # as `kvtier ...`: logging and signals set up by the dispatcher (replay/cli.py)
    from replay.cli import main as kvtier

    sys.exit(kvtier(["check", *sys.argv[1:]]))
