"""`kvtier merge`, and the one merge of `kvtier bench` results behind it, `--num-clients` and MPI ranks alike.

Several results documents (processes of one host, hosts of one job, trials one after another) become one, the way a
single run of all of them would have reported:
- bytes, operations, requests, tokens, entries and capacities add up; latency percentiles come from the merged
  histograms (`tiers.*.read.histograms`, `request_histograms`, the QoS classes'), never from averaged percentiles;
- the wall-clock window is the union of the sources' windows (`summary.window.start_unix_s` .. `end_unix_s`), and
  every rate is over its length: overlapping runs count their common time once, runs one after another add up
  (windows of several hosts are placed by each host's clock: a clock skew shifts them by as much);
- a block device is counted once per host and window: whole-device counters of runs that overlapped on one device
  (every rank of a host sees all of that host's I/O) are taken from one of them, those of other hosts add up;
- each source's own document is kept under `clients` (without its timeline), named by `source`.

Sources must be runs of the same benchmark: every config key must match except the ones a share of a job or a
trial may change (`PER_SOURCE`, `ADDITIVE`), and the same run may not come twice. A mismatch is a `MergeError`
naming the key; `kvtier merge` turns it into one line and exit 2.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import os
import statistics
import sys
from collections.abc import Sequence

from pydantic import ValidationError

from kvconnector.errors import UserError
from kvconnector.units import GB
from kvconnector.validation import describe_validation_error

from ..common.cli import OneLineParser, command, fail
from ..merging import union_s
from ..outputs.paths import claim_outputs, default_results_path, write_results
from ..outputs.results_file import ResultsFileError, load_results_file
from ..outputs.terminal import console as terminal_console
from .config import AUTO_KEYS, BenchConfig
from .results import document_keys, fallbacks, merge_tier_details, request_histograms, request_stats_of_docs
from .results import summary as run_summary
from .sysinfo import process_figures
from .validation_trace import validate_run

PROG = "kvtier merge"

# Config keys in which a client's, rank's or trial's share differs from the job's: their sum is the job's value
# (io_workers: each process has its own pool; with the reference's request model one per user of its share).
ADDITIVE = (
    "num_users",
    "max_requests",
    "request_rate",
    "cpu_mem_gb",
    "gpu_mem_gb",
    "storage_capacity_gb",
    "io_workers",
)
# Config keys that say where and how a source ran, not what it measured: they may differ between sources.
PER_SOURCE = (
    "seed",
    "cache_dir",
    "output",
    "xlsx_output",
    "csv_output",
    "html_output",
    "io_trace_log",
    "io_op_log",
    "validation_trace",
    "plots",
    "progress",
    "keep_cache",
    "num_clients",
    "precondition",
    "precondition_size_gb",
    "precondition_threads",
    "random_buffer_mb",
    "enable_latency_tracing",
)
# The worst status wins: one failed source makes the merged run failed.
STATUS_ORDER = {"completed": 0, "interrupted": 1, "failed": 2}
ENDED_BY_ORDER = {"duration": 0, "workload": 1, "signal": 2, "failure": 3}


class MergeError(UserError):
    """A user error: files that are not kvtier bench results or cannot be merged. One line, exit status 2."""


# ---- loading and checking ----------------------------------------------------------------------------------------
def load_source(path: str) -> dict:
    """A `kvtier bench` results file with what a merge needs (histograms, tiers, config), or MergeError."""
    try:
        doc = load_results_file(path, no_trials="a --trials document (medians); merge its per-trial files instead")
    except ResultsFileError as exc:
        raise MergeError(str(exc)) from None
    missing = [k for k in ("config", "model", "tiers", "request_histograms") if not isinstance(doc.get(k), dict)]
    if missing:
        raise MergeError(f"{path}: not a mergeable kvtier bench result (no {', '.join(missing)})")
    return doc


def _config_of(doc: dict, name: str) -> BenchConfig:
    try:
        return BenchConfig.model_validate(doc["config"])
    except ValidationError as exc:
        raise MergeError(f"{name}: its config does not load here ({describe_validation_error(exc)})") from None


def leaves(doc: dict) -> list[dict]:
    """The single runs a results document holds: itself, or, merged, its sources' runs (sections under `clients`)."""
    if doc.get("clients"):
        return [leaf for c in doc["clients"] for leaf in leaves(c)]
    return [doc]


def _run_id(doc: dict) -> tuple:
    """What tells one run from another: host, run directory and start."""
    env = doc.get("environment") or {}
    window = (doc.get("summary") or {}).get("window") or {}
    return (env.get("hostname"), env.get("cache_dir"), doc.get("started_at"), window.get("start_unix_s"))


def check_mergeable(docs: Sequence[dict], names: Sequence[str]) -> None:
    """Raise MergeError naming the first config key (or the model) that makes merging `docs` meaningless, or the
    first run that comes twice (its bytes would count twice)."""
    # Each config as this kvtier reads it: a key an older file lacks compares as its default.
    # Each as it ran (BenchConfig.as_run): an older file's None where the value follows from its config compares
    # as that value, and a key it left to its host (AUTO_KEYS) is not known, so not compared.
    configs = [_config_of(d, n).as_run().model_dump(mode="json") for d, n in zip(docs, names)]
    base = configs[0]
    for doc, name, cfg in zip(docs[1:], names[1:], configs[1:]):
        for key in sorted(set(base) | set(cfg)):
            if key in ADDITIVE or key in PER_SOURCE:
                continue
            if key in AUTO_KEYS and None in (cfg.get(key), base.get(key)):
                continue
            if cfg.get(key) != base.get(key):
                raise MergeError(
                    f"{name}: config key {key} is {_short(cfg.get(key))} where {names[0]} has "
                    f"{_short(base.get(key))}; runs that differ in {key} cannot be merged"
                )
        if doc["model"].get("bytes_per_token") != docs[0]["model"].get("bytes_per_token"):
            raise MergeError(
                f"{name}: {doc['model'].get('bytes_per_token')} bytes per token where {names[0]} has "
                f"{docs[0]['model'].get('bytes_per_token')} (a different model catalog); cannot be merged"
            )
    seen: dict[tuple, str] = {}
    for doc, name in zip(docs, names):
        for rid in {_run_id(leaf) for leaf in leaves(doc)}:
            if rid in seen:
                raise MergeError(
                    f"{name} and {seen[rid]} hold the same run ({rid[1]}, started {rid[2]}): "
                    "its bytes would count twice"
                )
            seen[rid] = name


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def merged_config(docs: Sequence[dict]) -> BenchConfig:
    """The config of the job the sources were shares of: additive keys summed, per-source keys kept where the
    sources agree (else unset: the sources' own configs stay in `clients`)."""
    configs = [_config_of(d, f"source {i + 1}").as_run().model_dump(mode="json") for i, d in enumerate(docs)]
    data = dict(configs[0])
    for key in PER_SOURCE:
        values = [c.get(key) for c in configs]
        if any(v != values[0] for v in values):
            data[key] = BenchConfig.model_fields[key].get_default(call_default_factory=True)
    if data.get("cache_dir") is None:
        dirs = {os.path.dirname(c["cache_dir"].rstrip(os.sep)) for c in configs if c.get("cache_dir")}
        data["cache_dir"] = dirs.pop() if len(dirs) == 1 else None
    sums = {}
    for key in ADDITIVE:
        values = [c.get(key) for c in configs]
        if all(v is not None for v in values):
            sums[key] = sum(values)
        elif key in AUTO_KEYS:  # an older file left it to its host: the job's value is not known
            sums[key] = None
    # The sums are set after validation: a job may exceed what one process accepts (over 100,000 users in all).
    return BenchConfig.model_validate(data).model_copy(update=sums)


# ---- the wall-clock window -------------------------------------------------------------------------------------------
def _unix_s(iso: str | None) -> float | None:
    try:
        return dt.datetime.fromisoformat(iso).timestamp() if iso else None
    except ValueError:
        return None


def _intervals(docs: Sequence[dict]) -> tuple[list[tuple[float, float]], bool]:
    """Each source's window as (start, end) in Unix seconds, and whether all came from the precise window times
    (older files have only `started_at`, to the second; a source with neither starts with the first)."""
    out, precise = [], True
    for d in docs:
        s = d["summary"]
        start = (s.get("window") or {}).get("start_unix_s")
        if start is None:
            precise = False
            start = _unix_s(d.get("started_at"))
        out.append((start, s["elapsed_time"]))
    known = [s for s, _ in out if s is not None]
    first = min(known) if known else 0.0
    return [((s if s is not None else first), (s if s is not None else first) + e) for s, e in out], precise


def _merged_window(docs: Sequence[dict], runs: Sequence[dict], intervals: Sequence[tuple[float, float]]) -> dict:
    """The merged `summary.window`, with the keys a single run's has: counts add up, delays are the worst source's,
    the ends are the first start and the last end of the single runs (as they wrote them, else their intervals)."""
    windows = [d["summary"].get("window") or {} for d in docs]
    keys = list(dict.fromkeys([*(k for w in windows for k in w), "start_unix_s", "end_unix_s"]))
    out: dict = {}
    for k in keys:
        values = [w[k] for w in windows if w.get(k) is not None]
        if k in ("users_requested", "users_started"):
            out[k] = sum(values)
        elif k == "ended_by":
            out[k] = max(values, key=lambda v: ENDED_BY_ORDER.get(v, 9)) if values else None
        elif k == "reason":
            out[k] = "; ".join(dict.fromkeys(values))
        elif k in ("start_unix_s", "end_unix_s"):
            own = [(r["summary"].get("window") or {}).get(k) for r in runs]
            ends = [s for s, _ in intervals] if k == "start_unix_s" else [e for _, e in intervals]
            pick = min if k == "start_unix_s" else max
            out[k] = round(pick(o if o is not None else iv for o, iv in zip(own, ends)), 3)
        elif k == "duration_s":
            out[k] = max(values) if values else None
        elif k == "request_queue":  # each source's own queue: the deepest, and the rest added up
            out[k] = {q: (max if q == "max_depth" else sum)(v.get(q, 0) for v in values) for q in values[0]}
        elif values and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            out[k] = max(values)  # delays and overruns: the worst source's
        else:
            out[k] = values[0] if values else None
    return out


# ---- block device ----------------------------------------------------------------------------------------------------
def _merged_block_device(docs: Sequence[dict], intervals: Sequence[tuple[float, float]], wall_s: float) -> dict | None:
    """Whole-device counters, once per host, device and overlapping windows (the longest window of a group stands
    for it: each saw the others' I/O), summed over the rest."""
    groups: dict[tuple, list[tuple[tuple[float, float], dict]]] = {}
    for d, iv in zip(docs, intervals):
        blk = d.get("block_device")
        if blk:
            host = (d.get("environment") or {}).get("hostname")
            groups.setdefault((host, blk.get("device")), []).append((iv, blk))
    if not groups:
        return None
    total = {"reads": 0, "read_bytes": 0, "writes": 0, "written_bytes": 0, "busy_ms": 0}
    counted = 0
    for members in groups.values():
        members.sort(key=lambda m: m[0])
        cluster: list = []
        end = None
        for iv, blk in [*members, ((float("inf"), float("inf")), None)]:
            if cluster and iv[0] > end:  # the previous cluster is complete: count its longest window
                _, best = max(cluster, key=lambda m: m[0][1] - m[0][0])
                for k in total:
                    total[k] += best.get(k, 0)
                counted += 1
                cluster, end = [], None
            if blk is not None:
                cluster.append((iv, blk))
                end = iv[1] if end is None else max(end, iv[1])
    hosts = {h for h, _ in groups}
    devices = sorted({f"{h}:{dev}" if len(hosts) > 1 else str(dev) for h, dev in groups})
    return {
        "device": ", ".join(devices),
        **total,
        "read_gbps": round(total["read_bytes"] / GB / wall_s, 4) if wall_s else 0.0,
        "write_gbps": round(total["written_bytes"] / GB / wall_s, 4) if wall_s else 0.0,
        "note": f"whole-device counters of {len(docs)} sources, each device and overlapping window counted once "
        f"({counted} measurements added): other processes' I/O is included",
    }


# ---- the timeline ----------------------------------------------------------------------------------------------------
def _merged_timeline(docs: Sequence[dict], intervals: Sequence[tuple[float, float]]) -> list[dict]:
    """The sources' cumulative samples on one clock (seconds since the first window started): at each sample time
    every source's latest sample, summed. Samples of different sources closer than half a sample interval are one."""
    t0 = min(s for s, _ in intervals)
    rows = sorted(
        (round(iv[0] - t0 + r["t_s"], 3), i, r)
        for i, (d, iv) in enumerate(zip(docs, intervals))
        for r in d.get("timeline") or []
        if "t_s" in r
    )
    if not rows:
        return []
    gaps = [b["t_s"] - a["t_s"] for d in docs for a, b in zip(d.get("timeline") or [], (d.get("timeline") or [])[1:])]
    merge_within = statistics.median(gaps) / 2 if gaps else 0.0
    latest: list[dict | None] = [None] * len(docs)
    out: list[dict] = []
    for n, (t, i, r) in enumerate(rows):
        latest[i] = r
        if n + 1 < len(rows) and rows[n + 1][0] - t < merge_within:
            continue  # the next sample is close: one merged sample at the later time holds both
        agg: dict = {"t_s": t, "requests": 0, "read_bytes": 0, "written_bytes": 0, "users": 0, "tiers": {}}
        for s in latest:
            if s is None:
                continue
            for k in ("requests", "read_bytes", "written_bytes", "users"):
                agg[k] += s.get(k, 0)
            for name, tier in (s.get("tiers") or {}).items():
                a = agg["tiers"].setdefault(name, {"entries": 0, "used_bytes": 0})
                a["entries"] += tier["entries"]
                a["used_bytes"] += tier["used_bytes"]
        out.append(agg)
    return out


def _merged_process(docs: Sequence[dict]) -> dict | None:
    """Each source's own process counters, summed (every source is a process of its own), and the CPU per GiB of
    the sum; None when no source has them (files written before they existed)."""
    procs = [d["process"] for d in docs if d.get("process")]
    if not procs:
        return None
    keys = ("cpu_user_s", "cpu_system_s", "read_bytes", "written_bytes")
    return process_figures(*(sum(p.get(k) or 0 for p in procs) for k in keys))


# ---- the merge -------------------------------------------------------------------------------------------------------
def merge_results(
    docs: Sequence[dict],
    names: Sequence[str],
    cfg: BenchConfig | None = None,
    *,
    block_device: dict | None = None,
    extra: Sequence[dict] | None = None,
) -> dict:
    """One results document from several. `cfg` is the job's config when the caller made the shares (`--num-clients`,
    MPI); otherwise it is derived from the sources (`merged_config`, after `check_mergeable`). `block_device`
    replaces the per-source device counters when the caller measured the device itself; `extra[i]` adds keys to
    source i's section (e.g. its client index or rank). Either way the config is recorded as it ran (no key left to
    the run as None: BenchConfig.as_run)."""
    if cfg is None:
        check_mergeable(docs, names)
        cfg = merged_config(docs)
    else:  # the job's keys left to the run are what its shares ran with (--gpu-mem-gb: the sum of theirs)
        ran = merged_config(docs)
        cfg = cfg.as_run(**{k: getattr(ran, k) for k in AUTO_KEYS})
    # Windows and device counters are the single runs' (a merged source's own window is already a union).
    runs = [leaf for d in docs for leaf in leaves(d)]
    intervals, precise = _intervals(runs)
    wall_s = union_s(intervals)
    tiers = merge_tier_details([d["tiers"] for d in docs])
    events: dict = {}
    for d in docs:
        for k, v in (d.get("store_events") or {}).items():
            events[k] = events.get(k, 0) + v
    req = request_stats_of_docs(docs)
    status = max((d["status"] for d in docs), key=lambda s: STATUS_ORDER.get(s, 2))
    # Share of all I/O workers' time spent in storage operations, each source weighted by the time it ran.
    ran_s = sum(d["summary"]["elapsed_time"] for d in docs)
    busy_s = sum(d["summary"].get("io_saturation", 0.0) * d["summary"]["elapsed_time"] for d in docs)
    summary = run_summary(
        req,
        cfg,
        status=status,
        elapsed_s=wall_s,
        tiers=tiers,
        events=events,
        bytes_per_token=docs[0]["model"]["bytes_per_token"],
        io_saturation=round(busy_s / ran_s, 4) if ran_s else 0.0,
        window=_merged_window(docs, runs, intervals),
        autoscaling=[d.get("autoscaling_stats") or [] for d in docs],
        num_clients=sum(d["summary"].get("num_clients", 1) for d in docs),
    )
    first = docs[0]
    notes = list(dict.fromkeys(n for d in docs for n in d.get("notes") or []))
    span = max(e for _, e in intervals) - min(s for s, _ in intervals)
    notes.append(
        f"merged from {len(docs)} sources ({', '.join(names)}): window = union of theirs, {wall_s:.2f} s "
        f"(first start to last end {span:.2f} s)" + ("" if precise else "; some placed by started_at, to the second")
    )
    versions = sorted({d.get("kvtier_version", "unknown") for d in docs})
    if len(versions) > 1:
        notes.append(f"sources written by kvtier {', '.join(versions)}")
    truncated: dict = {}
    for d in docs:
        for k, v in ((d.get("workload") or {}).get("truncated_requests") or {}).items():
            truncated[k] = truncated.get(k, 0) + v
    env = dict(first.get("environment") or {})
    hosts = list(dict.fromkeys((d.get("environment") or {}).get("hostname") for d in docs))
    if len(hosts) > 1:
        env["hostname"] = ", ".join(str(h) for h in hosts)
    if env.get("cache_dir"):
        env["cache_dir"] = cfg.cache_dir or os.path.dirname(env["cache_dir"].rstrip(os.sep))
    sections = []
    for i, (d, name) in enumerate(zip(docs, names)):
        section = {"client": i, "source": name, **(extra[i] if extra else {})}
        section.update((k, v) for k, v in d.items() if k != "timeline" and k not in section)
        sections.append(section)
    return {
        "kvtier_version": first.get("kvtier_version", "unknown"),
        "started_at": min(d["started_at"] for d in docs),
        "status": status,
        "error": "; ".join(f"{n}: {d['error']}" for d, n in zip(docs, names) if d.get("error")) or None,
        "notes": notes,
        # how the sources read their flags (the same for all: request_model and size_unit are config keys that must
        # agree); files written before these keys existed have none
        **{k: first[k] for k in ("request_model", "size_unit", "trace_only") if k in first},
        "model": first["model"],
        "workload": dict(first.get("workload") or {}, truncated_requests=truncated),
        "config": cfg.model_dump(mode="json"),
        "environment": env,
        "setup": {name: d.get("setup", {}) for d, name in zip(docs, names)},
        "summary": summary,
        **document_keys(summary),
        "tiers": tiers,
        "store_events": events,
        "block_device": block_device if block_device is not None else _merged_block_device(runs, intervals, wall_s),
        "process": _merged_process(runs),
        "fallbacks": fallbacks(tiers),
        "request_histograms": request_histograms(req),
        "autoscaling_stats": [dict(s, client=i) for i, d in enumerate(docs) for s in d.get("autoscaling_stats") or []],
        "timeline": _merged_timeline(docs, _intervals(docs)[0]),
        "clients": sections,
        # --validation-trace: the merged run's hit rate against the trace the sources were checked against
        **(
            {"validation": validate_run(first["validation"]["trace_stats"], summary)}
            if isinstance(first.get("validation"), dict)
            else {}
        ),
    }


def sources_table(doc: dict):
    """One row per source of a merged document: who ran what, when, and what it measured (the summary tables are
    the merged run's). Host names are shown when the sources ran on more than one."""
    from rich import box
    from rich.table import Table

    sources = doc.get("clients") or []
    starts = [(c["summary"].get("window") or {}).get("start_unix_s") for c in sources]
    t0 = min((s for s in starts if s is not None), default=0.0)
    hosts = {(c.get("environment") or {}).get("hostname") for c in sources}
    t = Table(
        title=f"{len(sources)} sources (start: s after the first window began; run: its window, s)",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    for col in ("source", "status", "users", "req", "read GB", "write GB", "start", "run"):
        t.add_column(col, justify="left" if col in ("source", "status") else "right", no_wrap=col != "source")
    for c, start in zip(sources, starts):
        tiers = c.get("tiers") or {}
        s, disk = c["summary"], tiers.get("disk") or tiers.get("s3") or {}
        name = os.path.basename(str(c.get("source", c.get("client"))))
        if len(hosts) > 1:
            name += f" @{(c.get('environment') or {}).get('hostname', '?')}"
        t.add_row(
            name,
            c.get("status", ""),
            str((c.get("config") or {}).get("num_users", "")),
            f"{s.get('total_requests', 0):,}",
            f"{(disk.get('read') or {}).get('bytes', 0) / GB:.2f}",
            f"{(disk.get('write') or {}).get('bytes', 0) / GB:.2f}",
            "-" if start is None else f"{start - t0:.2f}",
            f"{s['elapsed_time']:.2f}",
        )
    return t


def print_sources(doc: dict) -> None:
    if doc.get("clients"):
        terminal_console().print(sources_table(doc))


# ---- kvtier merge ----------------------------------------------------------------------------------------------------
EXAMPLES = """\
examples:
  kvtier merge host-a.json host-b.json -o all.json         # two hosts of one job
  kvtier merge results/trial-*.json -o pooled.json          # trials one after another
  kvtier merge a.json b.json --labels a,b --csv-output all.csv --plots plots/

What adds up: bytes, operations, requests, tokens, entries and capacities. Latency percentiles come from the
sources' merged histograms, never from their percentiles. Rates are over the union of the sources' wall-clock
windows (overlapping time counted once). A block device is counted once per host and overlapping window. Each
source's own results stay under `clients`, named by its file (or --labels).

Refused, one line each: a file that is not a kvtier bench result, runs whose config differs in a key that changes
what is measured (the line names the key; users, request rate, capacities, seeds and paths may differ), the same
run given twice, and an output that exists (--force replaces it) or is one of the inputs.

exit status: 0 merged (whatever the sources' status: it is in the merged results); 2 bad arguments or files
(nothing written); 1 the results could not be written; 130/143 on SIGINT/SIGTERM.
"""

EXTRA_OUTPUTS = (
    ("csv_output", "--csv-output", "csv_out", "write_csv"),
    ("xlsx_output", "--xlsx-output", "xlsx", "write_xlsx"),
    ("plots", "--plots", "plots", "write_plots"),
)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog=PROG,
        description="Merge `kvtier bench` results of several processes, hosts or trials into one results file.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("results", nargs="+", metavar="RESULT.json", help="results of `kvtier bench` (merged ones too)")
    p.add_argument("-o", "--output", help="merged results JSON (default results/<timestamp>.json)")
    p.add_argument("--force", action="store_true", help="replace --output if it exists")
    p.add_argument("--labels", help="comma-separated source names, one per file (default: the file paths)")
    p.add_argument("--csv-output", help="also write a flat CSV of the merged metrics")
    p.add_argument("--xlsx-output", help="also write an Excel workbook")
    p.add_argument("--plots", help="directory for PNG figures of the merged run")
    return p


@command("merge")
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # A refusal (MergeError, ConfigError) raises: replay/cli.py says it in one line, exit 2, nothing written.
    output = args.output or default_results_path()
    if len({os.path.realpath(p) for p in args.results}) < len(args.results):
        raise MergeError("a file is given twice: its run would count twice")
    claim = claim_outputs(
        # a default name is taken with an exclusive link when written (a same-second run gets the next)
        {"--output": args.output, "--csv-output": args.csv_output, "--xlsx-output": args.xlsx_output},
        {"--plots": args.plots},
        inputs={p: p for p in args.results},
        replace=args.force,
        exists_hint="pass --force to replace it",
    )
    with claim:
        if args.labels is not None:
            names = [s.strip() for s in args.labels.split(",")]
            if len(names) != len(args.results) or len(set(names)) < len(names) or not all(names):
                raise MergeError(f"--labels needs {len(args.results)} distinct names, got {args.labels!r}")
        else:
            names = list(args.results)
        doc = merge_results([load_source(p) for p in args.results], names)
        return write_merged(doc, output, args, is_default=args.output is None)


def write_merged(doc: dict, output: str, args, is_default: bool) -> int:
    from .view import print_summary

    try:
        output, moved = write_results(output, doc, is_default=is_default)
    except OSError as exc:
        return fail(PROG, f"{exc}; nothing written", 1)
    if moved:
        print(f"{PROG}: {moved}; merged results written to {output} instead", file=sys.stderr)
    written = []
    for key, flag, module, func in EXTRA_OUTPUTS:
        path = getattr(args, key)
        if not path:
            continue
        write = getattr(importlib.import_module(f"..outputs.{module}", __package__), func)
        try:
            out = write(doc, path)
        except OSError as exc:
            print(f"{PROG}: {flag} {path}: not written ({exc.strerror or exc})", file=sys.stderr)
            continue
        written.extend(out if isinstance(out, list) else [path])
    print_sources(doc)
    print_summary(doc, output, written)
    for c in doc["clients"]:
        if c["status"] != "completed":
            print(
                f"{PROG}: note: {c['source']} {c['status']}" + (f" ({c['error']})" if c.get("error") else ""),
                file=sys.stderr,
            )
    return 0


if __name__ == "__main__":  # as `kvtier ...`: logging and signals set up by the dispatcher (replay/cli.py)
    from replay.cli import main as kvtier

    sys.exit(kvtier(["merge", *sys.argv[1:]]))
