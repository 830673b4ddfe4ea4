"""What a person watches while a run goes, for both drivers: on stderr (stdout is for the results), drawn by rich only
when stderr is a terminal and the user did not turn it off; rich is imported only then.

- `LiveLine`: one status line rewritten in place (`kvtier bench`'s live view, `kvtier replay`'s sent/done line). Off a
  terminal it is silent, or prints a plain line every `plain_every_s` seconds when asked to (a log keeps a trace).
- `StepBars`: one progress bar per named step, drawn from the first update and gone when the block ends
  (`kvtier bench`'s set-up: preconditioning, RAG ingest, pre-population).

Both are context managers; updates outside the block, or while off, do nothing beyond the plain line.
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any

REFRESH_PER_SECOND = 4


def stderr_console() -> Any:
    from .terminal import console

    return console(stderr=True)


def stderr_is_terminal() -> bool:
    """Whether a live display would be drawn (rich's own test of the terminal, so FORCE_TERMINAL and the like count)."""
    return stderr_console().is_terminal


class LiveLine:
    """One status line on stderr, rewritten in place while the block runs. `transient`: the line is erased at the end
    (else the last one stays). Off a terminal nothing is drawn; with `plain_every_s` a plain line is printed that
    often instead."""

    def __init__(self, enabled: bool = True, *, transient: bool = False, plain_every_s: float | None = None) -> None:
        self.enabled = enabled
        self.transient = transient
        self.plain_every_s = plain_every_s
        self._live: Any = None
        self._last_plain = -math.inf  # the first line always prints: monotonic() may start near 0 at boot

    def __enter__(self) -> LiveLine:
        if not self.enabled:
            return self
        console = stderr_console()
        if console.is_terminal:
            from rich.live import Live
            from rich.text import Text

            self._live = Live(
                Text("starting..."), console=console, refresh_per_second=REFRESH_PER_SECOND, transient=self.transient
            )
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)
            self._live = None

    @property
    def drawn(self) -> bool:
        """Whether the line is drawn in place (a terminal), not printed now and then."""
        return self._live is not None

    def show(self, line: str) -> None:
        if self._live is not None:
            from rich.text import Text

            self._live.update(Text(line))
            return
        if not self.enabled or self.plain_every_s is None:
            return
        now = time.monotonic()
        if now - self._last_plain >= self.plain_every_s:
            self._last_plain = now
            print(line, file=sys.stderr, flush=True)


class StepBars:
    """A progress bar per named step (description, bar, percentage, time left) on stderr, erased when the block ends;
    drawn from the first `update`, so steps that never report cost nothing."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._progress: Any = None
        self._tasks: dict[str, Any] = {}

    def __enter__(self) -> StepBars:
        return self

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)
            self._progress = None

    def update(self, step: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self._progress is None:
            console = stderr_console()
            if not console.is_terminal:  # nothing would be drawn: no more asking
                self.enabled = False
                return
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            self._progress = Progress(
                TextColumn("{task.description}", markup=False),
                BarColumn(),
                TextColumn("{task.percentage:>3.0f}%", markup=False),
                TimeRemainingColumn(),
                console=console,
                refresh_per_second=REFRESH_PER_SECOND,
                transient=True,
            )
            self._progress.__enter__()
        if step not in self._tasks:
            self._tasks[step] = self._progress.add_task(step, total=total)
        self._progress.update(self._tasks[step], completed=done)
