"""Nothing a run makes outside its outputs outlives it, even when it is killed (SIGKILL included).

- Children die with their parent: `die_with_parent(sig)` is a Popen `preexec_fn` that asks the kernel
  (prctl(PR_SET_PDEATHSIG), Linux) to send `sig` to the child when the parent dies, however it dies. SIGTERM lets a
  child clean up as it does on Ctrl-C (a bench client removes its cache; throttlefs unmounts).
- A directory a run makes for itself names its owner: `OwnedDir` makes it (mkdtemp) with a lock file in it
  (`.kvtier-owner`) that the run holds locked (flock) while it lives. The kernel drops the lock when the process
  dies, so a held lock means a live owner, and pid reuse cannot fool it. A tier directory's marker (`.kvtier-tier`)
  is held the same way by the process using the tier (kvconnector/persistence.py), so a bench run's cache directory
  names its owner too. `remove_dead(base, prefix)` removes the directories of one prefix under `base` whose owner
  is dead; the next run on the same base calls it and says what it removed in one line. Only a directory holding
  one of those two files, which kvtier writes into a directory it has just made, is removed (a user's never is); an
  empty one of our prefix is removed once it is old enough not to be another run's in its first moment.
- `watchdog(...)`: for what no signal reaches (a FUSE mount whose server was killed too, servers started as daemons):
  a process in a session of its own (a kill of the run's process group spares it) that waits until every holder of a
  pipe's write end is gone (the run, and whoever it passed the end to), then unmounts, runs the commands and removes
  the directories it was given. The run closes its end once it has cleaned up itself; the watchdog then finds
  nothing left to do.
- `made_dirs(path)`: the directories a `makedirs(path)` would create, so a run removes them (when empty) at its end.
- `disk_temp_dir()`: where a run's own scratch directories go when the user named none: $TMPDIR when set (the user's
  choice, as for mktemp), else /var/tmp, disk-backed on most systems where /tmp may be tmpfs (a disk tier on tmpfs
  measures memory), else the temp dir Python would use.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

from kvconnector.entry_format import MARKER_NAME

OWNER_NAME = ".kvtier-owner"
# A directory its run was asked to keep (bench --keep-cache): never removed as a dead run's leftovers.
KEPT_NAME = ".kvtier-kept"
_PROOFS = (OWNER_NAME, MARKER_NAME)
# An empty directory of our prefix younger than this may be another run's between its mkdtemp and its lock file.
EMPTY_GRACE_S = 60.0
_PR_SET_PDEATHSIG = 1


def disk_temp_dir() -> str:
    """$TMPDIR when set and writable, else /var/tmp when writable (disk-backed on most systems, where /tmp may be
    tmpfs), else tempfile's choice. Read at each call: tempfile caches its choice for the process."""
    for d in (os.environ.get("TMPDIR"), "/var/tmp"):
        if d and os.path.isdir(d) and os.access(d, os.W_OK):
            return d
    return tempfile.gettempdir()


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None]:
    """A Popen preexec_fn: the child gets `sig` when this process dies (also if it died before the child's prctl:
    then the child's parent is already someone else, and it sends `sig` to itself)."""
    parent = os.getpid()
    libc = ctypes.CDLL(None, use_errno=True)  # loaded here, in the parent: the child between fork and exec only calls
    prctl = libc.prctl

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), sig)

    return preexec


class OwnedDir:
    """A new directory under `base` (default: the temp directory) named `prefix*`, holding `.kvtier-owner` locked by
    this process until `remove()` (or its death). The lock file is not inherited by children (close-on-exec)."""

    def __init__(self, prefix: str, base: str | None = None) -> None:
        self.path = tempfile.mkdtemp(prefix=prefix, dir=base)
        self._fd: int | None = None
        try:
            fd = os.open(
                os.path.join(self.path, OWNER_NAME), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600
            )
            self._fd = fd
            with contextlib.suppress(OSError):  # a filesystem without flock: the directory cannot name its owner
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.write(fd, f"{os.getpid()}\n".encode())
        except BaseException:
            self.remove()
            raise

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> OwnedDir:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


# Reads its stdin until EOF (every write end closed), then: unmount argv[1] if it is a mount point (a mount that would
# not go keeps the directories: removing through it would reach the backing files), run each JSON-encoded command,
# remove the directories.
_WATCHDOG = """
import json, shutil, subprocess, sys
while sys.stdin.buffer.read(65536):
    pass
mnt, commands, dirs = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3:]
def mounted():
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4].encode().decode("unicode_escape") == mnt for line in f)
if mnt and mounted():
    subprocess.run(["fusermount3", "-u", "-z", mnt], capture_output=True)
for argv in commands:
    try:
        subprocess.run(argv, capture_output=True, timeout=300)
    except (OSError, subprocess.SubprocessError):
        pass
if not (mnt and mounted()):
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
"""


def watchdog(*, unmount: str | None = None, run: list[list[str]] = (), remove: list[str] = ()) -> int:
    """Start a watchdog (see the module doc); returns the write end of its pipe, to keep open (and to pass to the
    children whose death it must also wait for) until the caller has cleaned up."""
    r, w = os.pipe()
    try:
        subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, os.path.abspath(unmount) if unmount else "", json.dumps(list(run))]
            + [os.path.abspath(d) for d in remove],
            stdin=r,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except BaseException:
        os.close(w)
        raise
    finally:
        os.close(r)
    return w


def remove_dead(base: str, prefix: str) -> tuple[int, int]:
    """Remove the `prefix*` directories directly under `base` whose owner is dead (see the module doc). Returns
    (directories removed, bytes they held)."""
    dirs = nbytes = 0
    try:
        it = os.scandir(base)
    except OSError:
        return 0, 0
    with it:
        candidates = [de.path for de in it if de.name.startswith(prefix) and de.is_dir(follow_symlinks=False)]
    for path in candidates:
        if os.path.lexists(os.path.join(path, KEPT_NAME)):
            continue
        proof = next((p for p in (os.path.join(path, n) for n in _PROOFS) if _regular(p)), None)
        if proof is None:
            with contextlib.suppress(OSError):
                if time.time() - os.lstat(path).st_mtime > EMPTY_GRACE_S:
                    os.rmdir(path)  # only ever an empty one
                    dirs += 1
            continue
        try:
            fd = os.open(proof, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # held: its owner lives (or no flock here: cannot tell, so left)
                continue
            size = _disk_bytes(path)
            shutil.rmtree(path, ignore_errors=True)
            if not os.path.lexists(path):
                dirs += 1
                nbytes += size
        finally:
            os.close(fd)
    return dirs, nbytes


def keep(path: str) -> None:
    """Mark a run's directory as one to keep (see KEPT_NAME)."""
    with open(os.path.join(path, KEPT_NAME), "w") as fh:
        fh.write("kept on request (--keep-cache); remove the directory when done with it\n")


def _regular(path: str) -> bool:
    try:
        return os.lstat(path).st_mode & 0o170000 == 0o100000
    except OSError:
        return False


def _disk_bytes(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for n in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, n)).st_blocks * 512
    return total


def made_dirs(path: str) -> list[str]:
    """The directories `os.makedirs(path)` would create (deepest first): the missing part of the path."""
    out = []
    path = os.path.abspath(path)
    while not os.path.lexists(path):
        out.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return out


def remove_empty(dirs: list[str]) -> None:
    """Remove the directories (deepest first) that are empty; one holding anything is left, with its parents. One
    already gone is passed over (a second call, once what kept a parent busy has gone, removes the parent)."""
    for d in dirs:
        try:
            os.rmdir(d)
        except FileNotFoundError:
            continue
        except OSError:
            return
