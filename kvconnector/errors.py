"""One exception tree for kvtier. User-facing commands turn `KvtierError` into one clear line and a non-zero exit."""

from __future__ import annotations


class KvtierError(Exception):
    """Base of every error kvtier raises on purpose."""


class ConfigError(KvtierError, ValueError):
    """A setting the user gave is invalid (unknown model, absurd size, unwritable directory, conflicting flags)."""


class StorageFullError(KvtierError, OSError):
    """The filesystem under a disk tier ran out of space (ENOSPC) or quota (EDQUOT)."""


class CorruptEntryError(KvtierError):
    """A stored entry failed validation (bad magic, short file, checksum mismatch). It is never served."""


class EntryNotFound(KvtierError, KeyError):
    """The key is not in the store (or was evicted while the caller looked)."""
