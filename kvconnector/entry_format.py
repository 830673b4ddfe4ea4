"""On-disk form of one KV entry: a 4 KiB header page, then the raw payload padded to 4 KiB.

The header page keeps the payload aligned for O_DIRECT and carries what a restart needs to serve the file again
without trusting anything else: the key (file names are hashes, so no key ever becomes a path), shape, dtype, payload
length and an xxh3-64 checksum of the payload. The header has its own checksum so a torn header is caught too.

The names kvtier gives files in a tier directory are defined here, one pattern each, and are all it ever deletes
there (see persistence.py): entries (`ENTRY_NAME`), temp files (`TEMP_NAME`: writes in flight, spare files, the
O_DIRECT probe) and the directory's marker (`MARKER_NAME`, which names the entry format version).
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

import xxhash

from .errors import CorruptEntryError

PAGE = 4096
MAGIC = b"KVTR"
VERSION = 1
MAX_DIMS = 8
# magic, version, key length, payload bytes, payload xxh3, dtype, ndim, shape[8], header xxh3 (over the bytes before it)
_FIXED = struct.Struct(f"<4sHHQQ8sB7x{MAX_DIMS}Q")
_HDR_SUM = struct.Struct("<Q")
MAX_KEY_BYTES = PAGE - _FIXED.size - _HDR_SUM.size


@dataclass(frozen=True, slots=True)
class EntryHeader:
    key: str
    payload_nbytes: int
    checksum: int
    dtype: str = "uint8"
    shape: tuple[int, ...] = ()

    @property
    def file_nbytes(self) -> int:
        return file_nbytes(self.payload_nbytes)


def aligned(n: int) -> int:
    return (n + PAGE - 1) // PAGE * PAGE


def file_nbytes(payload_nbytes: int) -> int:
    return PAGE + aligned(payload_nbytes)


def checksum(views) -> int:
    h = xxhash.xxh3_64()
    for v in views:
        h.update(v)
    return h.intdigest()


def pack_header(into: memoryview, hdr: EntryHeader) -> None:
    """Write the header into a PAGE-sized buffer (the rest of the page is zeroed)."""
    key = hdr.key.encode("utf-8")
    if len(key) > MAX_KEY_BYTES:
        raise ValueError(f"key of {len(key)} bytes exceeds {MAX_KEY_BYTES}")
    if len(hdr.shape) > MAX_DIMS:
        raise ValueError(f"shape {hdr.shape} has more than {MAX_DIMS} dims")
    shape = tuple(hdr.shape) + (0,) * (MAX_DIMS - len(hdr.shape))
    into[:PAGE] = bytes(PAGE)
    _FIXED.pack_into(
        into,
        0,
        MAGIC,
        VERSION,
        len(key),
        hdr.payload_nbytes,
        hdr.checksum,
        hdr.dtype.encode()[:8],
        len(hdr.shape),
        *shape,
    )
    into[_FIXED.size : _FIXED.size + len(key)] = key
    end = _FIXED.size + len(key)
    _HDR_SUM.pack_into(into, end, xxhash.xxh3_64_intdigest(into[:end]))


def unpack_header(page: memoryview | bytes, where: str = "entry") -> EntryHeader:
    if len(page) < _FIXED.size:
        raise CorruptEntryError(f"{where}: header truncated ({len(page)} bytes)")
    magic, version, key_len, nbytes, csum, dtype, ndim, *shape = _FIXED.unpack_from(page, 0)
    if magic != MAGIC:
        raise CorruptEntryError(f"{where}: bad magic {magic!r}")
    if version != VERSION:
        raise CorruptEntryError(f"{where}: unsupported version {version}")
    end = _FIXED.size + key_len
    if key_len > MAX_KEY_BYTES or ndim > MAX_DIMS or len(page) < end + _HDR_SUM.size:
        raise CorruptEntryError(f"{where}: header fields out of range")
    (stored,) = _HDR_SUM.unpack_from(page, end)
    if stored != xxhash.xxh3_64_intdigest(bytes(page[:end])):
        raise CorruptEntryError(f"{where}: header checksum mismatch")
    return EntryHeader(
        key=bytes(page[_FIXED.size : end]).decode("utf-8"),
        payload_nbytes=nbytes,
        checksum=csum,
        dtype=dtype.rstrip(b"\0").decode(),
        shape=tuple(shape[:ndim]),
    )


def file_name_for(key: str) -> str:
    """A fixed-length hex name: keys (which hold '/', '..', '@') never reach the filesystem as paths."""
    return xxhash.xxh3_128_hexdigest(key.encode("utf-8")) + ".kv"


# Exactly what file_name_for makes (xxh3-128 in lower-case hex), and exactly the temp names below.
ENTRY_NAME = re.compile(r"[0-9a-f]{32}\.kv")
TEMP_NAME = re.compile(r"[0-9a-f]{32}\.kv\.tmp[0-9]+-[0-9]+|spare-[0-9]+\.kv\.tmp|\.kvtier-odirect-probe-[0-9]+-[0-9]+")
# The marker that makes a directory a kvtier tier: written into an empty directory before anything else, checked
# before a non-empty one is used. Its content names the entry format, so a future format is not misread.
MARKER_NAME = ".kvtier-tier"
MARKER_TEXT = f"kvtier tier\nentry format {MAGIC.decode()} {VERSION}\n"


def temp_path_for(path: str, pid: int, thread_id: int) -> str:
    """A write in flight: private to one thread of one process (so shared-directory writers never collide)."""
    return f"{path}.tmp{pid}-{thread_id}"


def spare_name(n: int) -> str:
    return f"spare-{n}.kv.tmp"


def probe_name(pid: int, thread_id: int) -> str:
    return f".kvtier-odirect-probe-{pid}-{thread_id}"
