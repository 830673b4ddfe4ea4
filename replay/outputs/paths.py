"""Where results go, checked before a run and written so that finished work is never lost.

The rules, for every command and every output file:
- Each output path is checked before the run starts (`check_file`, `check_dir`): a directory given for a file, a
  device or FIFO, a parent that cannot be created or written, are one-line errors, and nothing is created yet.
- A file is written whole or not at all: a temp file beside it, then one rename (`atomic_path`, from
  kvconnector.files, re-exported here). Results are not secrets: files get 0644 under the user's umask, like any file
  a command writes.
- A default name (`default_results_path`) never replaces an existing file: the name is taken with an exclusive link,
  and a `-2`, `-3`, ... suffix is added when two runs pick the same second.
- If the requested path can no longer be written when the run ends (disk full, directory removed), the results go
  next to the default location instead (`write_results`), and the caller says where.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
import time
from collections.abc import Callable, Iterator

from kvconnector.errors import ConfigError
from kvconnector.files import atomic_path

RESULTS_DIR = "results"


def _nearest_existing(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.lexists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def _probe_dir(directory: str, what: str) -> None:
    """Can files be created under `directory` (it, or the nearest of its ancestors that exists)? Leaves nothing."""
    base = _nearest_existing(directory)
    if not os.path.isdir(base):
        raise ConfigError(f"{what}: {base} is not a directory")
    try:
        fd, probe = tempfile.mkstemp(dir=base, prefix=".kvtier-probe-")
    except OSError as exc:
        raise ConfigError(f"{what}: cannot create files under {base} ({os_reason(exc)})") from exc
    os.close(fd)
    os.unlink(probe)


def os_reason(exc: OSError) -> str:
    """An OSError's reason in a user's words; ENOENT on a directory that exists means it takes no new files."""
    if exc.errno == errno.ENOENT and exc.filename and os.path.isdir(os.path.dirname(exc.filename) or "."):
        return "the filesystem there does not accept new files"
    if exc.errno in (errno.EEXIST, errno.ENOTDIR):  # from makedirs: a part of the path is a file
        return "a part of the path is not a directory"
    return exc.strerror or str(exc)


def check_file(path: str, what: str) -> None:
    """`path` can take an output file: it is a regular file or absent, and its directory can be written."""
    if not path or path.endswith(os.sep):
        raise ConfigError(f"{what} {path!r}: give a file name")
    if os.path.lexists(path):
        st = os.stat(path)
        if stat.S_ISDIR(st.st_mode):
            raise ConfigError(f"{what} {path}: is a directory; give a file name")
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{what} {path}: is not a regular file")
    _probe_dir(os.path.dirname(os.path.abspath(path)), what)


def check_dir(path: str, what: str) -> None:
    """`path` can take output files: it is a directory (or can be made one) that can be written."""
    if os.path.lexists(path) and not os.path.isdir(path):
        raise ConfigError(f"{what} {path}: exists and is not a directory")
    _probe_dir(path, what)


def check_outputs(files: dict[str, str | None], dirs: dict[str, str | None] | None = None) -> None:
    """Check every given output ({flag: path}); raise ConfigError naming the first that cannot be written."""
    for what, path in files.items():
        if path:
            check_file(path, what)
    for what, path in (dirs or {}).items():
        if path:
            check_dir(path, what)


def _candidates(path: str) -> Iterator[str]:
    stem, ext = os.path.splitext(path)
    yield path
    for i in range(2, 10_000):
        yield f"{stem}-{i}{ext}"


def free_name(path: str) -> str:
    """`path`, or the first of path-2, path-3 ... that does not exist yet (a hint: `atomic_path(exclusive=True)`
    is the guarantee)."""
    return next(p for p in _candidates(path) if not os.path.lexists(p))


def default_results_path(suffix: str = ".json") -> str:
    """results/<YYYYmmdd-HHMMSS>.json, or with -2, -3 ... when a run of the same second has it."""
    return free_name(os.path.join(RESULTS_DIR, time.strftime("%Y%m%d-%H%M%S") + suffix))


def _write_json_to(path: str, doc: dict, exclusive: bool) -> None:
    with atomic_path(path, suffix=".json.tmp", exclusive=exclusive) as tmp, open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2, default=str)
        f.write("\n")


def write_results(
    path: str, doc: dict, *, is_default: bool = False, write: Callable[[str, dict, bool], None] = _write_json_to
) -> tuple[str, str | None]:
    """Write the results document; return (path written, error with the requested path or None).

    A default path never replaces a file (a run of the same second gets the next free name). When the requested
    path fails, the document goes to a fresh default name under results/, then under the temp directory."""
    fallbacks = [
        os.path.join(RESULTS_DIR, os.path.basename(path)),
        os.path.join(tempfile.gettempdir(), "kvtier-results", os.path.basename(path)),
    ]
    first_error = None
    for i, candidate in enumerate([path, *fallbacks]):
        exclusive = is_default or i > 0
        for name in _candidates(candidate) if exclusive else [candidate]:
            try:
                write(name, doc, exclusive)
                return name, first_error
            except FileExistsError as exc:
                if exclusive and os.path.lexists(name):  # the name is taken: try the next one
                    continue
                first_error = first_error or f"cannot write {path}: {os_reason(exc)}"
                break
            except OSError as exc:
                first_error = first_error or f"cannot write {path}: {os_reason(exc)}"
                break
    raise OSError(first_error or f"cannot write {path}")
