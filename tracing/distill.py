"""`kvtier distill`: distil a storage_latency_stack trace into a fio job that replays its I/O.

    kvtier distill -i TRACE [--process NAME] [--window-s S] -o job.fio
    python -m tracing.distill ...      (the same, where only tracing/ is copied)

The command: flags, reading the trace, writing the outputs, errors. The
trace becomes a job model in tracing/distiller.py (which says what comes
from where) and the model a .fio file in tracing/fio_job.py; their names are
re-exported here.

Bad input (tracing/README.md has the table): a user's mistake
(bad flag or value, a file that is not a trace, an output that cannot be
written) is one line on stderr naming the command and exit status 2. A
truncated trace (see histparse: END line, end marker, a histogram or line
cut off) is refused the same way, since the job would silently lack what
was cut; ``--allow-truncated`` distils what is there, with a warning line
and the cuts in the job's comments. Every value written into the job is
checked against fio's syntax and a plausible range, and comments carry no
control characters: nothing from the trace or the command line can add a
line (an option such as exec_prerun) to the job.

Standard library only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from .distiller import (
    LOST_WARN_SHARE,
    MAX_WINDOW_S,
    Distilled,
    DistillError,
    distill,
    lost_completions,
    parse_fio_size,
    size_split,
)
from .fio_job import one_line, render_job, validate_job
from .histparse import TraceParseError, parse_trace, read_trace

__all__ = [
    "LOST_WARN_SHARE",
    "DistillError",
    "Distilled",
    "distill",
    "lost_completions",
    "main",
    "parse_fio_size",
    "render_job",
    "size_split",
    "validate_job",
    "whole_file",
    "write_whole",
]


def _seconds(kind):
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a {'whole ' if kind is int else ''}number of seconds"
            ) from None
        if not 0 < v <= MAX_WINDOW_S:  # NaN and inf fail this too
            raise argparse.ArgumentTypeError(f"{text!r}: seconds over 0 and at most {MAX_WINDOW_S} (a year)")
        return v

    return parse


def _fio_size_arg(text: str) -> str:
    try:
        return parse_fio_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class _ArgError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, no usage dump
        raise _ArgError(message)


def _parser(prog: str) -> argparse.ArgumentParser:
    p = _Parser(
        prog=prog,
        description="Turn a storage_latency_stack trace (bpftrace text or JSON) into a fio job.",
        epilog="bad input: a user's mistake (bad flag or value, a file that is not a trace, an output\n"
        "that cannot be written) is one line on stderr and exit status 2, nothing written;\n"
        "so is a truncated trace (END line, end marker, a histogram or a line cut off),\n"
        "unless --allow-truncated. Every value in the job is checked (fio syntax, range).\n"
        "Outputs are written only once the job is made. As `kvtier distill`, SIGINT/SIGTERM\n"
        "answer one line and exit 130/143.\n\n"
        "examples:\n"
        "  %(prog)s -i out/trace.txt -o job.fio\n"
        "  %(prog)s -i trace.json --process vllm -o vllm.fio\n"
        "  TARGET=/mnt/nvme/fio.dat fio job.fio",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-i", "--input", required=True, help="trace file (text or -f json output)")
    p.add_argument("-o", "--output", help="fio job to write (default: stdout)")
    p.add_argument("--process", help="name for the fio job section (the trace is already filtered at capture)")
    p.add_argument("--window-s", type=_seconds(float), help="capture window in seconds, for traces cut before END")
    p.add_argument("--runtime-s", type=_seconds(int), help="fio runtime (default: the capture window)")
    p.add_argument(
        "--size", type=_fio_size_arg, help="fio size=: 64m, 1.5g, 50%% (default: the traced LBA footprint, at least 1g)"
    )
    p.add_argument(
        "--allow-truncated",
        action="store_true",
        help="distil a truncated trace (cut before its end) from what it has, with a warning",
    )
    p.add_argument(
        "--allow-lossy",
        action="store_true",
        help="distil a trace that lost over half its block events (see missed_events), with a note",
    )
    p.add_argument("--dump-json", metavar="FILE", help="also write the parsed histograms as JSON")
    p.add_argument("--no-validate", action="store_true", help="skip fio --parse-only")
    return p


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _same_path(a: str, b: str) -> bool:
    """One file, existing or not: through a symlink, `./`, `..` or a hard link."""
    return _same_file(a, b) or os.path.realpath(a) == os.path.realpath(b)


def _check_writable(path: str) -> None:
    """Before any work, so one bad output path does not leave the other written."""
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise DistillError(f"cannot write {path}: Is a directory")
    if not os.path.isdir(parent):
        raise DistillError(f"cannot write {path}: No such directory {parent}")
    if not os.access(path if os.path.exists(path) else parent, os.W_OK):
        raise DistillError(f"cannot write {path}: Permission denied")


@contextlib.contextmanager
def whole_file(path: str | os.PathLike, suffix: str = ".tmp") -> Iterator[str]:
    """Yield a temp path beside `path`; once the caller has written it, one rename makes it `path` (mode from the
    umask, as a plain open would give), so a job or plot being read, or a run cut short, never leaves half a file. On
    failure the temp file is removed and the user's previous file stays as it was. tracing/ imports nothing from the
    rest of kvtier (it runs under sudo from a bare checkout), hence its own copy of this small helper."""
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=".kvtier-", suffix=suffix, dir=os.path.dirname(os.path.abspath(path)))
        os.close(fd)
        yield tmp
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except OSError as exc:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise DistillError(f"cannot write {path}: {exc.strerror or exc}") from exc
    except BaseException:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise


def write_whole(path: str | os.PathLike, text: str) -> None:
    """`text` into `path`, whole or not at all (see whole_file)."""
    with whole_file(path) as tmp, open(tmp, "w") as f:
        f.write(text)


def main(argv: list[str] | None = None, prog: str = "kvtier distill") -> int:
    """``kvtier distill`` (replay/cli.py calls main(rest)); ``python -m
    tracing.distill`` passes the command line it was started with as prog."""
    parser = _parser(prog)
    try:
        args = parser.parse_args(argv)
    except _ArgError as exc:
        print(one_line(f"{prog}: {exc} (see '{prog} --help')"), file=sys.stderr)
        return 2
    try:
        path = args.input
        for out in (args.output, args.dump_json):
            if out and _same_file(out, path):
                raise DistillError(f"{out} is the input trace: refusing to overwrite it")
        if args.output and args.dump_json and _same_path(args.output, args.dump_json):
            raise DistillError("-o and --dump-json name the same file")
        for out in (args.output, args.dump_json):
            if out:
                _check_writable(out)
        try:
            tr = parse_trace(read_trace(path))
        except OSError as exc:
            raise DistillError(f"cannot read {path}: {exc.strerror or exc}") from exc
        except TraceParseError as exc:
            raise DistillError(f"{path}: {exc}") from exc
        cuts = "; ".join(tr.cuts[:3])
        if tr.truncated and not args.allow_truncated:
            raise DistillError(
                f"{path} is truncated ({cuts}): its job would silently lack what was cut; "
                "--allow-truncated distils what is there"
            )
        # said once the job is made, so a failure after it stays one line
        warn = f"{prog}: warning: {path} is truncated ({cuts}): distilled what is there" if tr.truncated else ""
        job = None
        if args.output or not args.dump_json:
            try:
                d = distill(
                    tr,
                    process=args.process,
                    window_s=args.window_s,
                    runtime_s=args.runtime_s,
                    size=args.size,
                    allow_truncated=args.allow_truncated,
                    allow_lossy=args.allow_lossy,
                )
            except DistillError as exc:
                raise DistillError(f"{path}: {exc}") from exc
            job = render_job(d, source=str(path), tr=tr)
            if not args.no_validate:
                err = validate_job(job)
                if err:
                    raise DistillError(f"fio rejects the generated job: {err}")
        # written only once everything is made: a refused trace leaves no file
        if args.dump_json:
            write_whole(args.dump_json, json.dumps(tr.to_json(), indent=1) + "\n")
        if job is not None:
            if args.output:
                write_whole(args.output, job)
            else:
                sys.stdout.write(job)
        if warn:
            print(one_line(warn), file=sys.stderr)
    except DistillError as exc:
        print(one_line(f"{prog}: {exc}"), file=sys.stderr)
        return 2
    return 0


def _module_prog() -> str:
    """What the user typed to start this module: "python3 -m tracing.distill"."""
    exe = os.path.basename(getattr(sys, "orig_argv", [sys.executable])[0] or "python")
    return f"{exe} -m tracing.distill"


if __name__ == "__main__":
    sys.exit(main(prog=_module_prog()))
