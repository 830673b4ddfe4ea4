"""What `kvtier mlperf run` shows while it runs: one bar over every trial of the sequence, the Option and trial
under way, the inter-option wait; a line per finished trial. Off (`--no-progress`, or stdout not a terminal) it
prints the lines only."""

from __future__ import annotations

from ..outputs.terminal import console


class RunView:
    def __init__(self, plan, live: bool = True):
        self.plan = plan
        self.console = console()
        self.total = len(plan.options) * plan.trials
        self.progress = None
        if live and self.console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.progress = Progress(
                TextColumn("{task.description}", markup=False),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=self.console,
            )
            self.task = self.progress.add_task("starting", total=self.total)
            self.progress.start()

    def _say(self, text: str) -> None:
        self.console.print(text)

    def trial(self, option: int, trial: int) -> None:
        flags = dict(zip(self.plan.option_flags[option][::2], self.plan.option_flags[option][1::2]))
        what = (
            f"Option {option} trial {trial + 1}/{self.plan.trials}: {self.plan.total_ranks} ranks x"
            f" {flags['--num-users']} users, {flags['--duration']} s"
        )
        if self.progress:
            self.progress.update(self.task, description=what)
        else:
            self._say(what)

    def waiting(self, option: int, seconds: float) -> None:
        what = f"waiting {seconds:g} s before Option {option} (inter-option delay)"
        if self.progress:
            self.progress.update(self.task, description=what)
        else:
            self._say(what)

    def done(self, option: int, trial: int, rc: int) -> None:
        self._say(f"Option {option} trial {trial + 1}/{self.plan.trials}: mpirun exited {rc}")
        if self.progress:
            self.progress.advance(self.task)

    def close(self) -> None:
        if self.progress:
            self.progress.stop()
