"""One exception tree for kvtier.

- `UserError`: the user asked for something kvtier refuses (a bad flag, value, file or combination). Every `kvtier`
  subcommand answers it the same way (replay/cli.py): one line `kvtier SUB: message` on stderr, exit status 2.
- Anything else that escapes a subcommand is a failure or a bug: exit status 1, its traceback in a log file
  (docs/errors.md). A storage failure mid-run (`StorageFullError`) is not the user's mistake, so not a UserError.
- The store's API (`TieredStore`, the tiers) refuses a bad argument with `InvalidArgumentError` (a key no tier of the
  store can hold, a buffer that is not one or is too small) and any call after `close()` with `StoreClosedError`:
  mistakes of the calling code, not of a person at a prompt, so not UserErrors either (a CLI that meets one has a
  bug). A bad tier or store setting (a capacity that is not a finite positive number, a tier given twice) is a
  `ConfigError`.
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


class InvalidArgumentError(KvtierError, ValueError):
    """The store refused an argument of a call before touching anything: a key that a tier of the store cannot hold
    (not a str, too long once UTF-8 encoded, a lone surrogate), chunks or a destination that are not byte buffers,
    a destination smaller than the entry. The message names the argument and the sizes."""


class StoreClosedError(KvtierError, RuntimeError):
    """An operation on a store (or tier) after its `close()`: nothing is stored, read or removed any more."""


def one_line(exc: BaseException) -> str:
    """A client library's exception as one line (its message's whitespace folded; its type when it has none)."""
    return " ".join(str(exc).split()) or type(exc).__name__
