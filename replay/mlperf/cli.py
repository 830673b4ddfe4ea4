"""`kvtier mlperf`: kvtier under the MLPerf Storage v3.0 KV cache submission harness (mlpstorage).

- `kvtier mlperf shim DIR`: write DIR/kv-cache.py, DIR/mlperf_wrapper.py and DIR/config.yaml, so that
  `mlpstorage <closed|open|whatif> kvcache run --kvcache-bin-path DIR/kv-cache.py ...` runs `kvtier bench` for
  every rank, trial and Option, with no change to mlpstorage (shim.py).
- `kvtier mlperf summary RUN_DIR`: aggregate a run directory's rank files into `kvcache_run_summary_<time>.json`
  as mlpstorage does (summary.py).
"""

from __future__ import annotations

import argparse
import sys

from kvconnector.errors import UserError

from ..common.cli import OneLineParser, command
from ..outputs.terminal import console
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


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog=PROG,
        description="kvtier under the MLPerf Storage v3.0 KV cache harness (mlpstorage): a shim it runs as its"
        " kv-cache.py, and its aggregation of rank files.",
        epilog=EXAMPLES.format(python=sys.executable),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="action", required=True, metavar="{shim,summary}")
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
    return p


@command("mlperf")
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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


def show(doc: dict) -> None:
    from rich.table import Table

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
