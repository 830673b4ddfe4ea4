"""`kvtier mlperf`: kvtier under the MLPerf Storage v3.0 KV cache submission harness (mlpstorage).

- `kvtier mlperf shim DIR`: write DIR/kv-cache.py, DIR/mlperf_wrapper.py and DIR/config.yaml, so that
  `mlpstorage <closed|open|whatif> kvcache run --kvcache-bin-path DIR/kv-cache.py ...` runs `kvtier bench` for
  every rank, trial and Option, with no change to mlpstorage (shim.py).
- `kvtier mlperf summary RUN_DIR`: aggregate a run directory's rank files into `kvcache_run_summary_<time>.json`
  as mlpstorage does (summary.py).
- `kvtier mlperf run --mode closed|open|whatif`: kvtier's own harness, for users without mlpstorage (run.py).
"""

from __future__ import annotations

import argparse
import sys

from kvconnector.errors import UserError

from ..common.cli import OneLineParser, command
from .shim import write_shim
from .summary import OPTIONS, summarize, write_summary

PROG = "kvtier mlperf"

EXAMPLES = """\
examples:
  kvtier mlperf shim /opt/kvtier-shim
  mlpstorage open kvcache run --kvcache-bin-path /opt/kvtier-shim/kv-cache.py --systemname sut \\
      --results-dir /results/kv --cache-dir /mnt/nvme/kv --model llama3.1-8b --num-users 8 --duration 30 \\
      --gpu-mem-gb 0 --cpu-mem-gb 0 --generation-mode none --trials 1 --inter-option-delay 0
  kvtier mlperf summary /results/kv/open/kvcache/llama3.1-8b/run/20260101_120000 --ranks 4

The shim runs kvtier bench under this Python ({python}) and this kvtier; write it again after moving either.
mlpstorage scores summary.storage_io_latency_ms.p95 (aggregated_p95_latency_ms); Rules.md 6.3.4.3 names the device
p95s, which `kvtier mlperf summary` adds (aggregated_device_read_p95_ms, aggregated_device_write_p95_ms).
"""

SHIM_EXAMPLES = """\
examples:
  kvtier mlperf shim /opt/kvtier-shim
  kvtier mlperf shim /tmp/shim --start-delay 0 --end-delay 0     # a quick OPEN look, no idle minutes per trial

mlpstorage passes neither delay to the wrapper: what is written here is what every rank sleeps, before and after
each run (the reference's wrapper: 90 s each).
"""

SUMMARY_EXAMPLES = """\
examples:
  kvtier mlperf summary RUN_DIR                         # ranks and trials read from the tree
  kvtier mlperf summary RUN_DIR --ranks 4 --trials 3    # what the run asked for: an absent rank is missing

exit status: 0 summary written; 1 written, with a partial failure (a rank file missing or unreadable); 2 refused.
"""


RUN_EXAMPLES = """\
examples:
  kvtier mlperf run --mode closed --results-dir /results/kv --cache-dir /mnt/nvme/kv --npernode 4
  kvtier mlperf run --mode open --results-dir /results/kv --cache-dir /mnt/nvme/kv --options 1 --trials 1 \\
      --duration 30 --num-users 8 --inter-option-delay 0 --start-delay 0 --end-delay 0 --num-processes 2

CLOSED runs Options 1, 2 and 3 of Table KVCache-1, 3 trials each, seed 42, 20 s between Options (mlpstorage's
code; Rules.md 6.3.2.1 says 90 s), each rank sleeping 90 s before and after each trial (the reference wrapper's);
an override is refused before anything runs, naming the rule. In OPEN and whatif a flag given supersedes the
Option's value (one left out never does). whatif also refuses a cache directory without room for the KV cache.
exit status: 0 done; 1 done with a partial failure (a rank's results missing); 2 refused; 130/143 stopped by a
signal (the summary of the trials that completed is written, marked partial).
"""


def add_run_parser(sub) -> None:
    r = sub.add_parser(
        "run",
        help="kvtier's own harness: the three Options x trials through mpirun, the run summary (no mlpstorage)",
        description="Run the MLPerf Storage v3.0 KV cache sequence as `mlpstorage <mode> kvcache run` does:"
        " Options 1-3 x trials, one kvtier bench per MPI rank (through the shim's wrapper, into"
        " option_<O>/trial_<T>/rank_<N>/), then kvcache_run_summary_<time>.json; `kvtier check RUN_DIR` then"
        " checks the rules.",
        epilog=RUN_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    r.add_argument("--mode", required=True, choices=("closed", "open", "whatif"), help="the division")
    r.add_argument("--results-dir", required=True, help="where run directories go (not on the cache's filesystem)")
    r.add_argument("--cache-dir", required=True, help="the storage under test; rank N uses CACHE_DIR/rank_N")
    g = r.add_argument_group("sequence (CLOSED: locked)")
    g.add_argument("--options", type=int, nargs="+", choices=(1, 2, 3), help="Options to run (default 1 2 3)")
    g.add_argument("--trials", type=int, help="trials per Option (3)")
    g.add_argument("--seed", type=int, help="seed base; rank N gets seed + N (42)")
    g.add_argument("--inter-option-delay", type=float, help="seconds between Options (20)")
    g.add_argument("--start-delay", type=float, help="seconds each rank sleeps before a trial (90)")
    g.add_argument("--end-delay", type=float, help="seconds each rank sleeps after a trial (90)")
    g.add_argument("--config", help="a kvtier bench / kv-cache.py config file for every rank")
    w = r.add_argument_group("workload (CLOSED: Table KVCache-1; OPEN: a flag given supersedes the Option's value)")
    w.add_argument("--model")
    w.add_argument("--num-users", type=int, help="per client (rank)")
    w.add_argument("--duration", type=int, help="seconds per trial")
    w.add_argument("--gpu-mem-gb", type=float)
    w.add_argument("--cpu-mem-gb", type=float)
    w.add_argument("--max-concurrent-allocs", type=int)
    w.add_argument("--generation-mode", choices=("none", "fast", "realistic"))
    w.add_argument("--enable-autoscaling", action="store_true")
    w.add_argument("--enable-rag", action="store_true")
    w.add_argument("--rag-num-docs", type=int)
    w.add_argument("--disable-multi-turn", action="store_true")
    w.add_argument("--disable-prefix-caching", action="store_true")
    w.add_argument("--performance-profile", choices=("latency", "throughput"))
    m = r.add_argument_group("clients (MPI ranks; Rules.md 6.3.3)")
    m.add_argument("--hosts", nargs="+", help="hosts to run ranks on (default localhost)")
    m.add_argument("--num-processes", "-np", type=int, help="ranks in all (divides evenly among the hosts)")
    m.add_argument("--npernode", type=int, help="ranks per host (default 1)")
    m.add_argument(
        "--mpirun", default="mpirun", help="the MPI launcher (default mpirun; as root, kvtier adds --allow-run-as-root)"
    )
    m.add_argument("--mpi-params", help="more launcher flags, one quoted string (--mpi-params='--mca x y')")
    r.add_argument("--no-progress", action="store_true", help="no live progress bar")


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog=PROG,
        description="kvtier under the MLPerf Storage v3.0 KV cache harness (mlpstorage): a shim it runs as its"
        " kv-cache.py, and its aggregation of rank files.",
        epilog=EXAMPLES.format(python=sys.executable),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="action", required=True, metavar="{shim,summary,run}")
    shim = sub.add_parser(
        "shim",
        help="write a kv-cache.py + mlperf_wrapper.py directory that mlpstorage runs as the reference's",
        description="Write DIR/kv-cache.py, DIR/mlperf_wrapper.py and DIR/config.yaml: give mlpstorage"
        " --kvcache-bin-path DIR/kv-cache.py and every rank runs kvtier bench under this Python.",
        epilog=SHIM_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    shim.add_argument("dir", metavar="DIR", help="the directory to write (made if missing)")
    shim.add_argument("--start-delay", type=float, default=90, help="seconds each rank sleeps before its run (90)")
    shim.add_argument("--end-delay", type=float, default=90, help="seconds each rank sleeps after its run (90)")
    summ = sub.add_parser(
        "summary",
        help="aggregate a run directory's rank files into kvcache_run_summary_<time>.json, as mlpstorage does",
        description="Aggregate RUN_DIR/option_<O>/trial_<T>/rank_<N>/kvcache_results_*.json as mlpstorage does"
        " (Rules.md 6.3.4): per trial the ranks' bandwidths and throughputs summed, their mean over trials, the"
        " p95s' maximum over ranks and trials.",
        epilog=SUMMARY_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    summ.add_argument("run_dir", metavar="RUN_DIR", help="the run's directory (holding option_1/, ...)")
    summ.add_argument("--ranks", type=int, help="ranks the run had (default: read from the tree)")
    summ.add_argument("--trials", type=int, help="trials per Option the run had (default: read from the tree)")
    summ.add_argument("--hosts", type=int, default=1, help="hosts the ranks ran on (default 1)")
    summ.add_argument("--npernode", type=int, help="ranks per host (default ranks / hosts)")
    summ.add_argument("-o", "--output", help="the summary file (default RUN_DIR/kvcache_run_summary_<time>.json)")
    add_run_parser(sub)
    return p


@command("mlperf")
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.action == "run":
        return run(args, argv)
    if args.action == "shim":
        for path in write_shim(args.dir, args.start_delay, args.end_delay):
            print(path)
        return 0
    for flag in ("ranks", "trials", "hosts", "npernode"):
        value = getattr(args, flag)
        if value is not None and value < (0 if flag in ("ranks", "trials") else 1):
            raise UserError(f"--{flag} {value}: must be at least {0 if flag in ('ranks', 'trials') else 1}")
    doc = summarize(args.run_dir, args.ranks, args.trials, args.npernode, args.hosts)
    path = write_summary(args.run_dir, doc, args.output)
    show(doc)
    print(f"summary: {path}")
    return 1 if doc["partial_failure"] else 0


def run(args, argv: list[str]) -> int:
    from .run import Runner, make_plan
    from .run_view import RunView

    plan = make_plan(args, argv)  # every refusal before anything is written
    view = RunView(plan, live=not args.no_progress)
    runner = Runner(plan, view)
    try:
        doc, path = runner.run()
    finally:
        view.close()
    show(doc)
    if doc.get("stopped_by"):
        print(f"stopped by {doc['stopped_by']}: the summary holds the trials that completed")
    print(f"run: {runner.run_dir}")
    print(f"summary: {path}")
    return runner.exit_status(doc)


def show(doc: dict) -> None:
    from rich.table import Table

    from ..outputs.terminal import console

    t = Table(title=f"{doc['total_ranks']} ranks x {doc['trials_per_option']} trials")
    for col in (
        "Option",
        "read GB/s",
        "write GB/s",
        "tokens/s",
        "storage tokens/s",
        "I/O p95 ms",
        "dev read p95 ms",
        "dev write p95 ms",
        "CPU-tier ranks",
        "missing",
    ):
        t.add_column(col, justify="right")

    def ms(v) -> str:
        return "-" if v is None else f"{v:,.2f}"

    for option in OPTIONS:
        r = doc["options"].get(option)
        if r is None:
            continue
        t.add_row(
            str(option),
            f"{r['aggregated_read_bandwidth_gbps']:.3f}",
            f"{r['aggregated_write_bandwidth_gbps']:.3f}",
            f"{r['aggregated_avg_throughput_tokens_per_sec']:,.0f}",
            f"{r['aggregated_storage_throughput_tokens_per_sec']:,.0f}",
            ms(r["aggregated_p95_latency_ms"]),
            ms(r["aggregated_device_read_p95_ms"]),
            ms(r["aggregated_device_write_p95_ms"]),
            str(len(r["cpu_tier_ranks"])),
            str(len(r["missing_files"])),
        )
    console(min_width=140).print(t)
