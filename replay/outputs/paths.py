"""Where results go, checked before a run and written so that finished work is never lost.

The rules, for every command and every output file:
- Each output path is checked before the run starts (`check_file`, `check_dir`): a directory given for a file, a
  device or FIFO, a parent that cannot be created or written, are one-line errors, and nothing is created yet.
  A missing parent is made when the output is claimed or written, but only below an existing directory other than
  the filesystem's root (`check_new_dirs`): /nonexistent/dir/x.csv is refused, never makes /nonexistent.
- A file is written whole or not at all: a temp file beside it, then one rename (`atomic_path`, from
  kvconnector.files, re-exported here). Results are not secrets: files get 0644 under the user's umask, like any file
  a command writes.
- `claim_outputs` is the one check a command makes with all its outputs before it runs: each path checked as
  above, every output distinct from the others and from the inputs (after resolving: a symlink, `./x` or a hard link
  to the same file counts as the same), none existing unless the command replaces files it is given (`replace`), and
  each claimed: a lock (`flock`) on `.<name>.kvtier-claim` beside it, held until the command ends, so a second
  command writing the same path at the same time gets one clear error instead of replacing the first's file. The
  kernel drops the lock of a killed process; the next command claiming in that directory removes its claim files.
- A default name (`default_results_path`) never replaces an existing file: the name is taken with an exclusive link,
  and a `-2`, `-3`, ... suffix is added when two runs pick the same second.
- If the requested path can no longer be written when the run ends (disk full, directory removed), the results go
  next to the default location instead (`write_results`), and the caller says where.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import hashlib
import os
import stat
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping

from kvconnector.errors import ConfigError
from kvconnector.files import atomic_path as atomic_path  # re-exported: the outputs write through it

from ..common.json_files import write_json

RESULTS_DIR = "results"


def _nearest_existing(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.lexists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def check_new_dirs(directory: str, what: str) -> None:
    """The one rule on directories an output needs: a missing part of its path is made, but only below an existing
    directory other than the filesystem's root. A new top-level directory (/nonexistent/dir/x.csv) is a typo or a
    mount that is not there, never made silently: ConfigError naming it."""
    directory = os.path.abspath(directory)
    base = _nearest_existing(directory)
    if base != directory and os.path.dirname(base) == base:
        top = os.path.join(base, os.path.relpath(directory, base).split(os.sep)[0])
        raise ConfigError(
            f"{what}: {top} does not exist (kvtier makes missing directories, but not at the top of the filesystem)"
        )


def _probe_dir(directory: str, what: str) -> None:
    """Can files be created under `directory` (it, or the nearest of its ancestors that exists)? Leaves nothing."""
    check_new_dirs(directory, what)
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


def _identity(path: str) -> tuple:
    """What makes two paths one file: the inode of an existing one (symlinks and hard links resolve to it), else the
    resolved path."""
    try:
        st = os.stat(path)
    except OSError:
        return ("path", os.path.realpath(path))
    return ("inode", st.st_dev, st.st_ino)


def check_distinct(outputs: Mapping[str, str | None], inputs: Mapping[str, str | None] | None = None) -> None:
    """Every output ({flag: path}) names its own file, none of them an input: two writers on one file would leave
    only the last one's output (or an input replaced by an output)."""
    seen: dict[tuple, str] = {}
    for what, path in (inputs or {}).items():
        if path:
            seen.setdefault(_identity(path), f"the input {what}" if what != path else f"an input ({path})")
    claimed: dict[tuple, str] = {}
    for what, path in outputs.items():
        if not path:
            continue
        key = _identity(path)
        if key in seen:
            raise ConfigError(f"{what} {path}: is also {seen[key]}; give each output its own file")
        if key in claimed:
            raise ConfigError(f"{what} {path}: also given to {claimed[key]}; give each output its own file")
        claimed[key] = what
    return None


def check_outputs(
    files: Mapping[str, str | None],
    dirs: Mapping[str, str | None] | None = None,
    inputs: Mapping[str, str | None] | None = None,
) -> None:
    """Check every given output ({flag: path}): each distinct (`check_distinct`) and writable; raise ConfigError
    naming the first that is not. Creates nothing; `claim_outputs` is this plus the claim."""
    check_distinct({**files, **(dirs or {})}, inputs)
    for what, path in files.items():
        if path:
            check_file(path, what)
    for what, path in (dirs or {}).items():
        if path:
            check_dir(path, what)


CLAIM_SUFFIX = ".kvtier-claim"


def _flock_now(fd: int, tries: int = 4) -> bool:
    """Lock `fd` exclusively, without waiting for a holder: False if another process holds it. A few short retries:
    a command removing a killed command's claim file (`_remove_dead_claims`) holds its lock for microseconds."""
    for i in range(tries):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if i + 1 < tries:
                time.sleep(0.05)
    return False


def _remove_dead_claims(directory: str) -> None:
    """Remove the claim files in `directory` that no live process holds (left by a killed command: the kernel dropped
    its lock, the file stayed). A live holder's lock makes its file skipped."""
    try:
        entries = [e.path for e in os.scandir(directory) if e.name.startswith(".") and e.name.endswith(CLAIM_SUFFIX)]
    except OSError:
        return
    for path in entries:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.path.samestat(os.fstat(fd), os.stat(path)):
                os.unlink(path)  # under its lock: a command that opened it meanwhile finds it gone and makes a new one
        except OSError:  # held by a live command, already gone, or no flock here
            pass
        finally:
            os.close(fd)


def _claim_name(path: str) -> str:
    directory, name = os.path.split(os.path.abspath(path))
    if len(os.fsencode(name)) > 200:  # the claim's name must fit NAME_MAX (255 bytes) too: shortened, kept unique
        name = f"{os.fsdecode(os.fsencode(name)[:100])}-{hashlib.sha256(os.fsencode(name)).hexdigest()[:16]}"
    return os.path.join(directory, f".{name}{CLAIM_SUFFIX}")


class OutputClaim:
    """The outputs one command holds (see `claim_outputs`). `release()` (or leaving the `with` block) drops the
    locks, removes the claim files and the directories made for them that are still empty; process exit does too."""

    def __init__(self) -> None:
        self.paths: dict[str, str] = {}  # flag -> path, the files claimed
        self._held: list[tuple[str, int]] = []  # (claim file, its locked descriptor)
        self._made_dirs: list[str] = []

    def _make_parent(self, path: str) -> None:
        missing = []
        d = os.path.dirname(os.path.abspath(path))
        while not os.path.isdir(d):
            missing.append(d)
            d = os.path.dirname(d)
        for d in reversed(missing):
            try:
                os.mkdir(d)
            except FileExistsError:
                continue
            self._made_dirs.append(d)

    def _lock(self, what: str, path: str) -> None:
        name = _claim_name(path)
        while True:
            fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                locked = _flock_now(fd)
            except OSError:  # a filesystem without flock: the claim cannot exclude anyone there
                locked = True
            if not locked:
                owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                os.close(fd)
                raise ConfigError(
                    f"{what} {path}: another kvtier command (pid {owner}) is writing it; give another path or wait"
                )
            try:  # the previous holder may have removed the file between our open and our lock: lock the new one
                same = os.path.samestat(os.fstat(fd), os.stat(name))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._held.append((name, fd))

    def release(self) -> None:
        while self._held:
            name, fd = self._held.pop()
            with contextlib.suppress(OSError):
                os.unlink(name)  # unlinked before the lock drops: the next holder locks a file that stays
            os.close(fd)
        while self._made_dirs:
            with contextlib.suppress(OSError):
                os.rmdir(self._made_dirs.pop())  # only if nothing was written into it
        with contextlib.suppress(ValueError):
            _LIVE_CLAIMS.remove(self)

    def __enter__(self) -> OutputClaim:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


_LIVE_CLAIMS: list[OutputClaim] = []


@atexit.register
def _release_all() -> None:
    for c in list(_LIVE_CLAIMS):
        c.release()


def claim_outputs(
    files: Mapping[str, str | None],
    dirs: Mapping[str, str | None] | None = None,
    *,
    inputs: Mapping[str, str | None] | None = None,
    replace: bool | Iterable[str] = True,
    exists_hint: str = "give a new path (this command never replaces a file)",
) -> OutputClaim:
    """The one check a command makes before it runs, with all its outputs: `files` and `dirs` ({flag: path}, None
    for one not asked for), the files it reads (`inputs`, which no output may be). `replace`: whether an existing
    file may be replaced (True, False, or the flags that may); `exists_hint` ends the error when one may not.
    Each file is then claimed (see the module docstring) and stays claimed until the returned `OutputClaim` is
    released. Raises ConfigError naming the first problem, having claimed and created nothing."""
    check_outputs(files, dirs, inputs)
    may_replace = (lambda what: replace) if isinstance(replace, bool) else (lambda what, r=set(replace): what in r)
    claim = OutputClaim()
    swept: set[str] = set()
    try:
        for what, path in files.items():
            if not path:
                continue
            claim._make_parent(path)
            directory = os.path.dirname(os.path.abspath(path))
            if directory not in swept:
                swept.add(directory)
                _remove_dead_claims(directory)
            try:
                claim._lock(what, path)
            except OSError as exc:
                raise ConfigError(f"{what} {path}: cannot claim it ({os_reason(exc)})") from exc
            if not may_replace(what) and os.path.lexists(path):
                raise ConfigError(f"{what} {path}: exists; {exists_hint}")
            claim.paths[what] = path
    except BaseException:
        claim.release()
        raise
    _LIVE_CLAIMS.append(claim)
    return claim


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
    write_json(path, doc, default=str, exclusive=exclusive)  # never a bare NaN: other JSON readers refuse it


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
