"""Started by mpirun: what every MPI job of kvtier does the same way (`kvtier bench`: replay/synthetic/mpi_run.py,
`kvtier replay`: replay/openai/mpi_run.py).

- `world_size`: no flag is needed; a process started by mpirun (OMPI_COMM_WORLD_SIZE, or PMI_SIZE for MPICH/Hydra
  and Intel MPI) or by Slurm's srun (SLURM_STEP_NUM_TASKS), above 1, is one rank of a job.
- `launch_problem`: srun without a PMI plugin, found before MPI starts (MPI_Init would abort with a page of text).
- `split`: rank i's share of a total (the first ranks take one more when it does not divide).
- `Peers`: the other ranks' messages during the window, received by a thread, so that a rank that ends other than
  completed stops the others, and no message is left in flight when the ranks gather their results.
- `first_error`: the verdict of an allgather of errors, told once by rank 0.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Iterator

from .common.cli import stop_signals_handled

# The launcher's environment for its processes: Open MPI's mpirun, the PMI of MPICH/Hydra and Intel MPI, then Slurm's
# srun (a job step's task count and task index; a batch script itself has no SLURM_STEP_NUM_TASKS, so it is no rank).
SIZE_ENV = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS")
RANK_ENV = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")

TAG_STATUS, TAG_DONE = 11, 12
STATUS_EVERY_S = 1.0  # live figures from each rank to rank 0


def env_int(names: tuple[str, ...], default: int) -> int:
    for name in names:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return default


def world_size() -> int:
    """The number of MPI processes this one was started among (1 when not started by mpirun)."""
    return env_int(SIZE_ENV, 1)


def launch_problem() -> str | None:
    """Why MPI cannot start in this process, said before it tries (MPI_Init aborts with a page of text): Slurm's srun
    started it as one of several tasks without a PMI plugin to tell MPI so (srun --mpi=none, no MpiDefault)."""
    if "SLURM_STEP_NUM_TASKS" not in os.environ or world_size() <= 1:
        return None
    if any(v in os.environ for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_FD")):
        return None
    return (
        f"started by srun as one of {world_size()} tasks without a PMI plugin: run srun --mpi=pmix (or set "
        "MpiDefault=pmix in slurm.conf), or mpirun inside the allocation"
    )


def split(total: int, n: int, i: int) -> int:
    return total // n + (1 if i < total % n else 0)


class Peers:
    """The other ranks' messages during the window, received by a thread: live figures (rank 0 keeps the latest of
    each rank) and one DONE per rank when its window ends; a DONE other than `completed` asks this rank to stop."""

    def __init__(self, comm, mpi) -> None:
        self.comm, self.mpi = comm, mpi
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.snaps: dict[int, dict] = {}
        self.stop_reason: str | None = None
        self._done = 0
        self._sends: list = []
        self._last_status = -math.inf
        self._thread = threading.Thread(target=self._watch, name="kvtier-mpi-peers", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _watch(self) -> None:
        st = self.mpi.Status()
        while self._done < self.size - 1:
            if not self.comm.Iprobe(source=self.mpi.ANY_SOURCE, tag=self.mpi.ANY_TAG, status=st):
                time.sleep(0.02)
                continue
            src, tag = st.Get_source(), st.Get_tag()
            msg = self.comm.recv(source=src, tag=tag)
            if tag == TAG_STATUS:
                self.snaps[src] = msg
                continue
            self._done += 1
            if msg["status"] != "completed" and self.stop_reason is None:
                why = f": {msg['error']}" if msg.get("error") else ""
                self.stop_reason = f"rank {src} {msg['status']}{why}"

    def send_status(self, snap: dict) -> None:
        """Called on the event loop's thread at each sample; at most one message a second, to rank 0 only."""
        now = time.monotonic()
        if self.rank == 0 or now - self._last_status < STATUS_EVERY_S:
            return
        self._last_status = now
        self._sends = [r for r in self._sends if not r.Test()]
        self._sends.append(self.comm.isend(snap, dest=0, tag=TAG_STATUS))

    def send_done(self, status: str, error: str | None) -> None:
        msg = {"status": status, "error": error}
        self._sends += [self.comm.isend(msg, dest=r, tag=TAG_DONE) for r in range(self.size) if r != self.rank]

    def finish(self) -> None:
        """Wait for every other rank's DONE and for this rank's messages to be delivered."""
        self._thread.join()
        self.mpi.Request.Waitall(self._sends)
        self._sends = []


def first_error(errors: list) -> tuple[int, str] | None:
    """The first rank's error as (exit code, line); the rank is named unless every rank failed the same way."""
    failed = [(r, err) for r, err in enumerate(errors) if err is not None]
    if not failed:
        return None
    r, (code, msg) = failed[0]
    same_everywhere = len(failed) == len(errors) and all(err[1] == msg for _, err in failed)
    return code, msg if same_everywhere else f"rank {r}: {msg}"


@contextlib.contextmanager
def recorded_stop_signals() -> Iterator[list[int]]:
    """While the block runs, SIGINT/SIGTERM are only recorded (a rank acts on them between its collective steps, so it
    never leaves the others waiting in one): yields the list of the signals received. An event loop run inside the
    block hears them itself (common.cli.loop_stop_signals) and puts this recording back when it ends."""
    received: list[int] = []
    with stop_signals_handled(lambda signum, _frame: received.append(signum)):
        yield received
