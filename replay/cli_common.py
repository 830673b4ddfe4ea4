"""What every `kvtier` subcommand answers the same way: a user's mistake, a signal (sizes: kvconnector.units).

- A mistake is one line on stderr, `kvtier SUB: what is wrong`, and exit 2 (argparse included: no page of usage).
- SIGINT and SIGTERM mean the same thing: stop, write what was measured, clean up, exit 128 + the signal's number
  (130 for Ctrl-C, 143 for SIGTERM). Outside an event loop they raise `Interrupted`, a KeyboardInterrupt that knows
  its signal, so set-up and clean-up code unwinds through its `finally` blocks.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from collections.abc import Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class OneLineParser(argparse.ArgumentParser):
    """argparse that answers a bad command line with one line and a pointer to --help, not the whole usage."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (see '{self.prog} --help')\n")


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
