"""`kvtier` command line: one subcommand per module, each exposing `main(argv) -> int`.

Subcommand modules are imported lazily so `kvtier bench --help` does not pay for aiohttp or matplotlib.

This module owns the error contract of every subcommand (docs/errors.md), so a subcommand only raises:
- a `UserError` (kvconnector/errors.py) that escapes it: one line `kvtier SUB: message` on stderr, exit 2;
- any other exception (a bug, a failure nobody turned into a result): exit 1, one line naming the exception and a
  log file in the temp directory that holds the full traceback (`crash_log`); never a traceback on the terminal.
  A subcommand that measured something writes its partial results first and says where in a note on the exception
  (`exc.add_note("partial results in PATH")`), which the line repeats;
- SIGINT/SIGTERM where the subcommand does not handle them itself: one line, 128 + the signal's number.
Logging is set up here once (`setup_logging`), for every subcommand.
"""

from __future__ import annotations

import datetime as dt
import importlib
import os
import platform
import shlex
import sys
import tempfile
import traceback

from kvconnector.errors import UserError

from .common.cli import Interrupted, closed_stdout_is_fine, fail, setup_logging, stop_signals_raise

SUBCOMMANDS = {
    "bench": ("replay.synthetic.cli", "synthetic benchmark of the tiered KV store, in-process (no vLLM needed)"),
    "replay": ("replay.openai.cli", "replay ShareGPT / BurstGPT / synthetic load against an OpenAI-compatible server"),
    "compare": ("replay.synthetic.compare", "side-by-side table of result JSON files, with ratios"),
    "check": ("replay.synthetic.check", "the MLPerf spec's submission checklist over kvtier bench results files"),
    "merge": ("replay.synthetic.merge", "merge kvtier bench results of several processes, hosts or trials into one"),
    "throttlefs": ("deploy.throttle.cli", "mount a FUSE passthrough that caps bandwidth and adds per-op latency"),
    "sweep": ("deploy.sweep.cli", "run bench or replay once per throttlefs bandwidth x latency point; heat maps"),
    "plan": ("replay.plan.cli", "predict per-round prefix hit rates of long sessions over tiers, and the collapse"),
    "report": ("replay.outputs.html.cli", "one self-contained HTML report (tables, interactive plots) of result files"),
    "distill": ("tracing.distill", "turn a bpftrace storage trace into a standalone fio job"),
}

USAGE = (
    "usage: kvtier {"
    + ",".join(SUBCOMMANDS)
    + "} [options]   (kvtier SUBCOMMAND --help for each)\n\n"
    + "\n".join(f"  {name:<{max(map(len, SUBCOMMANDS))}}  {summary}" for name, (_, summary) in SUBCOMMANDS.items())
    + "\n\nexamples:\n"
    + "  kvtier bench --duration 30 --num-users 50 --cache-dir /mnt/nvme --output run.json\n"
    + "  kvtier replay --base-url http://127.0.0.1:8000 --model M --source synthetic --num-requests 100\n"
    + "  kvtier compare a.json b.json\n"
    + "  kvtier report a.json b.json -o report.html"
)


def main(argv: list[str] | None = None) -> int:
    with closed_stdout_is_fine():  # `kvtier ... | head`: the reader's choice, not the command's failure
        return _main(list(sys.argv[1:] if argv is None else argv))


def _main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        return fail("kvtier", f"unknown subcommand '{name}' (one of {', '.join(SUBCOMMANDS)}; see 'kvtier --help')")
    return run_subcommand(name, rest)


def run_subcommand(name: str, argv: list[str]) -> int:
    """`kvtier NAME ARGV...` under the error contract (the module docstring); returns the exit status."""
    prog = f"kvtier {name}"
    setup_logging(prog)
    # Any subcommand stopped by SIGINT or SIGTERM where it does not handle them itself: one line, 128 + signal.
    with stop_signals_raise():
        try:
            module = importlib.import_module(SUBCOMMANDS[name][0])
            return int(module.main(argv) or 0)
        except Interrupted as exc:
            print(f"{prog}: interrupted ({exc})", file=sys.stderr)
            return exc.exit_code
        except UserError as exc:
            return fail(prog, _one_line(str(exc)) or type(exc).__name__)
        except Exception as exc:  # a bug: one line here, the traceback in a file
            return _bug(name, argv, exc)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _bug(name: str, argv: list[str], exc: BaseException) -> int:
    what = type(exc).__name__ + (f": {_one_line(str(exc))[:300]}" if str(exc).strip() else "")
    notes = "".join(f"; {_one_line(n)}" for n in getattr(exc, "__notes__", ()))
    try:
        where = f"the traceback is in {crash_log(name, argv, exc)}"
    except OSError as err:  # no log to be had: the traceback is all there is, so it goes to stderr after the line
        where = f"no log written ({err.strerror or err}); the traceback follows"
        print(f"kvtier {name}: internal error ({what}){notes}; {where}", file=sys.stderr)
        traceback.print_exception(exc, file=sys.stderr)
        return 1
    print(f"kvtier {name}: internal error ({what}){notes}; {where}", file=sys.stderr)
    return 1


def crash_log(name: str, argv: list[str], exc: BaseException) -> str:
    """Write the traceback of `exc` (with the command line and versions) to a new file in the temp directory,
    kvtier-NAME-<time>-<pid>.log; return its path. The file is created, never opened if it exists (O_EXCL, no link
    followed), readable by its owner only (a command line may hold a URL with a secret)."""
    stamp = dt.datetime.now().strftime("%Y%m%dT%H%M%S")
    base = os.path.join(tempfile.gettempdir(), f"kvtier-{name}-{stamp}-{os.getpid()}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    for i in range(100):
        path = f"{base}.log" if i == 0 else f"{base}-{i}.log"
        try:
            fd = os.open(path, flags, 0o600)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"{base}.log and 99 more exist")
    from importlib.metadata import PackageNotFoundError, version

    try:
        kvtier_version = version("kvtier")
    except PackageNotFoundError:
        kvtier_version = "unknown"
    with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as f:
        f.write(f"kvtier {name}: internal error at {dt.datetime.now().astimezone().isoformat(timespec='seconds')}\n")
        f.write(f"command: kvtier {name} {shlex.join(argv)}\n")
        f.write(f"cwd: {os.getcwd()}\n")
        f.write(f"kvtier {kvtier_version}, Python {platform.python_version()}, {platform.platform()}\n\n")
        f.write("".join(traceback.format_exception(exc)))
    return path


if __name__ == "__main__":
    sys.exit(main())
