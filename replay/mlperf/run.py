"""`kvtier mlperf run --mode closed|open|whatif`: the MLPerf Storage KV cache harness of kvtier, for users without
mlpstorage. It does what `mlpstorage <mode> kvcache run` does (hazemawadalla/storage rules-pr 2f65ef1,
mlpstorage_py/benchmarks/kvcache.py `_execute_run`; Rules.md section 6.3), with the same files:

- the three Options of Table KVCache-1 in order, each `trials` times, with the inter-option delay between them;
- each trial one `mpirun -n <ranks> ... python <shim>/mlperf_wrapper.py --rank-output-base <trial dir>
  --rank-cache-base <cache-dir> --seed-base <seed> ...` (the shim of `kvtier mlperf shim`, written into the run
  directory), so every rank runs `kvtier bench` with seed + rank into `option_<O>/trial_<T>/rank_<N>/` and
  `<cache-dir>/rank_<N>/`, as under mlpstorage;
- the run summary `kvcache_run_summary_<datetime>.json` by summary.py (mlpstorage's aggregation), and the record
  `kvtier_mlperf_run_<datetime>.json` of what ran (record.py reads it, `kvtier check` checks it).

Refused before anything runs (one line naming the rule, exit 2): in CLOSED any override of what Rules.md locks
(6.3.1.1 the Options' parameters, 6.3.2.1 seed 42 / 3 trials / the delay / no --config, 6.3.2.2 autoscaling, 6.6.1
anything else), a rank layout that does not add up (6.3.3.1), a cache directory on the results directory's
filesystem (6.4.1; a warning in OPEN and whatif), a results directory not shared by every host (6.3.3.4, probed
as mlpstorage does), and in whatif a cache directory without room for the Options' KV cache (mlpstorage's
capacity gate and its estimate, `required_bytes_for_capacity_gate`).

The inter-option delay of CLOSED is mlpstorage's code's, 20 s (Rules.md 6.6.1 says 20 s as well; 6.3.2.1 says 90 s).
Unlike mlpstorage, an OPEN flag supersedes an Option's value only when it is given: no argparse default does.

Each run gets a directory of its own, `<results-dir>/<mode>/kv_cache/run/<datetime>[_<n>]/`, made exclusively, so
two runs into one results directory never mix their files. SIGINT or SIGTERM stops the trial under way (mpirun
passes it to the ranks, whose kvtier bench writes its partial results aside), runs no more trials, writes the
summary of the trials that completed, marked partial (`stopped_by`), and leaves no process behind (the mpirun job's
process group is killed after mpirun exits); exit 128 + the signal.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from kvconnector.errors import ConfigError, UserError

from ..common.cli import exit_code, signal_name, stop_signals_handled
from ..common.json_files import write_json
from ..common.object_gateway import gateway_of
from .options import OPTIONS
from .record import MANIFEST_KIND, MANIFEST_PREFIX, wrapper_flags
from .rules import CLOSED_DELAY_S, CLOSED_SEED, CLOSED_TRIALS, WRAPPER_DELAY_S
from .shim import write_shim
from .summary import aggregate_option, run_summary, write_summary

log = logging.getLogger(__name__)

# mlpstorage's estimate of a user's KV cache (kvcache.py `_MODEL_CACHE_ESTIMATES`): per-token bytes x sequence.
CAPACITY_ESTIMATES = {
    "tiny-1b": (768, 2048),
    "mistral-7b": (4096, 4096),
    "llama2-7b": (8192, 4096),
    "llama3.1-8b": (4096, 8192),
    "llama3.1-70b-instruct": (16384, 8192),
}
CAPACITY_DEFAULT = (4096, 4096)
LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1"}


class RuleRefusal(UserError):
    """What a rule of Rules.md section 6 forbids, said as `ruleId: what`, before anything runs: exit 2."""

    def __init__(self, rule: str, what: str):
        super().__init__(f"{rule}: {what}")
        self.rule = rule


@dataclass
class Plan:
    """One run, as decided from the command line before anything runs."""

    mode: str
    results_dir: Path
    cache_dir: Path
    options: list[int]
    trials: int
    seed: int
    inter_option_delay_s: float
    start_delay_s: float
    end_delay_s: float
    config: str | None
    option_flags: dict[int, list[str]]
    global_flags: list[str]
    hosts: list[str]
    npernode: int
    total_ranks: int
    mpirun: str
    mpi_params: list[str]
    same_filesystem: bool
    cache_gateway: dict | None = None  # the object-storage gateway holding --cache-dir (Rules.md 6.5.2), if any
    argv: list[str] = field(default_factory=list)


# Per Option parameter: (flag, the attribute of the parsed arguments, the Option's field).
PARAM_FLAGS = (
    ("--model", "model", "model"),
    ("--num-users", "num_users", "num_users"),
    ("--duration", "duration", "duration_s"),
    ("--gpu-mem-gb", "gpu_mem_gb", "gpu_mem_gb"),
    ("--cpu-mem-gb", "cpu_mem_gb", "cpu_mem_gb"),
    ("--max-concurrent-allocs", "max_concurrent_allocs", "max_concurrent_allocs"),
    ("--generation-mode", "generation_mode", "generation_mode"),
)


def _shown(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def closed_refusals(args) -> None:
    """CLOSED: the first override of a lock, as a RuleRefusal; a value equal to the lock is no override."""
    for flag, attr, _ in PARAM_FLAGS:
        if getattr(args, attr) is not None:
            raise RuleRefusal(
                "kvcacheFixedWorkloadPerOption",
                f"{flag} {_shown(getattr(args, attr))}: CLOSED runs Table KVCache-1's value of each Option",
            )
    if args.options is not None and sorted(args.options) != [1, 2, 3]:
        raise RuleRefusal(
            "kvcacheFixedWorkloadPerOption", f"--options {' '.join(map(str, args.options))}, must be 1 2 3"
        )
    for flag, value, lock in (
        ("--seed", args.seed, CLOSED_SEED),
        ("--trials", args.trials, CLOSED_TRIALS),
        ("--inter-option-delay", args.inter_option_delay, CLOSED_DELAY_S),
    ):
        if value is not None and value != lock:
            raise RuleRefusal("kvcacheClosedSequenceLocks", f"{flag} {_shown(value)}, must be {lock}")
    if args.config is not None:
        raise RuleRefusal("kvcacheClosedSequenceLocks", f"--config {args.config}: not permitted in CLOSED")
    if args.enable_autoscaling:
        raise RuleRefusal("kvcacheAutoscalingProhibited", "--enable-autoscaling: not permitted in CLOSED")
    for flag, value in (
        ("--start-delay", args.start_delay),
        ("--end-delay", args.end_delay),
    ):
        if value is not None and value != WRAPPER_DELAY_S:
            raise RuleRefusal("kvcacheClosedImmutable", f"{flag} {_shown(value)}, must be {WRAPPER_DELAY_S}")
    for flag, attr in (("--rag-num-docs", "rag_num_docs"), ("--performance-profile", "performance_profile")):
        if getattr(args, attr) is not None:
            raise RuleRefusal("kvcacheClosedImmutable", f"{flag}: not permitted in CLOSED")
    if args.enable_rag or args.disable_multi_turn or args.disable_prefix_caching:
        raise RuleRefusal("kvcacheClosedImmutable", "workload flags (--enable-rag, --disable-*): not in CLOSED")


def rank_layout(hosts: list[str], num_processes: int | None, npernode: int | None) -> tuple[int, int]:
    """(npernode, total ranks) as Rules.md 6.3.3.1 resolves them; RuleRefusal when they do not add up."""
    n = len(hosts)
    rule = "kvcacheClientDefinition"
    for flag, v in (("--num-processes", num_processes), ("--npernode", npernode)):
        if v is not None and v < 1:
            raise RuleRefusal(rule, f"{flag} {v}, must be at least 1")
    if num_processes is not None and npernode is not None:
        if num_processes != npernode * n:
            raise RuleRefusal(rule, f"--num-processes {num_processes} is not --npernode {npernode} x {n} hosts")
        return npernode, num_processes
    if num_processes is not None:
        if num_processes % n:
            raise RuleRefusal(rule, f"--num-processes {num_processes} does not divide among {n} hosts")
        return num_processes // n, num_processes
    npernode = npernode or 1
    return npernode, npernode * n


def _existing(path: Path) -> Path:
    """`path`, or its nearest ancestor that exists (what a directory yet to be made will be on)."""
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def same_filesystem(a: Path, b: Path) -> bool:
    return os.stat(_existing(a)).st_dev == os.stat(_existing(b)).st_dev


def capacity_gate(cache_dir: Path, option_flags: dict[int, list[str]], npernode: int) -> None:
    """whatif: the cache directory's free space holds each Option's KV cache on this host (mlpstorage's estimate
    per user, times the users of the ranks of one host), else a refusal."""
    free = shutil.disk_usage(_existing(cache_dir)).free
    for option, flags in option_flags.items():
        f = dict(zip(flags[::2], flags[1::2]))
        per_token, sequence = CAPACITY_ESTIMATES.get(f["--model"], CAPACITY_DEFAULT)
        need = per_token * sequence * int(f["--num-users"]) * npernode
        if need > free:
            raise UserError(
                f"--cache-dir {cache_dir}: {free:,} bytes free, Option {option} needs {need:,}"
                f" ({f['--num-users']} users x {npernode} ranks of {f['--model']}; mlpstorage's capacity estimate)"
            )


def make_plan(args, argv: list[str]) -> Plan:
    """Everything decided and every refusal made, before anything is written."""
    mode = args.mode
    if mode == "closed":
        closed_refusals(args)
    options = sorted(set(args.options)) if args.options else [1, 2, 3]
    option_flags = {}
    for o in options:
        opt = OPTIONS[o]
        flags = []
        for flag, attr, field_name in PARAM_FLAGS:
            value = getattr(args, attr)
            value = getattr(opt, field_name) if value is None else value
            flags += [flag, _shown(value)]
        option_flags[o] = flags
    global_flags: list[str] = []
    for attr, flag in (
        ("disable_multi_turn", "--disable-multi-turn"),
        ("disable_prefix_caching", "--disable-prefix-caching"),
        ("enable_rag", "--enable-rag"),
        ("enable_autoscaling", "--enable-autoscaling"),
    ):
        if getattr(args, attr):
            global_flags.append(flag)
    for attr, flag in (("rag_num_docs", "--rag-num-docs"), ("performance_profile", "--performance-profile")):
        if getattr(args, attr) is not None:
            global_flags += [flag, str(getattr(args, attr))]
    hosts = args.hosts or ["localhost"]
    npernode, total = rank_layout(hosts, args.num_processes, args.npernode)
    trials = CLOSED_TRIALS if args.trials is None else args.trials
    delay = CLOSED_DELAY_S if args.inter_option_delay is None else args.inter_option_delay
    for flag, v in (("--trials", trials), ("--inter-option-delay", delay)):
        if v < (1 if flag == "--trials" else 0):
            raise ConfigError(f"{flag} {_shown(v)}: must be at least {1 if flag == '--trials' else 0}")
    for flag, v in (("--start-delay", args.start_delay), ("--end-delay", args.end_delay)):
        if v is not None and v < 0:
            raise ConfigError(f"{flag} {_shown(v)}: seconds, at least 0")
    if args.config is not None and not Path(args.config).is_file():
        raise ConfigError(f"--config {args.config}: no such file")
    if shutil.which(args.mpirun) is None:
        raise ConfigError(f"--mpirun {args.mpirun}: not found (install Open MPI or MPICH, or name its mpirun)")
    results, cache = Path(args.results_dir).absolute(), Path(args.cache_dir).absolute()
    same = same_filesystem(cache, results)
    if same:
        what = f"--cache-dir {cache} and --results-dir {results} are on one filesystem"
        if mode == "closed":
            raise RuleRefusal("kvcachePosixCacheDir", f"{what}; give them different filesystems")
        log.warning("kvcachePosixCacheDir: %s (only an OPEN result: results I/O perturbs the storage under test)", what)
    if mode == "whatif":
        capacity_gate(cache, option_flags, npernode)
    gateway = gateway_of(str(cache)) if cache.exists() else None
    if gateway is not None:  # 6.5.2: a cache on object storage through a POSIX gateway records which, and how mounted
        log.info("--cache-dir is on %s (%s), mounted %s", gateway["name"], gateway["version"], gateway["mount_options"])
    return Plan(
        mode=mode,
        results_dir=results,
        cache_dir=cache,
        options=options,
        trials=trials,
        seed=CLOSED_SEED if args.seed is None else args.seed,
        inter_option_delay_s=delay,
        start_delay_s=WRAPPER_DELAY_S if args.start_delay is None else args.start_delay,
        end_delay_s=WRAPPER_DELAY_S if args.end_delay is None else args.end_delay,
        config=str(Path(args.config).absolute()) if args.config else None,
        option_flags=option_flags,
        global_flags=global_flags,
        hosts=hosts,
        npernode=npernode,
        total_ranks=total,
        mpirun=args.mpirun,
        mpi_params=shlex.split(args.mpi_params or ""),
        same_filesystem=same,
        cache_gateway=gateway,
        argv=argv,
    )


def reserve_run_dir(plan: Plan) -> tuple[Path, str]:
    """A new directory of this run (never one another run wrote into) and its time stamp."""
    stamp = dt.datetime.now().strftime("%Y%m%d_%H%M%S")
    parent = plan.results_dir / plan.mode / "kv_cache" / "run"
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--results-dir {plan.results_dir}: cannot make {parent} ({exc.strerror})") from exc
    for n in range(1000):
        name = stamp if n == 0 else f"{stamp}_{n}"
        try:
            (parent / name).mkdir()
            return parent / name, name
        except FileExistsError:
            continue
    raise ConfigError(f"{parent}: a thousand runs of {stamp}")


def mpi_prefix(plan: Plan) -> list[str]:
    hosts = ",".join(f"{h}:{plan.npernode}" for h in plan.hosts)
    cmd = [plan.mpirun, "-n", str(plan.total_ranks), "-host", hosts, "--map-by", f"ppr:{plan.npernode}:node"]
    cmd += ["--bind-to", "none"]
    if os.geteuid() == 0:  # Open MPI refuses root without it; a root run is the user's choice already
        cmd.append("--allow-run-as-root")
    # the user's first; then what every kvcache job needs: a rank that fails must not abort the others
    return cmd + plan.mpi_params + ["--mca", "orte_abort_on_non_zero_status", "0"]


def trial_command(plan: Plan, shim: Path, trial_dir: Path, option: int) -> list[str]:
    config = plan.config or str(shim / "config.yaml")
    return [
        *mpi_prefix(plan),
        sys.executable,
        str(shim / "mlperf_wrapper.py"),
        *("--rank-output-base", str(trial_dir)),
        *("--rank-cache-base", str(plan.cache_dir)),
        *("--seed-base", str(plan.seed)),
        *("--start-delay", _shown(plan.start_delay_s)),
        *("--end-delay", _shown(plan.end_delay_s)),
        *("--config", config),
        *plan.option_flags[option],
        *plan.global_flags,
    ]


def probe_shared_results_dir(plan: Plan, run_dir: Path) -> None:
    """6.3.3.4: one process per host drops a file into the run directory; every host's must be seen here."""
    hosts = list(dict.fromkeys(h.split(":")[0] for h in plan.hosts))
    if len(hosts) <= 1 or set(hosts) <= LOCAL_HOSTS | {os.uname().nodename}:
        return
    probe = run_dir / ".fs_probe"
    probe.mkdir()
    token = uuid.uuid4().hex[:12]
    # One rank per host (-host H:1 each, --map-by node): a file per rank is a file per host. Named by the rank, not
    # the host name: network-namespace nodes (deploy/netns-rsh) and containers may all have this machine's name.
    code = (
        "import os,pathlib,sys;r=os.environ.get('OMPI_COMM_WORLD_RANK',os.environ.get('PMI_RANK','0'));"
        "pathlib.Path(sys.argv[1],sys.argv[2]+'__'+r+'.ok').write_text(r)"
    )
    cmd = [plan.mpirun, "-n", str(len(hosts)), "-host", ",".join(f"{h}:1" for h in hosts), "--map-by", "node"]
    cmd += (["--allow-run-as-root"] if os.geteuid() == 0 else []) + plan.mpi_params
    subprocess.run([*cmd, sys.executable, "-c", code, str(probe), token], capture_output=True, timeout=300)
    seen = {p.read_text() for p in probe.glob(f"{token}__*.ok")}
    shutil.rmtree(probe, ignore_errors=True)
    if len(seen) < len(hosts):
        raise RuleRefusal(
            "kvcacheSharedResultsDir",
            f"--results-dir {plan.results_dir} is seen by {len(seen)} of {len(hosts)} hosts; mount it at the same"
            " path on every host",
        )


class Runner:
    """Runs a Plan: the trials, the record, the summary; stops between or during trials on SIGINT/SIGTERM."""

    def __init__(self, plan: Plan, view=None):
        self.plan = plan
        self.view = view
        self.stop: list[int] = []
        self.child: subprocess.Popen | None = None
        self.commands: list[dict] = []
        self.trial_dirs: dict[int, list[str]] = {}
        self.run_dir = Path()
        self.stamp = ""
        self.record_path = Path()

    def on_signal(self, signum, _frame) -> None:
        self.stop.append(signum)
        if self.child is not None and self.child.poll() is None:
            try:
                os.killpg(self.child.pid, signum)  # mpirun and what it started: they stop, ranks write aside
            except ProcessLookupError:
                pass

    def record(self, status: str) -> None:
        p = self.plan
        doc = {
            "kind": MANIFEST_KIND,
            "schema_version": "1.0",
            "run_datetime": self.stamp,
            "status": status,
            "mode": p.mode,
            "argv": p.argv,
            "options": {str(o): p.option_flags[o] for o in p.options},
            "global_flags": p.global_flags,
            "seed": p.seed,
            "trials": p.trials,
            "inter_option_delay_s": p.inter_option_delay_s,
            "start_delay_s": p.start_delay_s,
            "end_delay_s": p.end_delay_s,
            "config": p.config,
            "enable_autoscaling": "--enable-autoscaling" in p.global_flags,
            "hosts": p.hosts,
            "npernode": p.npernode,
            "total_ranks": p.total_ranks,
            "cache_dir": str(p.cache_dir),
            "results_dir": str(p.results_dir),
            "filesystems": {"same": p.same_filesystem, "cache_gateway": p.cache_gateway},
            "commands": self.commands,
            "stopped_by": signal_name(self.stop[0]) if self.stop else None,
        }
        tmp = self.record_path.with_name(self.record_path.name + ".tmp")
        write_json(tmp, doc)
        os.replace(tmp, self.record_path)

    def sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.stop and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, 0.2))

    def run_trial(self, option: int, trial: int, shim: Path) -> int:
        trial_dir = self.run_dir / f"option_{option}" / f"trial_{trial}"
        trial_dir.mkdir(parents=True)
        cmd = trial_command(self.plan, shim, trial_dir, option)
        prefix = self.run_dir / f"kvcache_opt{option}_trial{trial}_{self.stamp}"
        entry = {
            "option": option,
            "trial": trial,
            "command": shlex.join(cmd),
            "stdout": f"{prefix}.stdout.log",
            "stderr": f"{prefix}.stderr.log",
            "exit_status": None,
        }
        self.commands.append(entry)
        self.record("running")
        with open(entry["stdout"], "wb") as out, open(entry["stderr"], "wb") as err:
            self.child = subprocess.Popen(cmd, stdout=out, stderr=err, start_new_session=True)
            if self.stop:  # a signal before the child existed
                os.killpg(self.child.pid, self.stop[0])
            rc = self.child.wait()
        pgid, self.child = self.child.pid, None
        try:
            os.killpg(pgid, signal.SIGKILL)  # anything of the job mpirun left behind
        except ProcessLookupError:
            pass
        entry["exit_status"] = rc
        self.record("running")
        return rc

    def run(self) -> tuple[dict, Path]:
        p = self.plan
        self.run_dir, self.stamp = reserve_run_dir(p)
        self.record_path = self.run_dir / f"{MANIFEST_PREFIX}{self.stamp}.json"
        shim = self.run_dir / "kvtier-shim"
        write_shim(str(shim), p.start_delay_s, p.end_delay_s)
        self.record("starting")
        probe_shared_results_dir(p, self.run_dir)
        with stop_signals_handled(self.on_signal):
            for i, option in enumerate(p.options):
                if i and not self.stop:
                    if self.view:
                        self.view.waiting(option, p.inter_option_delay_s)
                    self.sleep(p.inter_option_delay_s)
                for trial in range(p.trials):
                    if self.stop:
                        break
                    if self.view:
                        self.view.trial(option, trial)
                    rc = self.run_trial(option, trial, shim)
                    if not self.stop:  # a stopped trial is no trial of the run
                        self.trial_dirs.setdefault(option, []).append(
                            str(self.run_dir / f"option_{option}" / f"trial_{trial}")
                        )
                    if self.view:
                        self.view.done(option, trial, rc)
                if self.stop:
                    break
        results = {o: aggregate_option(o, dirs, p.total_ranks) for o, dirs in self.trial_dirs.items()}
        doc = run_summary(results, self.stamp, p.npernode, len(p.hosts), p.total_ranks, p.trials)
        if self.stop:
            doc["partial_failure"] = True
            doc["stopped_by"] = signal_name(self.stop[0])
            doc["options_not_run"] = [o for o in p.options if o not in self.trial_dirs]
        path = write_summary(str(self.run_dir), doc)
        self.record("stopped" if self.stop else "completed")
        return doc, path

    def exit_status(self, doc: dict) -> int:
        if self.stop:
            return exit_code(self.stop[0])
        return 1 if doc["partial_failure"] else 0


__all__ = ["Plan", "RuleRefusal", "Runner", "make_plan", "rank_layout", "trial_command", "wrapper_flags"]
