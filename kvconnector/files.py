"""Small files written whole or not at all (results, snapshots, status files), and removals that may find nothing.

- `atomic_path`: the file is written under a temp name beside its destination and renamed into place in one step, so
  a reader sees the old file or the new one, never half of one. Its mode is 0666 under the process's umask (0644
  usually), like any file a command writes, unless the caller asks for another.
- `unlink_quietly`: remove a file that another instance, a person or a crash may already have removed.
- `sync_dir`: make the renames already done in a directory durable (fsync of the directory), one fsync shared by
  every caller that asked before it began.
Entry files are not written here: they have their own timed, fdatasync'd write path (`timed_io.write_entry`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator


def _umask() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # no /proc: read it the old way (set and restore)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode a plain `open(path, "w")` would give a new file here."""
    return 0o666 & ~_umask()


@contextlib.contextmanager
def atomic_path(
    path: str | os.PathLike, suffix: str = ".tmp", exclusive: bool = False, mode: int | None = None
) -> Iterator[str]:
    """Yield a temp path next to `path`; on success it becomes `path` in one step, on failure it is removed, so a
    reader never sees half a file. `exclusive`: never replace an existing file (FileExistsError instead).
    `mode`: the file's permission bits (default `file_mode()`)."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".kvtier-", suffix=suffix)
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, file_mode() if mode is None else mode)
        if exclusive:
            _link_new(tmp, path)
            os.unlink(tmp)
        else:
            os.replace(tmp, path)
    except BaseException:
        unlink_quietly(tmp)
        raise


def _link_new(tmp: str, path: str) -> None:
    """Give `tmp` the name `path` only if no file has it (a hard link fails on an existing name, a rename would not)."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP):
            raise
        # A filesystem without hard links: create the name exclusively and copy into it.
        with open(tmp, "rb") as src, open(path, "xb") as dst:
            shutil.copyfileobj(src, dst)
        os.chmod(path, os.stat(tmp).st_mode & 0o777)


def unlink_quietly(path: str | os.PathLike) -> None:
    """Remove `path`; a file already gone (or that cannot be removed) is not an error for the caller."""
    with contextlib.suppress(OSError):
        os.unlink(path)


# Filesystems that cannot fsync a directory (some FUSE ones) answer these: their renames are as durable as they get.
_DIR_FSYNC_UNSUPPORTED = (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP)


class _Round:
    """One directory fsync: every caller that joined it before it began waits for it and gets its error."""

    __slots__ = ("done", "error")

    def __init__(self) -> None:
        self.done = False
        self.error: OSError | None = None


class DirSyncer:
    """Group commit of one directory's renames. A rename is durable only once its directory is fsynced; a caller joins
    the next fsync that has not begun yet and returns when it has finished. One caller at a time runs an fsync (the
    leader) for everyone who joined it; callers arriving meanwhile join the following one, so N concurrent writers cost
    about two directory fsyncs, not N."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._cond = threading.Condition()
        self._next = _Round()  # the fsync that new callers join; it begins when a leader takes it
        self._leading = False

    def sync(self) -> None:
        """Return once every rename this thread did in the directory before the call is durable. Raises the OSError
        of the fsync that was to cover them."""
        with self._cond:
            mine = self._next
            while not mine.done:
                if self._leading:  # an earlier fsync is running: it may have begun before this thread's rename
                    self._cond.wait()
                    continue
                # No fsync running and mine not done: mine has not begun, so this thread runs it.
                self._leading = True
                self._next = _Round()
                self._cond.release()
                try:
                    _fsync_dir(self.directory)
                except OSError as exc:
                    mine.error = exc
                finally:
                    self._cond.acquire()
                    self._leading = False
                    mine.done = True
                    self._cond.notify_all()
            if mine.error is not None:
                raise mine.error


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in _DIR_FSYNC_UNSUPPORTED:
            raise
    finally:
        os.close(fd)


_syncers: dict[str, DirSyncer] = {}
_syncers_lock = threading.Lock()


def dir_syncer(directory: str) -> DirSyncer:
    """The one DirSyncer of `directory` in this process (so every writer of the directory shares its fsyncs)."""
    with _syncers_lock:
        syncer = _syncers.get(directory)
        if syncer is None:
            syncer = _syncers[directory] = DirSyncer(directory)
        return syncer


def sync_dir(directory: str) -> None:
    """Make the renames this thread did in `directory` durable (see DirSyncer)."""
    dir_syncer(directory).sync()


def _forget_syncers() -> None:
    # A forked child may inherit a lock or a leader that no thread of its own will release.
    global _syncers, _syncers_lock
    _syncers, _syncers_lock = {}, threading.Lock()


os.register_at_fork(after_in_child=_forget_syncers)
