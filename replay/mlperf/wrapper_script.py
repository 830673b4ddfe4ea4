#!/usr/bin/env python3
"""mlperf_wrapper.py of a kvtier shim (written by `kvtier mlperf shim DIR`): what mpirun starts once per rank.

The command line and the layout are those of the MLPerf Storage KV cache harness's wrapper
(mlcommons/storage as hazemawadalla/storage rules-pr 2f65ef1, kv_cache_benchmark/mlperf_wrapper.py), so that
`mlpstorage <closed|open|whatif> kvcache run --kvcache-bin-path DIR/kv-cache.py` runs this file unchanged:

- its own flags: --rank-output-base and --rank-cache-base (required), --seed-base (default 42), --start-delay and
  --end-delay (seconds slept before and after the run; the harness passes neither, so their defaults apply:
  90 s each as there, or what `kvtier mlperf shim --start-delay/--end-delay` wrote below); no abbreviations, so a
  forwarded --seed is never taken for --seed-base;
- the rank from OMPI_COMM_WORLD_RANK (Open MPI), else PMI_RANK (MPICH, Intel MPI, Slurm), else 0 (no mpirun);
- every other argument goes to kv-cache.py beside this file, with --seed <seed-base + rank>,
  --output <rank-output-base>/rank_<N>/kvcache_results_<YYYYmmdd_HHMMSS>.json and
  --cache-dir <rank-cache-base>/rank_<N> appended last (argparse keeps the last value of a repeated flag);
- its exit status is kv-cache.py's.

Unlike that wrapper it refuses a rank variable that is not a number (one line, exit 2) instead of reading it as
rank 0, which would put two ranks into one directory; and a SIGINT or SIGTERM during the run goes on to kv-cache.py
(which writes its partial results aside, see kvcache_script.py) and is waited for, so no process is left behind.

Standard library only: this file runs under the harness's Python, not kvtier's.
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

# Defaults of the two delays, in seconds (`kvtier mlperf shim` rewrites these two lines).
START_DELAY_S = 90
END_DELAY_S = 90

BASE_SEED = 42
RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMI_RANK")
PROG = "mlperf_wrapper.py (kvtier)"


def rank_of(environ) -> int:
    """This process's MPI rank: the first of RANK_VARIABLES that is set; 0 when none is (a run without mpirun).
    A set variable that is not a non-negative integer is a refusal (ValueError naming it)."""
    for name in RANK_VARIABLES:
        value = environ.get(name)
        if value:
            if not value.isdigit():
                raise ValueError(f"{name}={value!r}: not an MPI rank")
            return int(value)
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="One MPI rank of the MLPerf KV cache harness: runs kv-cache.py beside this file (kvtier bench)"
        " with this rank's seed, results file and cache directory; other arguments go to kv-cache.py.",
        allow_abbrev=False,
    )
    p.add_argument("--rank-output-base", required=True, help="this rank's results go to BASE/rank_<N>/")
    p.add_argument("--rank-cache-base", required=True, help="this rank's cache is BASE/rank_<N>/")
    p.add_argument("--seed-base", type=int, default=BASE_SEED, help="seed = this + rank (default %(default)s)")
    p.add_argument("--start-delay", type=float, default=START_DELAY_S, help="seconds before (default %(default)s)")
    p.add_argument("--end-delay", type=float, default=END_DELAY_S, help="seconds after (default %(default)s)")
    return p


def rank_command(args: argparse.Namespace, forwarded: list, rank: int, now: datetime.datetime) -> tuple:
    """(kv-cache.py's command line, this rank's results directory, its cache directory)."""
    out_dir = Path(args.rank_output_base) / f"rank_{rank}"
    cache_dir = Path(args.rank_cache_base) / f"rank_{rank}"
    output = out_dir / f"kvcache_results_{now.strftime('%Y%m%d_%H%M%S')}.json"
    script = Path(__file__).resolve().parent / "kv-cache.py"
    cmd = [sys.executable, str(script), *forwarded]
    cmd += ["--seed", str(args.seed_base + rank), "--output", str(output), "--cache-dir", str(cache_dir)]
    return cmd, out_dir, cache_dir


def refuse(message: str) -> int:
    print(f"{PROG}: {message}", file=sys.stderr)
    return 2


def main(argv=None) -> int:
    args, forwarded = parser().parse_known_args(argv)
    if args.start_delay < 0 or args.end_delay < 0:
        return refuse("--start-delay and --end-delay: seconds, at least 0")
    try:
        rank = rank_of(os.environ)
    except ValueError as exc:
        return refuse(str(exc))
    cmd, out_dir, cache_dir = rank_command(args, forwarded, rank, datetime.datetime.now())
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        cache_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return refuse(f"cannot make {exc.filename}: {exc.strerror}")

    stop = []  # the signal that asked this rank to stop, if one did

    def note(signum, _frame):
        stop.append(signum)
        if child is not None:
            child.send_signal(signum)  # kv-cache.py stops, writes its partial results aside, exits

    child = None
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, note)
    print(f"kvtier wrapper, rank {rank}: start delay {args.start_delay:g} s", flush=True)
    _sleep(args.start_delay, stop)
    if stop:
        return 128 + stop[0]
    print(f"kvtier wrapper, rank {rank}: {' '.join(cmd)}", flush=True)
    child = subprocess.Popen(cmd)
    if stop:  # a signal between the check and Popen
        child.send_signal(stop[0])
    rc = child.wait()
    if stop:
        return 128 + stop[0]
    print(f"kvtier wrapper, rank {rank}: kv-cache.py exited {rc}; end delay {args.end_delay:g} s", flush=True)
    _sleep(args.end_delay, stop)
    return 128 + stop[0] if stop and rc == 0 else rc


def _sleep(seconds: float, stop: list) -> None:
    """Sleep to a deadline (monotonic clock), cut short by a stop signal."""
    deadline = time.monotonic() + seconds
    while not stop:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(left, 0.5))


if __name__ == "__main__":
    sys.exit(main())
