"""What `kvtier report` draws of a run of the MLPerf Storage KV cache harness, as one plain document.

The page itself is a sink (replay/outputs/html/), which knows nothing of this package (tests/test_layers.py); so
the run is read here, once, into a JSON-shaped document the page only draws (its kind `kvtier mlperf run`):
- `summary`: the run summary as the harness wrote it (`kvcache_run_summary_<datetime>.json`), or, where the run has
  none of its own, the aggregation of its rank files computed here (summary.py, mlpstorage's), with
  `summary_computed` true;
- `ranks`: one entry per rank file (Option, trial, rank, its path relative to the run directory) with the figures
  the aggregation reads from it (summary.rank_figures: the same keys, the same 0.0 where a key is absent), or the
  reason it could not be read;
- `findings`: every finding of the rules (rules.py) with its rule ID, Rules.md section and verdict, `failing` the
  rule IDs that make the run fail in its mode (FAIL, and OPEN in a CLOSED run);
- `record`: what the harness recorded of the run (mode, layout, seed, trials, hosts, directories, commands).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from .record import SUMMARY_PREFIX, RunDirError, rank_files, read_run, read_summary
from .rules import RULES, check_run, failed
from .summary import rank_figures, summarize

KIND = "kvtier mlperf run"


def is_run_summary(doc) -> bool:
    """A document shaped as a run summary (either harness's `kvcache_run_summary_<datetime>.json`)."""
    return isinstance(doc, dict) and isinstance(doc.get("options"), dict) and "total_ranks" in doc


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def report_doc(path: str) -> dict:
    """The page's document of the run at `path`: a run directory, or a run summary inside one (that summary is then
    the one shown). RunDirError (one line) when it is neither."""
    given = Path(path)
    summary_path: Path | None = None
    if given.is_dir():
        run_dir = given
    else:
        summary_path = given
        doc = read_summary(given)
        if not is_run_summary(doc):
            raise RunDirError(f"{path}: not a kvcache run summary (no options and total_ranks)")
        run_dir = given.parent
    rec = read_run(str(run_dir))
    if summary_path is None:
        summary_path = rec.summary_path()
    computed = summary_path is None
    if computed:
        summary = summarize(str(run_dir), rec.total_ranks, rec.trials, rec.npernode, len(rec.hosts), rec.run_datetime)
        summary = json.loads(json.dumps(summary))  # the Options' keys as a written summary has them: "1", "2", "3"
    else:
        summary = read_summary(summary_path)
        if not is_run_summary(summary):
            raise RunDirError(f"{summary_path}: not a kvcache run summary (no options and total_ranks)")
    ranks = []
    for f in rank_files(rec):
        entry = {"option": f.option, "trial": f.trial, "rank": f.rank, "path": _rel(f.path, run_dir)}
        try:
            if f.doc is None:
                raise ValueError(f.error.split(": ", 1)[-1])
            entry |= asdict(rank_figures(f.doc)) | {"storage_entries": f.storage_entries()}
        except ValueError as exc:
            entry["error"] = str(exc)
        ranks.append(entry)
    findings = check_run(rec)
    return {
        "kind": KIND,
        "run_dir": str(run_dir),
        "summary_path": None if computed else str(summary_path),
        "summary_computed": computed,
        "other_summaries": [_rel(p, run_dir) for p in rec.summary_paths if p != summary_path],
        "summary": summary,
        "ranks": ranks,
        "findings": [
            {"rule": f.rule, "section": RULES[f.rule], "verdict": f.verdict, "detail": f.detail, "line": f.line()}
            for f in findings
        ],
        "failing": sorted({f.rule for f in failed(findings, rec.mode)}),
        "record": {
            "layout": rec.layout,
            "record_path": _rel(rec.record_path, run_dir),
            "mode": rec.mode,
            "status": rec.status,
            "run_datetime": rec.run_datetime,
            "seed": rec.seed,
            "trials": rec.trials,
            "inter_option_delay_s": rec.inter_option_delay_s,
            "config": rec.config,
            "enable_autoscaling": rec.autoscaling,
            "hosts": rec.hosts,
            "npernode": rec.npernode,
            "total_ranks": rec.total_ranks,
            "cache_dir": rec.cache_dir,
            "results_dir": rec.results_dir,
            "same_filesystem": rec.same_filesystem,
            "commands": [{"option": c.option, "trial": c.trial, "command": c.line} for c in rec.commands],
        },
    }


__all__ = ["KIND", "SUMMARY_PREFIX", "is_run_summary", "report_doc"]
