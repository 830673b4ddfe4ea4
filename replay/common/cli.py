"""What every `kvtier` subcommand answers the same way: a user's mistake, a signal (sizes: kvconnector.units).

- A mistake is one line on stderr, `kvtier SUB: what is wrong`, and exit 2 (argparse included: no page of usage).
- SIGINT and SIGTERM mean the same thing: stop, write what was measured, clean up, exit 128 + the signal's number
  (130 for Ctrl-C, 143 for SIGTERM). Outside an event loop they raise `Interrupted`, a KeyboardInterrupt that knows
  its signal, so set-up and clean-up code unwinds through its `finally` blocks.
- A closed stdout (`kvtier ... | head -1`) is not an error (`closed_stdout_is_fine`): the rest of the output is
  dropped, the command carries on and writes its results files, and its exit status is its own.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Iterator
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class OneLineParser(argparse.ArgumentParser):
    """argparse that answers a bad command line with one line and a pointer to --help, not the whole usage."""

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
def stop_signals_raise() -> Iterator[None]:
    """Within the block SIGINT and SIGTERM raise `Interrupted`; the previous handlers come back afterwards."""
    old = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig in STOP_SIGNALS:
        signal.signal(sig, _raise_interrupted)
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


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
