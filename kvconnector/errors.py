"""One exception tree for kvtier.

- `UserError`: the user asked for something kvtier refuses (a bad flag, value, file or combination). Every `kvtier`
  subcommand answers it the same way (replay/cli.py): one line `kvtier SUB: message` on stderr, exit status 2.
- Anything else that escapes a subcommand is a failure or a bug: exit status 1, its traceback in a log file
  (docs/errors.md). A storage failure mid-run (`StorageFullError`) is not the user's mistake, so not a UserError.
"""

from __future__ import annotations


class KvtierError(Exception):
    """Base of every error kvtier raises on purpose."""


class UserError(KvtierError):
    """A refusal of what the user asked: one line naming the flag, variable or file and why; exit status 2. Never
    raised for a bug or for a failure during a run."""


class ConfigError(UserError, ValueError):
    """A setting the user gave is invalid (unknown model, absurd size, unwritable directory, conflicting flags)."""


class StorageFullError(KvtierError, OSError):
    """The filesystem under a disk tier ran out of space (ENOSPC) or quota (EDQUOT)."""


class CorruptEntryError(KvtierError):
    """A stored entry failed validation (bad magic, short file, checksum mismatch). It is never served."""


class EntryNotFound(KvtierError, KeyError):
    """The key is not in the store (or was evicted while the caller looked)."""
