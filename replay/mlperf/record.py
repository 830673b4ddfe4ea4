"""What a run directory of the MLPerf Storage KV cache harness records, read the same way from either harness.

A run directory holds `option_<O>/trial_<T>/rank_<N>/kvcache_results_*.json` (one file per rank, trial and Option),
the run summary `kvcache_run_summary_<datetime>.json`, and what the harness recorded of the run:
- written by mlpstorage (hazemawadalla/storage rules-pr 2f65ef1, mlpstorage_py/benchmarks/base.py `write_metadata`
  and kvcache.py `metadata`): `kv_cache_<datetime>_metadata.json`, whose `args` are the parsed command line (mode,
  seed, trials, inter_option_delay, config, enable_autoscaling, hosts, num_processes, npernode, cache_dir,
  results_dir) and whose `command_output_files` name each trial's mpirun command line (the Option from the log
  file's name, `kvcache_opt<O>_trial<T>_<datetime>.stdout.log`);
- written by `kvtier mlperf run`: `kvtier_mlperf_run_<datetime>.json` (run.py), the same facts under kvtier's names,
  plus the filesystems of the cache and results directories as found when the run started.

`RunRecord` is that, one shape for both; `rank_files` the ranks' files with the few keys the rules read. Reading
refuses (UserError) a directory that is no run directory, or whose record cannot be read; a rank file that cannot
be read is no refusal but a finding (`RankFile.error`).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from kvconnector.errors import UserError

from ..common.json_files import loads_json, open_regular, refuse_malformed
from .summary import OPTIONS, RESULTS_GLOB, _numbered

MANIFEST_PREFIX = "kvtier_mlperf_run_"
MANIFEST_KIND = "kvtier-mlperf-run"
SUMMARY_PREFIX = "kvcache_run_summary_"
WRAPPER = "mlperf_wrapper.py"
_LOG = re.compile(r"kvcache_opt([1-9])_trial([0-9]+)_")


class RunDirError(UserError):
    """A directory that is not a run directory of either harness, or whose record cannot be read: exit 2."""


@dataclass(frozen=True)
class Command:
    """One trial's mpirun command line, and the flags it gave the wrapper (and through it kv-cache.py)."""

    option: int
    trial: int | None
    line: str
    flags: dict[str, str]  # --flag -> value ("" for a flag without one); the last of a repeated flag


@dataclass(frozen=True)
class RankFile:
    option: int
    trial: int
    rank: int
    path: Path
    doc: dict | None  # None when it could not be read
    error: str = ""

    def config(self) -> dict:
        c = (self.doc or {}).get("config")
        return c if isinstance(c, dict) else {}

    def seed(self):
        """kvtier records config.seed; the reference's kv-cache.py a top-level seed."""
        c = self.config()
        return c.get("seed", (self.doc or {}).get("seed"))

    def storage_entries(self):
        s = (self.doc or {}).get("summary")
        caches = s.get("cache_stats") if isinstance(s, dict) else None
        return caches.get("storage_entries") if isinstance(caches, dict) else None


@dataclass
class RunRecord:
    run_dir: Path
    layout: str  # "mlpstorage" or "kvtier"
    record_path: Path
    mode: str  # closed, open, whatif
    run_datetime: str
    seed: int | None  # as given; None when left to the default (42)
    trials: int | None
    inter_option_delay_s: float | None
    config: str | None
    autoscaling: bool
    hosts: list[str]
    npernode: int | None
    total_ranks: int | None
    cache_dir: str | None
    results_dir: str | None
    commands: list[Command]
    same_filesystem: bool | None = None  # as found at the run's start (kvtier's record), else None
    status: str = "completed"
    summary_paths: list[Path] = field(default_factory=list)
    trial_dirs: dict[int, dict[int, Path]] = field(default_factory=dict)  # option -> trial -> directory

    def summary_path(self) -> Path | None:
        """The run's own summary: the one of its time stamp, else the only one."""
        own = [p for p in self.summary_paths if p.name == f"{SUMMARY_PREFIX}{self.run_datetime}.json"]
        if own:
            return own[0]
        return self.summary_paths[0] if len(self.summary_paths) == 1 else None


def _read(path: Path) -> dict:
    with refuse_malformed(str(path), RunDirError):
        try:
            with open_regular(path) as fh:
                doc = loads_json(fh.read())
        except OSError as exc:
            raise RunDirError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    if not isinstance(doc, dict):
        raise RunDirError(f"{path}: not a JSON object")
    return doc


def wrapper_flags(line: str) -> dict[str, str]:
    """The flags after mlperf_wrapper.py in an mpirun command line, as {--flag: value}."""
    try:
        words = shlex.split(line)
    except ValueError:
        words = line.split()
    at = next((i for i, w in enumerate(words) if w.endswith(WRAPPER)), None)
    out: dict[str, str] = {}
    if at is None:
        return out
    rest = words[at + 1 :]
    i = 0
    while i < len(rest):
        word = rest[i]
        if word.startswith("--"):
            if "=" in word:
                key, value = word.split("=", 1)
                out[key] = value
            elif i + 1 < len(rest) and not rest[i + 1].startswith("--"):
                out[word] = rest[i + 1]
                i += 1
            else:
                out[word] = ""
        i += 1
    return out


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _from_mlpstorage(run_dir: Path, path: Path) -> RunRecord:
    doc = _read(path)
    args = doc.get("args")
    if not isinstance(args, dict):
        raise RunDirError(f"{path}: no args (not mlpstorage's metadata of a kvcache run)")
    commands = []
    for entry in doc.get("command_output_files") or []:
        if not isinstance(entry, dict) or not isinstance(entry.get("command"), str):
            continue
        m = _LOG.search(Path(str(entry.get("stdout", ""))).name)
        if m is None:
            continue
        commands.append(Command(int(m.group(1)), int(m.group(2)), entry["command"], wrapper_flags(entry["command"])))
    hosts = args.get("hosts") or ["localhost"]
    hosts = [str(h) for h in hosts] if isinstance(hosts, list) else [str(hosts)]
    # mlpstorage's rank layout (kvcache.py `_resolve_rank_layout`): --num-processes in all, else npernode per host
    total = _int(args.get("num_processes"))
    if total is None:
        total = (_int(args.get("npernode")) or 1) * len(hosts)
    return RunRecord(
        run_dir=run_dir,
        layout="mlpstorage",
        record_path=path,
        mode=str(args.get("mode") or ""),
        run_datetime=str(doc.get("run_datetime") or ""),
        seed=_int(args.get("seed")),
        trials=_int(args.get("trials")),
        inter_option_delay_s=args.get("inter_option_delay"),
        config=args.get("config"),
        autoscaling=bool(args.get("enable_autoscaling")),
        hosts=hosts,
        npernode=total // len(hosts) if total % len(hosts) == 0 else None,
        total_ranks=total,
        cache_dir=args.get("cache_dir"),
        results_dir=args.get("results_dir"),
        commands=commands,
    )


def _from_kvtier(run_dir: Path, path: Path) -> RunRecord:
    doc = _read(path)
    if doc.get("kind") != MANIFEST_KIND:
        raise RunDirError(f"{path}: not a record of `kvtier mlperf run` (kind {doc.get('kind')!r})")
    commands = [
        Command(c["option"], c.get("trial"), c["command"], wrapper_flags(c["command"]))
        for c in doc.get("commands") or []
        if isinstance(c, dict) and isinstance(c.get("command"), str) and c.get("option") in OPTIONS
    ]
    fs = doc.get("filesystems") or {}
    return RunRecord(
        run_dir=run_dir,
        layout="kvtier",
        record_path=path,
        mode=str(doc.get("mode") or ""),
        run_datetime=str(doc.get("run_datetime") or ""),
        seed=_int(doc.get("seed")),
        trials=_int(doc.get("trials")),
        inter_option_delay_s=doc.get("inter_option_delay_s"),
        config=doc.get("config"),
        autoscaling=bool(doc.get("enable_autoscaling")),
        hosts=[str(h) for h in doc.get("hosts") or ["localhost"]],
        npernode=_int(doc.get("npernode")),
        total_ranks=_int(doc.get("total_ranks")),
        cache_dir=doc.get("cache_dir"),
        results_dir=doc.get("results_dir"),
        commands=commands,
        same_filesystem=fs.get("same") if isinstance(fs.get("same"), bool) else None,
        status=str(doc.get("status") or ""),
    )


def read_run(run_dir: str) -> RunRecord:
    """The record of `run_dir`; RunDirError when it is none of either harness."""
    root = Path(run_dir)
    if not root.is_dir():
        raise RunDirError(f"{run_dir}: not a directory")
    options = {o: p for o, p in _numbered(root, "option").items() if o in OPTIONS}
    manifests = sorted(root.glob(f"{MANIFEST_PREFIX}*.json"))
    metadata = sorted(root.glob("kv_cache_*_metadata.json"))
    if not options and not manifests and not metadata:
        below = sorted({p.parent.parent for p in root.glob("**/option_[123]/trial_*")})[:3]
        hint = f"; run directories below it: {', '.join(map(str, below))}" if below else ""
        raise RunDirError(f"{run_dir}: not a run directory of the kvcache harness (no option_<O>/){hint}")
    records = manifests + metadata
    if len(records) != 1:
        what = "no record of the run" if not records else f"{len(records)} records of runs"
        raise RunDirError(
            f"{run_dir}: {what} (one kv_cache_<time>_metadata.json of mlpstorage or {MANIFEST_PREFIX}<time>.json"
            " of kvtier mlperf run)"
        )
    rec = _from_kvtier(root, records[0]) if manifests else _from_mlpstorage(root, records[0])
    rec.summary_paths = sorted(root.glob(f"{SUMMARY_PREFIX}*.json"))
    rec.trial_dirs = {o: _numbered(p, "trial") for o, p in sorted(options.items())}
    return rec


def rank_files(rec: RunRecord) -> list[RankFile]:
    """Every results file under the run's rank directories (several in one directory: each), read."""
    out = []
    for option, trials in rec.trial_dirs.items():
        for trial, trial_dir in sorted(trials.items()):
            for rank, rank_dir in sorted(_numbered(trial_dir, "rank").items()):
                for path in sorted(rank_dir.glob(RESULTS_GLOB)):
                    try:
                        doc = _read(path)
                        out.append(RankFile(option, trial, rank, path, doc))
                    except RunDirError as exc:
                        out.append(RankFile(option, trial, rank, path, None, str(exc)))
    return out


def read_summary(path: Path) -> dict:
    return _read(path)
