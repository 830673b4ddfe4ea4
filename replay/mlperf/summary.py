"""The MLPerf Storage KV cache harness's aggregation of rank files into `kvcache_run_summary_<datetime>.json`.

A run directory holds `option_<O>/trial_<T>/rank_<N>/kvcache_results_<time>.json`, one file per rank, trial and
Option (the layout of mlpstorage's wrapper; kvtier's shim writes the same). Per Option, as mlpstorage aggregates
(mlpstorage_py/benchmarks/kvcache.py at 2f65ef1, `_aggregate_option_results` and `_write_run_summary`; Rules.md
6.3.4):
- within a trial, each rank's `summary.cache_stats.tier_storage_read_bandwidth_gbps` (and `_write_`),
  `summary.avg_throughput_tokens_per_sec` and `summary.storage_throughput_tokens_per_sec` are summed over the
  ranks; the Option's figure is the mean of the trials' sums (`aggregated_read_bandwidth_gbps`, ...);
- `aggregated_p95_latency_ms` is the maximum over ranks and trials of `summary.storage_io_latency_ms.p95` (a
  trial without a rank file counts 0.0; no trial at all gives null). That key is what mlpstorage's code scores;
  Rules.md 6.3.4.3 names the device p95s instead, which kvtier adds as `aggregated_device_read_p95_ms` and
  `aggregated_device_write_p95_ms` (the maximum of `summary.cache_stats.storage_read_device_p95_ms` /
  `storage_write_device_p95_ms` over ranks and trials);
- a key a rank file lacks counts 0.0 (a CPU-tier rank has no storage figures); a rank with
  `cache_stats.storage_entries == 0` is listed (its file) in `cpu_tier_ranks` (6.3.4.4);
- a rank directory without a results file is listed in `missing_files`, a file that cannot be read as a results
  file is listed itself; either makes `partial_failure` true, for the Option and for the run.

Where kvtier's reading differs, only for files mlpstorage cannot read either: a file one of whose figures is not a
number (or whose `summary` is not an object) is treated as unreadable as a whole (mlpstorage may have counted the
figures read before the bad one, or stopped on a TypeError); a rank directory holding several results files (two
runs in one directory) gives its first by name, and is listed in the extra `several_results_files` (mlpstorage
takes whichever the directory lists first).
"""

from __future__ import annotations

import datetime as dt
import os
import re
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean

from kvconnector.errors import UserError

from ..common.json_files import loads_json, open_regular, write_json

SCHEMA_VERSION = "1.0"
RESULTS_GLOB = "kvcache_results_*.json"
OPTIONS = (1, 2, 3)

# Keys kvtier's summary has beyond mlpstorage's, per Option (the rest are mlpstorage's, with its meaning).
EXTRA_OPTION_KEYS = ("aggregated_device_read_p95_ms", "aggregated_device_write_p95_ms", "several_results_files")


@dataclass(frozen=True)
class RankFigures:
    """The figures of one rank file the aggregation reads (0.0 where the file has no such key)."""

    read_gbps: float
    write_gbps: float
    avg_tokens_per_s: float
    storage_tokens_per_s: float
    io_p95_ms: float
    device_read_p95_ms: float
    device_write_p95_ms: float
    cpu_tier: bool


def _number(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where}: not a number ({value!r})")
    return value


def rank_figures(doc) -> RankFigures:
    """The figures of one parsed rank file; ValueError when it is no results file (not an object, a figure that is
    not a number)."""
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    summary = doc.get("summary", {})
    if not isinstance(summary, dict):
        raise ValueError("summary: not an object")
    caches = summary.get("cache_stats", {})
    io = summary.get("storage_io_latency_ms", {})
    if not isinstance(caches, dict) or not isinstance(io, dict):
        raise ValueError("summary.cache_stats or summary.storage_io_latency_ms: not an object")

    def num(block: dict, key: str, where: str) -> float:
        return _number(block.get(key, 0.0), f"{where}.{key}")

    return RankFigures(
        read_gbps=num(caches, "tier_storage_read_bandwidth_gbps", "summary.cache_stats"),
        write_gbps=num(caches, "tier_storage_write_bandwidth_gbps", "summary.cache_stats"),
        avg_tokens_per_s=num(summary, "avg_throughput_tokens_per_sec", "summary"),
        storage_tokens_per_s=num(summary, "storage_throughput_tokens_per_sec", "summary"),
        io_p95_ms=num(io, "p95", "summary.storage_io_latency_ms"),
        device_read_p95_ms=num(caches, "storage_read_device_p95_ms", "summary.cache_stats"),
        device_write_p95_ms=num(caches, "storage_write_device_p95_ms", "summary.cache_stats"),
        cpu_tier=caches.get("storage_entries") == 0,
    )


def read_rank_file(path: Path) -> RankFigures:
    with open_regular(path) as fh:
        return rank_figures(loads_json(fh.read()))


def aggregate_option(option: int, trial_dirs: list[str], rank_count: int) -> dict:
    """One Option's entry of the run summary, from its trial directories (each holding rank_0 ... rank_<n-1>)."""
    read, write, avg_tps, storage_tps, p95, dev_read, dev_write = ([] for _ in range(7))
    missing: list[str] = []
    cpu_tier: list[str] = []
    several: list[str] = []
    for trial_dir in trial_dirs:
        ranks: list[RankFigures] = []
        for rank in range(rank_count):
            rank_dir = Path(trial_dir) / f"rank_{rank}"
            found = sorted(rank_dir.glob(RESULTS_GLOB))
            if not found:
                missing.append(str(rank_dir))
                continue
            if len(found) > 1:
                several.append(str(rank_dir))
            try:
                figures = read_rank_file(found[0])
            except (OSError, ValueError, UnicodeDecodeError, UserError):
                missing.append(str(found[0]))
                continue
            if figures.cpu_tier:
                cpu_tier.append(str(found[0]))
            ranks.append(figures)
        read.append(sum(r.read_gbps for r in ranks))
        write.append(sum(r.write_gbps for r in ranks))
        avg_tps.append(sum(r.avg_tokens_per_s for r in ranks))
        storage_tps.append(sum(r.storage_tokens_per_s for r in ranks))
        p95.append(max((r.io_p95_ms for r in ranks), default=0.0))
        dev_read.append(max((r.device_read_p95_ms for r in ranks), default=0.0))
        dev_write.append(max((r.device_write_p95_ms for r in ranks), default=0.0))
    return {
        "option": option,
        "aggregated_read_bandwidth_gbps": fmean(read) if read else 0.0,
        "aggregated_write_bandwidth_gbps": fmean(write) if write else 0.0,
        "aggregated_avg_throughput_tokens_per_sec": fmean(avg_tps) if avg_tps else 0.0,
        "aggregated_storage_throughput_tokens_per_sec": fmean(storage_tps) if storage_tps else 0.0,
        "aggregated_p95_latency_ms": max(p95) if p95 else None,
        "rank_count": rank_count,
        "trial_count": len(trial_dirs),
        "partial_failure": bool(missing),
        "missing_files": missing,
        "cpu_tier_ranks": cpu_tier,
        "aggregated_device_read_p95_ms": max(dev_read) if dev_read else None,
        "aggregated_device_write_p95_ms": max(dev_write) if dev_write else None,
        "several_results_files": several,
    }


def run_summary(
    option_results: dict[int, dict], run_datetime: str, npernode: int, host_count: int, total_ranks: int, trials: int
) -> dict:
    """The run summary document (mlpstorage's `_write_run_summary` fields), of the Options' entries."""
    return {
        "schema_version": SCHEMA_VERSION,
        "run_datetime": run_datetime,
        "npernode": npernode,
        "host_count": host_count,
        "total_ranks": total_ranks,
        "trials_per_option": trials,
        "options": option_results,
        "partial_failure": any(r.get("partial_failure", False) for r in option_results.values()),
    }


@dataclass(frozen=True)
class RunLayout:
    """What a run directory holds: its Options, each one's trial directories, and the rank count."""

    trial_dirs: dict[int, list[str]]
    rank_count: int
    trials: int


def _numbered(parent: Path, prefix: str) -> dict[int, Path]:
    pattern = re.compile(rf"{prefix}_(0|[1-9][0-9]*)")
    return {
        int(m.group(1)): p
        for p in parent.iterdir()
        if (m := pattern.fullmatch(p.name)) and p.is_dir() and not p.is_symlink()
    }


def discover(run_dir: str, ranks: int | None = None, trials: int | None = None) -> RunLayout:
    """The layout of `run_dir` (`option_<O>/trial_<T>/rank_<N>/`). `trials`/`ranks` are what the run was asked
    for: every Option is given trial_0 ... trial_<trials-1> and rank_0 ... rank_<ranks-1>, and what is absent is
    missing, as mlpstorage, which knows them, counts it. Left out, they are read from the tree: the most trials of
    any Option, one more than the highest rank seen (so a rank absent from every trial of every Option goes
    unnoticed: give --ranks). Refuses (UserError) a directory without any option_<O>/ of the three Options."""
    root = Path(run_dir)
    if not root.is_dir():
        raise UserError(f"{run_dir}: not a directory")
    options = {o: p for o, p in _numbered(root, "option").items() if o in OPTIONS}
    if not options:
        raise UserError(f"{run_dir}: no option_1/, option_2/ or option_3/ (not a kvcache run directory)")
    found_trials = {o: _numbered(p, "trial") for o, p in options.items()}
    if trials is None:
        trials = max((max(t) + 1 for t in found_trials.values() if t), default=0)
    if ranks is None:
        seen = [r for ts in found_trials.values() for t in ts.values() for r in _numbered(t, "rank")]
        ranks = max(seen) + 1 if seen else 0
    trial_dirs = {o: [str(options[o] / f"trial_{t}") for t in range(trials)] for o in sorted(options)}
    return RunLayout(trial_dirs, ranks, trials)


def run_datetime_now() -> str:
    """mlpstorage's form of a run's time stamp (YYYYmmdd_HHMMSS)."""
    return dt.datetime.now().strftime("%Y%m%d_%H%M%S")


def summarize(
    run_dir: str,
    ranks: int | None = None,
    trials: int | None = None,
    npernode: int | None = None,
    host_count: int = 1,
    run_datetime: str | None = None,
) -> dict:
    """The run summary of `run_dir` (see `discover` for `ranks` and `trials`); npernode defaults to the ranks over
    the hosts."""
    layout = discover(run_dir, ranks, trials)
    results = {o: aggregate_option(o, dirs, layout.rank_count) for o, dirs in layout.trial_dirs.items()}
    if npernode is None:
        npernode = layout.rank_count // host_count if host_count else layout.rank_count
    return run_summary(
        results, run_datetime or run_datetime_now(), npernode, host_count, layout.rank_count, layout.trials
    )


def write_summary(run_dir: str, summary: dict, output: str | None = None) -> Path:
    """Write `summary` to `output`, default `<run_dir>/kvcache_run_summary_<run_datetime>.json`, whole or not at
    all and never over an existing file (two runs in one directory keep both summaries)."""
    path = Path(output) if output else Path(run_dir) / f"kvcache_run_summary_{summary['run_datetime']}.json"
    exists = UserError(f"{path}: exists (a summary is never written over)")
    if os.path.lexists(path):
        raise exists
    try:
        write_json(path, summary, exclusive=True)
    except FileExistsError as exc:  # the name taken meanwhile, or a file where a directory of the path should be
        raise (exists if os.path.lexists(path) else UserError(f"{path}: cannot write ({exc.strerror})")) from exc
    except OSError as exc:
        raise UserError(f"{path}: cannot write ({exc.strerror or exc})") from exc
    return path
