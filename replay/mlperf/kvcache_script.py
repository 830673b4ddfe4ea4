#!/usr/bin/env python3
"""kv-cache.py of a kvtier shim (written by `kvtier mlperf shim DIR`): runs `kvtier bench` with the arguments given.

The MLPerf Storage KV cache harness (mlpstorage, through mlperf_wrapper.py) runs this file as it runs the reference's
kv-cache.py. `kvtier bench` takes every flag of the reference's kv-cache.py with its meaning (replay/synthetic/
README.md), so the arguments go on unchanged; the results file it writes carries every key the harness and Rules.md
section 6 read (`summary.cache_stats.tier_storage_read_bandwidth_gbps`, `summary.storage_io_latency_ms.p95`,
`cache_stats.storage_read_device_p95_ms`, `cache_stats.storage_entries`, ...: replay/synthetic/results.py).

What this file adds, and why:
- kvtier is run by the Python that wrote the shim, with that kvtier's code first on the path (KVTIER_PYTHON and
  KVTIER_ROOT below, written by `kvtier mlperf shim`): the harness's own Python need not have kvtier installed.
- mpirun's variables (OMPI_*, PMI_*, PMIX_*) are left out of kvtier's environment: under the harness each rank is one
  independent client, and `kvtier bench` started with them would take itself for a rank of a kvtier MPI job.
- --no-progress: the harness captures the output into log files, where a live line is noise.
- the results file is promoted only for a completed run. kvtier writes to `kvtier_inflight_<name>` in the same
  directory; exit 0 with `summary.status` completed renames it to the name asked for (os.replace, atomic). Any other
  end renames it to `kvtier_failed_<name>`: the harness globs `kvcache_results_*.json`, so a rank that failed or was
  stopped leaves nothing it could take for a result (its rank is then missing: `partial_failure`).
- SIGINT and SIGTERM go on to kvtier (which stops and writes its partial results); the exit status is 128 + the
  signal's number.

Standard library only: this file runs under the harness's Python, not kvtier's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

# Written by `kvtier mlperf shim`: the Python that runs kvtier, and the directory holding its `replay` package.
KVTIER_PYTHON = sys.executable
KVTIER_ROOT = str(Path(__file__).resolve().parents[2])

MPI_PREFIXES = ("OMPI_", "PMI_", "PMIX_")
PROG = "kv-cache.py (kvtier)"
INFLIGHT, FAILED = "kvtier_inflight_", "kvtier_failed_"

# `python -c` puts the working directory first on sys.path: the shim's kvtier goes before it.
LAUNCH = "import sys; sys.path.insert(0, sys.argv.pop(1)); from replay.cli import main; sys.exit(main())"


def output_of(argv: list) -> tuple:
    """(the value of the last --output in argv or None, argv with that value's position)."""
    found, at = None, None
    for i, arg in enumerate(argv):
        if arg == "--output" and i + 1 < len(argv):
            found, at = argv[i + 1], (i + 1, False)
        elif arg.startswith("--output="):
            found, at = arg[len("--output=") :], (i, True)
    return found, at


def with_output(argv: list, at: tuple, path: str) -> list:
    i, inline = at
    out = list(argv)
    out[i] = f"--output={path}" if inline else path
    return out


def kvtier_environ(environ) -> dict:
    return {k: v for k, v in environ.items() if not k.startswith(MPI_PREFIXES)}


def kvtier_command(argv: list) -> list:
    return [KVTIER_PYTHON, "-c", LAUNCH, KVTIER_ROOT, "bench", *argv, "--no-progress"]


def completed(path: Path) -> bool:
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return False
    summary = doc.get("summary") if isinstance(doc, dict) else None
    return isinstance(summary, dict) and summary.get("status") == "completed"


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not os.access(KVTIER_PYTHON, os.X_OK):
        print(f"{PROG}: {KVTIER_PYTHON}: no such Python (run `kvtier mlperf shim` again)", file=sys.stderr)
        return 2
    output, at = output_of(argv)
    final = inflight = None
    if output is not None:
        final = Path(output)
        inflight = final.with_name(INFLIGHT + final.name)
        argv = with_output(argv, at, str(inflight))

    stop = []  # the signal that asked this run to stop, if one did
    child = None

    def forward(signum, _frame):
        stop.append(signum)
        if child is not None:
            child.send_signal(signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, forward)
    child = subprocess.Popen(kvtier_command(argv), env=kvtier_environ(os.environ))
    if stop:  # a signal before the child existed
        child.send_signal(stop[0])
    rc = child.wait()
    if inflight is not None and os.path.lexists(inflight):
        if rc == 0 and not stop and completed(inflight):
            os.replace(inflight, final)
            print(f"{PROG}: results {final}", flush=True)
        else:
            aside = final.with_name(FAILED + final.name)
            os.replace(inflight, aside)
            print(f"{PROG}: the run did not complete (exit {rc}); its partial results: {aside}", flush=True)
    if stop:
        return 128 + stop[0]
    return rc


if __name__ == "__main__":
    sys.exit(main())
