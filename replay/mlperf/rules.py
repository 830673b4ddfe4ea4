"""The kvcache rules of Rules.md section 6 that a validator can check from a run directory's files, by rule ID.

Rules.md (hazemawadalla/storage rules-pr 2f65ef1) names each rule with an ID; its section 6.3 says the kvcache
submission checker is a stub (mlpstorage_py/submission_checker/checks/kvcache_checks.py at that commit registers no
check), so "the submission validator must" is what this module does. Each rule gives findings: PASS, FAIL, SKIP
(not applicable to this mode or not checkable from these files, with why) and OPEN (acceptable in an OPEN run only:
a failure of a CLOSED run, a warning of an OPEN one). What each check reads:

- kvcacheFixedWorkloadPerOption (6.3.1.1, CLOSED): all three Options ran; each trial's command and each rank's
  recorded config carry Table KVCache-1's model, num-users, duration, gpu/cpu-mem-gb, max-concurrent-allocs and
  generation-mode for its Option.
- kvcacheClosedSequenceLocks (6.3.2.1, CLOSED): seed 42 (the run's, the wrapper's --seed-base, every rank's seed
  being 42 + its rank), 3 trials (recorded, and the trial directories of every Option), the inter-option delay, no
  --config. The delay followed is mlpstorage's code, 20 s (`_execute_run` refuses any other; Rules.md 6.6.1 says 20 s
  too), not the 90 s of 6.3.2.1's text.
- kvcacheAutoscalingProhibited (6.3.2.2, CLOSED): --enable-autoscaling neither given nor recorded by a rank.
- kvcacheClientDefinition (6.3.3.1): total ranks = npernode x hosts; every Option's every trial has rank_0 ...
  rank_<n-1>, each with one readable results file, and no rank beyond.
- kvcacheScaleUpModel (6.3.3.2): every rank ran the Option's full per-client num-users and max-concurrent-allocs
  (as its trial's command gave them), whatever the rank count.
- kvcachePerClientIsolation (6.3.3.3): no two ranks of a trial share a cache directory (each `<cache>/rank_<N>`) or
  a results file, and each rank's results went to its own rank_<N>/.
- kvcacheSharedResultsDir (6.3.3.4, several hosts): every rank's file is visible here (the run's directory).
- kvcacheAggregateBandwidth, kvcacheAggregateThroughput, kvcacheAggregateDeviceLatency (6.3.4.1-3): the run
  summary's figures equal the aggregation of the rank files (summary.py, mlpstorage's aggregation); the device p95s
  where the summary has them (mlpstorage's does not: their values are then shown, computed here).
- kvcacheLatencyValidity (6.3.4.4): no Option whose ranks are all CPU-tier (`storage_entries == 0`): FAIL in
  CLOSED, OPEN otherwise.
- kvcacheHeadlineResult (6.3.4.5): the summary holds, per Option (all three in CLOSED), the four headline figures
  and total_ranks = npernode x hosts, with no partial failure.
- kvcachePosixCacheDir (6.4.1): --cache-dir and --results-dir both set, on different filesystems (as recorded by
  kvtier's harness when the run started; else compared here when both paths exist): FAIL in CLOSED, OPEN otherwise.
- kvcacheClosedImmutable (6.6.1, CLOSED): the wrapper got nothing but the Option's flags, the seed base, the rank
  bases and the wrapper's own config.yaml.
- kvcacheOpenInvocationNote (6.6.3, OPEN): the exact invocation of every trial is recorded.

Not checkable from the files, and not listed: 6.4.2 (the POSIX I/O model is the benchmark's code), 6.5.1 and 6.5.2
(what backs --cache-dir: kvtier's harness records an object-storage gateway under it, replay/common/object_gateway.py),
6.6.2 (allowances: nothing to fail).
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from .options import OPTIONS as TABLE
from .record import MANIFEST_PREFIX, RankFile, RunDirError, RunRecord, rank_files, read_summary
from .summary import OPTIONS, summarize

CLOSED_SEED = 42
CLOSED_TRIALS = 3
CLOSED_DELAY_S = 20  # mlpstorage's code (and Rules.md 6.6.1); Rules.md 6.3.2.1 says 90

RULES = {
    "kvcacheFixedWorkloadPerOption": "6.3.1.1",
    "kvcacheClosedSequenceLocks": "6.3.2.1",
    "kvcacheAutoscalingProhibited": "6.3.2.2",
    "kvcacheClientDefinition": "6.3.3.1",
    "kvcacheScaleUpModel": "6.3.3.2",
    "kvcachePerClientIsolation": "6.3.3.3",
    "kvcacheSharedResultsDir": "6.3.3.4",
    "kvcacheAggregateBandwidth": "6.3.4.1",
    "kvcacheAggregateThroughput": "6.3.4.2",
    "kvcacheAggregateDeviceLatency": "6.3.4.3",
    "kvcacheLatencyValidity": "6.3.4.4",
    "kvcacheHeadlineResult": "6.3.4.5",
    "kvcachePosixCacheDir": "6.4.1",
    "kvcacheClosedImmutable": "6.6.1",
    "kvcacheOpenInvocationNote": "6.6.3",
}

# The Option parameters as the harness's flags, and as kvtier bench records them in a rank file's config.
PARAMS = {
    "--model": "model",
    "--num-users": "num_users",
    "--duration": "duration",
    "--gpu-mem-gb": "gpu_mem_gb",
    "--cpu-mem-gb": "cpu_mem_gb",
    "--max-concurrent-allocs": "max_concurrent_allocs",
    "--generation-mode": "generation_mode",
}
# What a CLOSED wrapper command may hold beyond the Option's flags (mlpstorage's `_execute_run`).
# (kvtier's harness passes the wrapper's delays too, at the reference wrapper's 90 s in CLOSED.)
WRAPPER_OWN = {"--rank-output-base", "--rank-cache-base", "--seed-base", "--config", "--start-delay", "--end-delay"}
WRAPPER_DELAY_S = 90


@dataclass(frozen=True)
class Finding:
    rule: str
    verdict: str  # PASS, FAIL, OPEN, SKIP
    detail: str

    def line(self) -> str:
        return f"{self.verdict:<4}  {self.rule} ({RULES[self.rule]}): {self.detail}"


def failed(findings: list[Finding], mode: str) -> list[Finding]:
    """The findings that make the run fail: FAIL, and OPEN in a CLOSED run."""
    return [f for f in findings if f.verdict == "FAIL" or (f.verdict == "OPEN" and mode == "closed")]


def _same(a, b) -> bool:
    """Two recorded values equal: numbers as numbers (16 == "16" == 16.0), anything else as text."""
    try:
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)
    except (TypeError, ValueError):
        return str(a) == str(b)


class Checker:
    def __init__(self, rec: RunRecord):
        self.rec = rec
        self.closed = rec.mode == "closed"
        self.files = rank_files(rec)
        self.findings: list[Finding] = []

    def add(self, rule: str, bad: list[str], good: str, verdict: str = "FAIL") -> None:
        """One FAIL (or `verdict`) line per thing wrong, else one PASS line."""
        if bad:
            self.findings.extend(Finding(rule, verdict, b) for b in bad)
        else:
            self.findings.append(Finding(rule, "PASS", good))

    def skip(self, rule: str, why: str) -> None:
        self.findings.append(Finding(rule, "SKIP", why))

    def rel(self, path: Path) -> str:
        try:
            return str(path.relative_to(self.rec.run_dir))
        except ValueError:
            return str(path)

    # --- the rules -----------------------------------------------------------------------------------------

    def fixed_workload(self) -> None:
        rule = "kvcacheFixedWorkloadPerOption"
        if not self.closed:
            return self.skip(rule, f"{self.rec.mode}: the Options' parameters may be superseded")
        bad = [f"option_{o}/: absent (CLOSED runs Options 1, 2 and 3)" for o in OPTIONS if o not in self.rec.trial_dirs]
        for c in self.rec.commands:
            want = dict(zip(TABLE[c.option].flags()[::2], TABLE[c.option].flags()[1::2]))
            for flag, value in want.items():
                if flag not in c.flags or not _same(c.flags[flag], value):
                    got = c.flags.get(flag, "not given")
                    bad.append(f"Option {c.option} trial {c.trial}: {flag} {got}, must be {value}")
        for f in self.files:
            cfg = f.config()
            want = dict(zip(TABLE[f.option].flags()[::2], TABLE[f.option].flags()[1::2]))
            for flag, key in PARAMS.items():
                if key in cfg and not _same(cfg[key], want[flag]):
                    bad.append(f"{self.rel(f.path)}: {key} {cfg[key]}, must be {want[flag]} (Option {f.option})")
        self.add(rule, bad, "every trial and rank ran Table KVCache-1's parameters of its Option")

    def sequence_locks(self) -> None:
        rule = "kvcacheClosedSequenceLocks"
        if not self.closed:
            return self.skip(rule, f"{self.rec.mode}: seed, trials, delay and --config may be changed")
        rec, bad = self.rec, []
        if rec.seed not in (None, CLOSED_SEED):
            bad.append(f"--seed {rec.seed}, must be {CLOSED_SEED}")
        for c in rec.commands:
            if "--seed-base" in c.flags and not _same(c.flags["--seed-base"], CLOSED_SEED):
                bad.append(f"Option {c.option} trial {c.trial}: --seed-base {c.flags['--seed-base']}, must be 42")
        for f in self.files:
            seed = f.seed()
            if seed is not None and not _same(seed, CLOSED_SEED + f.rank):
                bad.append(f"{self.rel(f.path)}: seed {seed}, must be {CLOSED_SEED + f.rank} (42 + rank {f.rank})")
        if rec.trials not in (None, CLOSED_TRIALS):
            bad.append(f"--trials {rec.trials}, must be {CLOSED_TRIALS}")
        for o, trials in rec.trial_dirs.items():
            if sorted(trials) != list(range(CLOSED_TRIALS)):
                bad.append(f"option_{o}/: {len(trials)} trials ({', '.join(map(str, sorted(trials)))}), must be 3")
        delay = rec.inter_option_delay_s
        if delay is not None and not _same(delay, CLOSED_DELAY_S):
            bad.append(f"--inter-option-delay {delay}, must be {CLOSED_DELAY_S} (mlpstorage's lock)")
        if rec.config:
            bad.append(f"--config {rec.config}: not permitted in CLOSED")
        self.add(rule, bad, f"seed 42, {CLOSED_TRIALS} trials, inter-option delay {CLOSED_DELAY_S} s, no --config")

    def autoscaling(self) -> None:
        rule = "kvcacheAutoscalingProhibited"
        if not self.closed:
            return self.skip(rule, f"{self.rec.mode}: autoscaling allowed")
        bad = ["--enable-autoscaling given"] if self.rec.autoscaling else []
        bad += [
            f"Option {c.option} trial {c.trial}: --enable-autoscaling"
            for c in self.rec.commands
            if "--enable-autoscaling" in c.flags
        ]
        bad += [f"{self.rel(f.path)}: enable_autoscaling" for f in self.files if f.config().get("enable_autoscaling")]
        self.add(rule, bad, "no autoscaling")

    def expected_ranks(self) -> int | None:
        return self.rec.total_ranks

    def client_definition(self) -> None:
        rule, rec, bad = "kvcacheClientDefinition", self.rec, []
        n = self.expected_ranks()
        if rec.npernode is not None and n is not None and rec.npernode * len(rec.hosts) != n:
            bad.append(f"{n} ranks in all, but npernode {rec.npernode} x {len(rec.hosts)} hosts")
        seen = defaultdict(list)
        for f in self.files:
            seen[(f.option, f.trial, f.rank)].append(f)
            if f.doc is None:
                bad.append(f"{self.rel(f.path)}: unreadable ({f.error.split(': ', 1)[-1]})")
        if n is None:
            n = 1 + max((r for (_, _, r) in seen), default=-1)
        for o, trials in rec.trial_dirs.items():
            for t, trial_dir in sorted(trials.items()):
                for r in range(n):
                    files = seen.get((o, t, r), [])
                    if not files:
                        bad.append(f"{self.rel(trial_dir)}/rank_{r}: no results file ({n} ranks ran)")
                    elif len(files) > 1:
                        bad.append(f"{self.rel(trial_dir)}/rank_{r}: {len(files)} results files (two runs mixed)")
                extra = sorted({r for (o2, t2, r) in seen if (o2, t2) == (o, t) and r >= n})
                bad += [f"{self.rel(trial_dir)}/rank_{r}: beyond the run's {n} ranks" for r in extra]
        self.add(rule, bad, f"{n} ranks ({rec.npernode} per host x {len(rec.hosts)} hosts), each with one results file")

    def scale_up(self) -> None:
        rule, bad = "kvcacheScaleUpModel", []
        given = {(c.option, c.trial): c.flags for c in self.rec.commands}
        for f in self.files:
            flags = given.get((f.option, f.trial)) or given.get((f.option, None))
            cfg = f.config()
            if not flags or not cfg:
                continue
            for flag in ("--num-users", "--max-concurrent-allocs"):
                key = PARAMS[flag]
                if flag in flags and key in cfg and not _same(cfg[key], flags[flag]):
                    bad.append(f"{self.rel(f.path)}: {key} {cfg[key]}, the Option gives each client {flags[flag]}")
        self.add(rule, bad, "every rank ran the Option's full per-client users and concurrency")

    def isolation(self) -> None:
        rule, bad = "kvcachePerClientIsolation", []
        caches = defaultdict(list)
        outputs = defaultdict(list)
        for f in self.files:
            outputs[os.path.realpath(f.path)].append(f)
            cache = f.config().get("cache_dir")
            if cache:
                caches[(f.option, f.trial, os.path.normpath(str(cache)))].append(f)
                if Path(str(cache)).name != f"rank_{f.rank}":
                    bad.append(f"{self.rel(f.path)}: cache directory {cache}, not <cache-dir>/rank_{f.rank}")
            out = f.config().get("output")
            if out and Path(str(out)).parent.name != f"rank_{f.rank}":
                bad.append(f"{self.rel(f.path)}: written as {out}, outside its rank_{f.rank}/")
        for (o, t, cache), fs in caches.items():
            if len(fs) > 1:
                bad.append(f"Option {o} trial {t}: ranks {', '.join(str(f.rank) for f in fs)} share cache {cache}")
        for path, fs in outputs.items():
            if len(fs) > 1:
                bad.append(f"{path}: the results file of {len(fs)} ranks")
        self.add(rule, bad, "every rank its own results file and cache directory")

    def shared_results_dir(self) -> None:
        rule = "kvcacheSharedResultsDir"
        local = {"localhost", "127.0.0.1", "::1", os.uname().nodename}
        hosts = {h.split(":")[0] for h in self.rec.hosts}
        if len(hosts) <= 1 or hosts <= local:
            return self.skip(rule, "one host")
        have = {(f.option, f.trial, f.rank) for f in self.files}
        n = self.expected_ranks() or 0
        bad = [
            f"option_{o}/trial_{t}/rank_{r}: not visible here (is --results-dir shared by every host?)"
            for o, trials in self.rec.trial_dirs.items()
            for t in trials
            for r in range(n)
            if (o, t, r) not in have
        ]
        self.add(rule, bad, f"every rank's file of {len(hosts)} hosts is here")

    def aggregates(self) -> None:
        rules = ("kvcacheAggregateBandwidth", "kvcacheAggregateThroughput", "kvcacheAggregateDeviceLatency")
        summary, why = self.summary()
        if summary is None:
            for rule in rules:
                (self.skip if self.rec.mode == "whatif" else lambda r, w: self.add(r, [w], ""))(rule, why)
            return
        trials = self.rec.trials if self.rec.trials is not None else summary.get("trials_per_option")
        ours = summarize(str(self.rec.run_dir), self.expected_ranks(), trials, run_datetime="-")["options"]
        theirs = summary.get("options") if isinstance(summary.get("options"), dict) else {}
        keys = {
            rules[0]: ("aggregated_read_bandwidth_gbps", "aggregated_write_bandwidth_gbps"),
            rules[1]: ("aggregated_storage_throughput_tokens_per_sec", "aggregated_avg_throughput_tokens_per_sec"),
            rules[2]: ("aggregated_p95_latency_ms", "aggregated_device_read_p95_ms", "aggregated_device_write_p95_ms"),
        }
        for rule, names in keys.items():
            bad, shown = [], []
            for o, mine in ours.items():
                entry = theirs.get(str(o), theirs.get(o))
                if not isinstance(entry, dict):
                    bad.append(f"Option {o}: not in the summary")
                    continue
                for k in names:
                    if k not in entry and k.startswith("aggregated_device_"):
                        shown.append(f"Option {o} {k} {mine[k]} (computed here; not in the summary)")
                    elif k not in entry or not _agrees(entry[k], mine[k]):
                        bad.append(f"Option {o}: {k} {entry.get(k, 'absent')}, the rank files give {mine[k]}")
            good = "the summary's figures are the rank files' aggregation"
            self.add(rule, bad, good + "".join(f"; {s}" for s in shown))

    def summary(self) -> tuple[dict | None, str]:
        path = self.rec.summary_path()
        if path is None:
            n = len(self.rec.summary_paths)
            return None, ("no kvcache_run_summary_<time>.json" if not n else f"{n} run summaries, none of this run's")
        try:
            return read_summary(path), ""
        except RunDirError as exc:  # a bad summary is a finding, not a refusal of the whole check
            return None, str(exc)

    def latency_validity(self) -> None:
        rule, bad = "kvcacheLatencyValidity", []
        by_option = defaultdict(list)
        for f in self.files:
            by_option[f.option].append(f.storage_entries())
        for o, entries in sorted(by_option.items()):
            if entries and all(e == 0 for e in entries):
                bad.append(f"Option {o}: every rank CPU-tier (storage_entries 0): no storage read was measured")
        self.add(rule, bad, "every Option measured storage reads", "FAIL" if self.closed else "OPEN")

    def headline(self) -> None:
        rule = "kvcacheHeadlineResult"
        summary, why = self.summary()
        if summary is None:
            return self.skip(rule, why) if self.rec.mode == "whatif" else self.add(rule, [why], "")
        bad = []
        options = summary.get("options") if isinstance(summary.get("options"), dict) else {}
        want = OPTIONS if self.closed else sorted(self.rec.trial_dirs)
        for o in want:
            entry = options.get(str(o), options.get(o))
            if not isinstance(entry, dict):
                bad.append(f"Option {o}: no headline in the summary")
                continue
            for k in ("aggregated_read_bandwidth_gbps", "aggregated_storage_throughput_tokens_per_sec"):
                if not isinstance(entry.get(k), (int, float)):
                    bad.append(f"Option {o}: no {k}")
            if entry.get("partial_failure"):
                bad.append(f"Option {o}: partial failure ({len(entry.get('missing_files') or [])} rank files missing)")
        total, npn, hosts = summary.get("total_ranks"), summary.get("npernode"), summary.get("host_count")
        if not all(isinstance(v, int) for v in (total, npn, hosts)) or total != npn * hosts:
            bad.append(f"total_ranks {total}, npernode {npn} x host_count {hosts}")
        elif self.rec.total_ranks is not None and total != self.rec.total_ranks:
            bad.append(f"total_ranks {total}, but {self.rec.total_ranks} ranks ran")
        self.add(rule, bad, f"read GB/s, device p95s and storage tokens/s of {len(want)} Options at {total} ranks")

    def cache_dir(self) -> None:
        rule, rec = "kvcachePosixCacheDir", self.rec
        verdict = "FAIL" if self.closed else "OPEN"
        if not rec.cache_dir or not rec.results_dir:
            return self.add(rule, ["--cache-dir and --results-dir must both be set"], "", verdict)
        same = rec.same_filesystem
        if same is None:
            cache, results = Path(rec.cache_dir), Path(rec.results_dir)
            if not (cache.exists() and results.exists()):
                return self.skip(rule, f"{cache} or {results} not here: their filesystems cannot be compared")
            same = os.stat(cache).st_dev == os.stat(results).st_dev
        bad = [f"cache {rec.cache_dir} and results {rec.results_dir} on one filesystem"] if same else []
        self.add(rule, bad, "cache and results on different filesystems", verdict)

    def immutable(self) -> None:
        rule = "kvcacheClosedImmutable"
        if not self.closed:
            return self.skip(rule, f"{self.rec.mode}: the workload may be modified")
        bad = []
        for c in self.rec.commands:
            extra = sorted(set(c.flags) - set(PARAMS) - WRAPPER_OWN)
            if extra:
                bad.append(f"Option {c.option} trial {c.trial}: {' '.join(extra)} set")
            for flag in ("--start-delay", "--end-delay"):
                if flag in c.flags and not _same(c.flags[flag], WRAPPER_DELAY_S):
                    bad.append(f"Option {c.option} trial {c.trial}: {flag} {c.flags[flag]}, must be {WRAPPER_DELAY_S}")
            cfg = c.flags.get("--config")
            if cfg and Path(cfg).name != "config.yaml":
                bad.append(f"Option {c.option} trial {c.trial}: --config {cfg}, not the wrapper's own config.yaml")
        if not self.rec.commands:
            bad.append(f"{self.rel(self.rec.record_path)}: no trial's command recorded")
        self.add(rule, bad, "only the Options' parameters reached the ranks")

    def invocation(self) -> None:
        rule = "kvcacheOpenInvocationNote"
        if self.closed:
            return self.skip(rule, "closed: the invocation is fixed")
        have = {(c.option, c.trial) for c in self.rec.commands}
        bad = [
            f"Option {o} trial {t}: its command is not recorded"
            for o, trials in self.rec.trial_dirs.items()
            for t in trials
            if (o, t) not in have
        ]
        self.add(rule, bad, "every trial's exact command is recorded")

    def run(self) -> list[Finding]:
        for step in (
            self.fixed_workload,
            self.sequence_locks,
            self.autoscaling,
            self.client_definition,
            self.scale_up,
            self.isolation,
            self.shared_results_dir,
            self.aggregates,
            self.latency_validity,
            self.headline,
            self.cache_dir,
            self.immutable,
            self.invocation,
        ):
            step()
        return self.findings


def _agrees(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return isinstance(a, (int, float)) and not isinstance(a, bool) and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def check_run(rec: RunRecord) -> list[Finding]:
    """Every finding of the rules over the run `rec` (record.read_run), in Rules.md's order."""
    return Checker(rec).run()


__all__ = ["MANIFEST_PREFIX", "RULES", "Finding", "RankFile", "check_run", "failed"]
