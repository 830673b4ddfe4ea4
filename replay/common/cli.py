"""What every `kvtier` subcommand answers the same way: a user's mistake, a signal (sizes: kvconnector.units).

- A mistake is one line on stderr, `kvtier SUB: what is wrong`, and exit 2 (argparse included: no page of usage).
- SIGINT and SIGTERM mean the same thing: stop, write what was measured, clean up, exit 128 + the signal's number
  (130 for Ctrl-C, 143 for SIGTERM). Outside an event loop they raise `Interrupted`, a KeyboardInterrupt that knows
  its signal, so set-up and clean-up code unwinds through its `finally` blocks (`stop_signals_raise`); inside one
  they call back into the loop (`loop_stop_signals`). Code that only notes the signal and acts on it later (an MPI
  rank between collective steps, a parent forwarding it to its clients) installs its own handler with
  `stop_signals_handled`. Each puts the previous handlers back when its block ends.
- A closed stdout (`kvtier ... | head -1`) is not an error (`closed_stdout_is_fine`): the rest of the output is
  dropped, the command carries on and writes its results files, and its exit status is its own.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import functools
import logging
import os
import platform
import shlex
import signal
import sys
import tempfile
import textwrap
import traceback
from collections.abc import Callable, Iterator
from types import FrameType
from typing import TYPE_CHECKING, Any

from kvconnector.errors import UserError

if TYPE_CHECKING:
    import asyncio

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class WholeFlagsFormatter(argparse.RawDescriptionHelpFormatter):
    """Help text wrapped at spaces only: textwrap's default breaks at hyphens too, which splits a flag named in a
    help text over two lines (`--target-hit-` / `rate`), one a reader cannot copy."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


class OneLineParser(argparse.ArgumentParser):
    """argparse that answers a bad command line with one line and a pointer to --help, not the whole usage; its help
    never splits a flag's name over two lines (WholeFlagsFormatter)."""

    def __init__(self, *args, **kwargs) -> None:
        if kwargs.get("formatter_class", argparse.HelpFormatter) in (
            argparse.HelpFormatter,
            argparse.RawDescriptionHelpFormatter,
        ):
            kwargs["formatter_class"] = WholeFlagsFormatter
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (see '{self.prog} --help')\n")


def setup_logging(prog: str, level: str = "WARNING") -> None:
    """Log records to stderr as `PROG: LEVEL message` (once per process; replay/cli.py calls it for every
    subcommand). A subcommand with a --log-level flag sets the level with `set_log_level`."""
    logging.basicConfig(level=level, format=f"{prog}: %(levelname)s %(message)s")


def set_log_level(prog: str, level: str) -> None:
    setup_logging(prog)  # a no-op under the dispatcher; this subcommand's main called by itself logs the same way
    logging.getLogger().setLevel(level)


def fail(prog: str, msg: str, code: int = 2) -> int:
    print(f"{prog}: {msg}", file=sys.stderr)
    return code


def command(name: str) -> Callable[[Callable[[list[str] | None], int]], Callable[[list[str] | None], int]]:
    """The error contract, worn by every subcommand's `main(argv) -> int`, so that `kvtier NAME`, `python -m ...` and
    a direct call answer alike (docs/errors.md):
    - a `UserError` (kvconnector/errors.py) that escapes: one line `kvtier NAME: message` on stderr, exit 2;
    - any other exception (a bug): exit 1, one line naming it and a log file in the temp directory holding the full
      traceback (`crash_log`); never a traceback on the terminal. A subcommand that measured something writes its
      partial results first and says where in a note on the exception (`exc.add_note(...)`), which the line repeats.
    """

    def wear(main: Callable[[list[str] | None], int]) -> Callable[[list[str] | None], int]:
        @functools.wraps(main)
        def contracted(argv: list[str] | None = None) -> int:
            return under_contract(name, main, argv)

        return contracted

    return wear


def under_contract(name: str, main: Callable[[list[str] | None], int], argv: list[str] | None) -> int:
    """`main(argv)` under the error contract of `command`; the exit status."""
    try:
        return int(main(argv) or 0)
    except UserError as exc:
        return fail(f"kvtier {name}", _one_line(str(exc)) or type(exc).__name__)
    except Exception as exc:  # a bug: one line here, the traceback in a file
        return _bug(name, list(sys.argv[1:] if argv is None else argv), exc)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _bug(name: str, argv: list[str], exc: BaseException) -> int:
    what = type(exc).__name__ + (f": {_one_line(str(exc))[:300]}" if str(exc).strip() else "")
    notes = "".join(f"; {_one_line(n)}" for n in getattr(exc, "__notes__", ()))
    logged = None
    try:
        logged = crash_log(name, argv, exc)
        where = f"the traceback is in {logged}"
    except OSError as err:  # no log to be had: the traceback is all there is, so it goes to stderr after the line
        where = f"no log written ({err.strerror or err}); the traceback follows"
    print(f"kvtier {name}: internal error ({what}){notes}; {where}", file=sys.stderr)
    if logged is None:
        traceback.print_exception(exc, file=sys.stderr)
    return 1


def crash_log(name: str, argv: list[str], exc: BaseException) -> str:
    """Write the traceback of `exc` (with the command line and versions) to a new file in the temp directory,
    kvtier-NAME-<time>-<pid>.log; return its path. The file is created, never opened if it exists (O_EXCL, no link
    followed), readable by its owner only (a command line may hold a URL with a secret)."""
    stamp = dt.datetime.now().strftime("%Y%m%dT%H%M%S")
    base = os.path.join(tempfile.gettempdir(), f"kvtier-{'-'.join(name.split())}-{stamp}-{os.getpid()}")
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


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived while no event loop was listening."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return exit_code(self.signum)


def exit_code(signum: int) -> int:
    return 128 + int(signum)


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


def _raise_interrupted(signum, _frame):
    raise Interrupted(signum)


@contextlib.contextmanager
def stop_signals_handled(handler: Callable[[int, FrameType | None], Any]) -> Iterator[None]:
    """Within the block SIGINT and SIGTERM call `handler(signum, frame)` (a `signal.signal` handler, so only in the
    main thread); the previous handlers come back afterwards."""
    old = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)


def stop_signals_raise() -> contextlib.AbstractContextManager[None]:
    """Within the block SIGINT and SIGTERM raise `Interrupted`; the previous handlers come back afterwards."""
    return stop_signals_handled(_raise_interrupted)


@contextlib.contextmanager
def loop_stop_signals(loop: asyncio.AbstractEventLoop, callback: Callable[[int], Any]) -> Iterator[bool]:
    """Within the block SIGINT and SIGTERM call `callback(signum)` in `loop`'s thread, between its callbacks (so the
    run can stop and still write its partial results); the previous handlers come back afterwards. Yields whether
    the handlers are installed: off the main thread (or where the loop cannot take signal handlers) they are not,
    and the signals keep whatever handling they had."""
    old = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    installed: list[int] = []
    try:
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, callback, sig)
            installed.append(sig)
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signals in this loop
        for sig in installed:
            loop.remove_signal_handler(sig)
            signal.signal(sig, old[sig])
        installed = []
    try:
        yield bool(installed)
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)  # sets SIG_DFL (or Python's SIGINT handler): the caller's come back next
            signal.signal(sig, old[sig])


class _DropAfterBrokenPipe:
    """sys.stdout, until its reader goes away: then fd 1 becomes /dev/null, so this write, every later one and the
    flush at exit succeed (Python ignores SIGPIPE, so a closed pipe is a BrokenPipeError at some write or flush)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def _drop(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self._stream.fileno())
        finally:
            os.close(devnull)

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._drop()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._drop()
            self._stream.flush()  # what was buffered goes to /dev/null now

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def closed_stdout_is_fine() -> Iterator[None]:
    """Within the block a reader that stops reading stdout (`| head`) costs the command nothing: no traceback, no
    exit status of its own, the run goes on and writes its files. Only for a real stdout (a file descriptor)."""
    stream = sys.stdout
    try:
        stream.fileno()
    except (AttributeError, OSError, ValueError):  # captured by a test, or no stdout at all
        yield
        return
    sys.stdout = _DropAfterBrokenPipe(stream)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stdout = stream
