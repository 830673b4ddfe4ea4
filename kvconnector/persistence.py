"""Serving a tier's directory again after a restart, and the rule that keeps a user's files safe in it.

What kvtier may delete: only what it can show it wrote. A directory becomes a tier by `claim_dir`: kvtier writes a
marker file (`.kvtier-tier`, naming the entry format and version) into it while it is empty, before anything else;
a non-empty directory without the marker is refused with a ConfigError (one line), so kvtier never shares a
directory with the user's files; a marker of another format version is refused too. Inside a claimed directory
kvtier touches only regular files whose names match its patterns exactly (entry_format.ENTRY_NAME: 32 hex digits
+ ".kv"; entry_format.TEMP_NAME: its temp, spare and probe names). Anything else (other names, subdirectories,
FIFOs, symlinks, even under one of our names) is left alone and counted (`left_alone`); symlinks are never followed.

Who may use a tier directory at once: the process that opened it holds an advisory lock (flock) on the marker for as
long as the tier is open; the kernel drops it when the process ends, however it ends, so a lock never outlives its
owner and survives pid reuse. A private tier (`disk_dir`) holds it exclusively: one owner at a time, and a second
opener gets one ConfigError naming the holder. A shared tier (`shared_dir`) holds it shared, so any number of instances
open it together and neither kind can open the other's directory. A filesystem without flock is used unlocked, and
that fallback is counted (`tier_lock_unavailable`).

`rescan_dir` walks a claimed tier directory: every entry file's header is validated (magic, version, header checksum,
file length; the name must be the hash of the key it holds; with `verify_payload` the payload checksum too). Valid
entries are adopted by the store oldest first (so the LRU order survives the restart); corrupt, truncated or misnamed
entry files are removed and counted, and so are temp files a crash left behind (in a shared directory only those
older than `stale_tmp_s`, because younger ones may be another instance's write in flight; and never one a live
writer holds: a shared tier's writer holds a lock on its temp file while it writes, and a file locked so is left and
counted as `live_tmp_left`, whatever its age). What the adoption itself evicts to stay within capacity is counted
too (`evicted`: removed; `demoted`: moved to the tier below), so the report accounts for every file it removed. A
copy of an entry that a lower tier (rescanned first) already holds, which a crash in the middle of a demotion leaves
behind, is removed.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from dataclasses import asdict, dataclass

from .entry_format import ENTRY_NAME, MARKER_NAME, MARKER_TEXT, TEMP_NAME, file_name_for
from .errors import ConfigError, CorruptEntryError
from .files import unlink_quietly
from .timed_io import IOMode, read_entry, read_header

# How long a marker that another instance is writing right now may stay incomplete (it is one small write).
_MARKER_WAIT_S = 2.0


# What flock answers on a filesystem that has no such locks (some FUSE and network filesystems).
_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


def claim_dir(directory: str, *, shared: bool = False) -> int | None:
    """Make `directory` a kvtier tier and lock it for this process (see the module doc): returns the descriptor that
    holds the lock (close it to release), or None on a filesystem without flock. Raises ConfigError for a non-empty
    directory without the marker, a marker that is not ours or names another entry format, or a directory that
    another live process holds (exclusively, or at all for a private tier)."""
    fd = _claim_marker(directory, shared)
    return fd if fd is not None else _lock_marker(directory, shared)


def _lock_marker(directory: str, shared: bool) -> int | None:
    marker = os.path.join(directory, MARKER_NAME)
    try:
        fd = os.open(marker, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"cannot open {marker}: {exc.strerror}") from exc
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        holders = lock_holders(fd)
        os.close(fd)
        # /proc/locks names the process that took the lock; a process it forked may hold it after it has ended.
        who = (
            "pid "
            + ", ".join(
                str(p) if os.path.exists(f"/proc/{p}") else f"{p} (ended; a process it forked)" for p in holders
            )
            if holders
            else "another process"
        )
        raise ConfigError(
            f"cache dir {directory} is in use by {who}: "
            + (
                "it is a private tier (disk_dir), not a shared one"
                if shared
                else "a private tier (disk_dir) has one owner at a time; give each process its own directory, "
                "or use shared_dir for one that several share"
            )
        ) from None
    except OSError as exc:
        os.close(fd)
        if exc.errno in _NO_LOCKS:
            return None
        raise ConfigError(f"cannot lock {marker}: {exc.strerror}") from exc
    return fd


def lock_holders(fd: int) -> list[int]:
    """The pids holding flock locks on the file open as `fd` (from /proc/locks; empty where it cannot tell). A pid is
    the one that took the lock: a child that inherited it after a fork is not named."""
    st = os.fstat(fd)
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    pids = []
    try:
        with open("/proc/locks") as fh:
            for line in fh:
                f = line.split()
                if len(f) >= 6 and f[1] == "FLOCK" and f[5] == want and f[4].isdigit():
                    pids.append(int(f[4]))
    except OSError:
        return []
    return sorted(set(pids))


def _claim_marker(directory: str, shared: bool) -> int | None:
    """Check the marker, or write it into an empty directory: then the lock is taken on the new file before its
    first byte (so no other process ever sees this tier's marker unlocked) and its descriptor is returned."""
    marker = os.path.join(directory, MARKER_NAME)
    with os.scandir(directory) as it:
        empty = next(it, None) is None
    if not empty:
        if os.path.lexists(marker):  # ours (claimed earlier, or by another instance of a shared dir just now)
            _check_marker(marker, directory)
            return None
        raise ConfigError(
            f"cache dir {directory} is not empty and is not a kvtier tier (no {MARKER_NAME}): "
            f"give a new or empty directory (kvtier never writes among files it did not make)"
        )
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except FileExistsError:  # another instance of a shared directory claimed it at the same moment
        _check_marker(marker, directory)
        return None
    except OSError as exc:
        raise ConfigError(f"cannot write {marker}: {exc.strerror}") from exc
    try:
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
            locked = True
        except OSError as exc:
            if exc.errno not in _NO_LOCKS:
                raise ConfigError(f"cannot lock {marker}: {exc.strerror}") from exc
            locked = False
        _write_marker(fd)
    except BaseException:
        os.close(fd)
        raise
    if locked:
        return fd
    os.close(fd)
    return None


def _write_marker(fd: int) -> None:
    data = MARKER_TEXT.encode()
    if os.pwrite(fd, data, 0) != len(data):
        raise OSError(errno.EIO, "short write of the tier marker")
    os.fsync(fd)


def _check_marker(marker: str, directory: str) -> None:
    deadline = time.monotonic() + _MARKER_WAIT_S
    while True:
        try:
            if not stat.S_ISREG(os.lstat(marker).st_mode):
                raise ConfigError(f"cache dir {directory}: {MARKER_NAME} is not a regular file; not a kvtier tier")
            with open(marker, encoding="utf-8", errors="replace") as fh:
                text = fh.read(256)
        except OSError as exc:
            raise ConfigError(f"cannot read {marker}: {exc.strerror}") from exc
        if text == MARKER_TEXT:
            return
        if not MARKER_TEXT.startswith(text):
            break
        if time.monotonic() >= deadline:
            # Still a part of our own text: the instance that created it died while writing it. Complete it.
            try:
                fd = os.open(marker, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                try:
                    _write_marker(fd)
                finally:
                    os.close(fd)
            except OSError as exc:
                raise ConfigError(f"cannot write {marker}: {exc.strerror}") from exc
            return
        time.sleep(0.05)  # being written by the instance that created it
    got, want = text.splitlines(), MARKER_TEXT.splitlines()
    if got[:1] == want[:1]:
        raise ConfigError(
            f"cache dir {directory} holds a kvtier tier of another format ({' '.join(got[1:2])!r}; "
            f"this kvtier writes {want[1]!r}): give another directory"
        )
    raise ConfigError(f"cache dir {directory}: {MARKER_NAME} is not a kvtier marker; not a kvtier tier")


def _held_by_a_writer(path: str) -> bool:
    """Whether a live process holds a lock on the temp file `path` (a shared tier's write in flight). A filesystem
    without flock cannot tell: then it is not held, and the age rule alone decides."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # releases the lock it may have taken
    return False


@dataclass(slots=True)
class RescanReport:
    tier: str
    adopted: int = 0
    adopted_bytes: int = 0
    corrupt_removed: int = 0
    stale_tmp_removed: int = 0
    no_room_removed: int = 0
    duplicate_removed: int = 0
    evicted: int = 0  # adopted, then removed again to make room for newer ones (a private tier, no tier below)
    demoted: int = 0  # adopted, then moved to the tier below to make room (not removed: served from there)
    live_tmp_left: int = 0  # temp files a live writer holds (locked): never removed, whatever their age
    left_alone: int = 0  # names that are not kvtier's (or not regular files): never touched
    duration_ms: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def rescan_dir(
    store, t: int, *, verify_payload: bool = False, stale_tmp_s: float | None = None, shared: bool = False
) -> RescanReport:
    """Adopt the valid entries of store.tiers[t] (a DiskTier) into the store; remove the rest (see module doc).
    In a shared directory (`shared`) entries that do not fit are left for the other instances."""
    t0 = time.perf_counter_ns()
    tier = store.tiers[t]
    report = RescanReport(tier.name)
    now = time.time()
    found = []
    with os.scandir(tier.directory) as it:
        for de in it:
            name = de.name
            temp = TEMP_NAME.fullmatch(name)
            if name == MARKER_NAME:
                continue
            if not (temp or ENTRY_NAME.fullmatch(name)):
                report.left_alone += 1  # not a name kvtier gives: not ours to touch
                continue
            try:
                st = de.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(st.st_mode):
                report.left_alone += 1  # a symlink, FIFO or directory under one of our names: kvtier made no such thing
                continue
            if temp:
                if stale_tmp_s is None or now - st.st_mtime > stale_tmp_s:
                    if _held_by_a_writer(de.path):
                        report.live_tmp_left += 1
                    else:
                        unlink_quietly(de.path)
                        report.stale_tmp_removed += 1
                continue
            try:
                hdr = read_header(de.path)
                if file_name_for(hdr.key) != name:
                    raise CorruptEntryError(f"{de.path}: name does not match the key it holds")
                if verify_payload:
                    read_entry(de.path, hdr.key, hdr.payload_nbytes, IOMode.BUFFERED, None)
                found.append((st.st_mtime_ns, hdr))
            except FileNotFoundError:
                continue  # removed by another instance while we looked (or replaced by something not a file)
            except (CorruptEntryError, OSError):
                unlink_quietly(de.path)
                report.corrupt_removed += 1
    # A private tier adopts oldest first, making room as a put does (what it cannot keep is removed below). A shared
    # tier holds other instances' entries too: it adopts the newest that fit its free room and never evicts for it,
    # so a node's rescan never deletes an entry another node wrote; then the LRU order is set oldest first.
    found.sort(key=lambda x: x[0], reverse=shared)
    # Making room while adopting evicts entries adopted just before (counted by the store as the tier's events).
    events_before = [s.events.copy() for s in store.stats]
    adopted = []
    for _, hdr in found:
        if store.adopt(t, hdr.key, hdr.payload_nbytes, hdr.shape, hdr.dtype, make_room=not shared):
            adopted.append(hdr.key)
            report.adopted += 1
            report.adopted_bytes += hdr.payload_nbytes
        elif shared:
            continue
        elif (where := store.contains(hdr.key)) is None:
            # No room (the tier shrank since the last run): the oldest entries were adopted first and may have
            # been demoted to make room; what is left over is removed so the directory stays within capacity.
            tier.delete(hdr.key)
            report.no_room_removed += 1
        elif where != tier.name:
            # A second copy of an entry adopted from a lower tier (scanned first): a move between tiers that a crash
            # cut short after the write and before the removal. Served from there; kept, this copy would be a file that
            # no tier accounts for (also when another instance put the same key into a shared tier below: same bytes).
            unlink_quietly(tier.path_for(hdr.key))
            report.duplicate_removed += 1
    if shared:
        store.touch(adopted[::-1])
    # Evictions in the tiers below count too: room made there for what this tier demoted.
    report.evicted = sum(
        store.stats[i].events["evictions"] - events_before[i]["evictions"] for i in range(t, len(store.stats))
    )
    report.demoted = store.stats[t].events["demotions_out"] - events_before[t]["demotions_out"]
    for event in ("corrupt_removed", "stale_tmp_removed", "no_room_removed", "duplicate_removed", "left_alone"):
        if getattr(report, event):
            store.stats[t].count("rescan_" + event, getattr(report, event))
    report.duration_ms = (time.perf_counter_ns() - t0) / 1e6
    return report
