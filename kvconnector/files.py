"""Small files written whole or not at all (results, snapshots, status files), and removals that may find nothing.

- `atomic_path`: the file is written under a temp name beside its destination and renamed into place in one step, so
  a reader sees the old file or the new one, never half of one. Its mode is 0666 under the process's umask (0644
  usually), like any file a command writes, unless the caller asks for another.
- `unlink_quietly`: remove a file that another instance, a person or a crash may already have removed.
Entry files are not written here: they have their own timed, fdatasync'd write path (`timed_io.write_entry`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
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
