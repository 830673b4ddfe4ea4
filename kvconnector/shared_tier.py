"""A shared POSIX directory as a tier: several LMCache instances (on one host or many) write and read it at once.

Safe sharing comes from the entry format and the write path, not from locks:
- a writer writes a private temp file (pid and thread in its name), fdatasyncs it (unless its sync policy is none)
  and renames it into place, so a reader sees either no file or a whole one, never a partial file; it holds a lock
  (flock) on the temp file while it writes, so another instance's rescan leaves it alone however slow the write, and
  removes it once its writer is dead (and it is older than shared_stale_tmp_s: a filesystem whose locks one node
  cannot see from another is covered by the age alone);
- each instance holds a shared lock on the directory's marker, so no private tier (disk_dir) is opened on it;
- a reader opens the file and then reads through its descriptor: if another instance unlinks (evicts) the entry
  meanwhile, POSIX keeps the open file alive and the read completes; if the file is gone before the open, the read is
  a miss (`EntryNotFound`), counted as `vanished`, never an error;
- every read checks the header (key, length) and the payload checksum, so nothing torn or foreign is ever served.
Each instance bounds the bytes *it* accounts for in the directory (its own puts and the entries it adopted from
others) by the tier's capacity; the directory as a whole holds at most instances x capacity.
"""

from __future__ import annotations

import errno
from typing import Protocol, runtime_checkable

from .entry_format import EntryHeader
from .errors import CorruptEntryError
from .tiers import DiskTier
from .timed_io import IOMode, Sync, read_header


@runtime_checkable
class SharedTier(Protocol):
    """A tier other instances write into too (a shared directory, Redis): an entry missing from this instance's index
    may be there, and `probe` finds it."""

    def probe(self, key: str) -> EntryHeader | None:
        """The header of `key` if some instance put a valid entry there; else None."""
        ...


class SharedDirTier(DiskTier):
    kind = "shared_dir"
    shared = True

    def __init__(
        self,
        directory: str,
        capacity_bytes: int,
        io_mode: IOMode | str = IOMode.BUFFERED,
        name: str = "shared",
        sync: Sync | str = Sync.ENTRY,
    ) -> None:
        # No spares: another instance may still be reading a file this one deletes, so it must not be overwritten.
        super().__init__(directory, capacity_bytes, io_mode, name=name, spare_ratio=0.0, sync=sync)

    def delete(self, key: str) -> None:
        # On a network file system an unlink can fail (a brick down, the link cut: ENOTCONN) after the store has
        # forgotten the entry: the eviction or removal that asked for it still completes, and the file is left to a
        # later rescan (by any instance) to adopt or remove, counted here.
        try:
            super().delete(key)
        except OSError:
            self.fallbacks["delete_errors"] += 1

    def probe(self, key: str) -> EntryHeader | None:
        """The header of `key`'s file if another instance put it there (and it is valid); else None. A corrupt
        file is removed and counted."""
        path = self.path_for(key)
        try:
            hdr = read_header(path)
        except FileNotFoundError:
            return None
        except CorruptEntryError:
            self.fallbacks["corrupt_removed"] += 1
            self.delete(key)
            return None
        except OSError as exc:
            if exc.errno != errno.ESTALE:  # ESTALE: removed by another client while this one had the name cached
                self.fallbacks["probe_errors"] += 1
            return None
        if hdr.key != key:
            # A hash collision or a foreign file under our name: not ours to serve (and not ours to delete).
            self.fallbacks["foreign_entry"] += 1
            return None
        return hdr

    def describe(self):
        return {**super().describe(), "shared": True}
