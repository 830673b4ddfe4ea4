"""On-disk form of one KV entry: a 4 KiB header page, then the raw payload padded to 4 KiB.

The header page keeps the payload aligned for O_DIRECT and carries what a restart needs to serve the file again
without trusting anything else: the key (file names are hashes, so no key ever becomes a path), shape, dtype, payload
length and an xxh3-64 checksum of the payload. The header has its own checksum so a torn header is caught too.

The names kvtier gives files in a tier directory are defined here, one pattern each, and are all it ever deletes
there (see persistence.py): entries (`ENTRY_NAME`), temp files (`TEMP_NAME`: writes in flight, spare files, the
O_DIRECT probe) and the directory's marker (`MARKER_NAME`, which names the entry format version).
"""

from __future__ import annotations

import operator
import re
import struct
from dataclasses import dataclass

import xxhash

from .errors import CorruptEntryError, InvalidArgumentError

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


def entry_parts(key: str, chunks, nbytes: int, shape=(), dtype: str = "uint8") -> tuple[bytearray, list[memoryview]]:
    """An entry as a tier that stores whole objects sends it: its header page and its payload as byte views (nothing
    copied), for a client that gathers parts (Mooncake) or for `entry_bytes`."""
    parts = [c.cast("B") if c.format != "B" else c for c in chunks]
    header = bytearray(PAGE)
    pack_header(memoryview(header), EntryHeader(key, nbytes, checksum(parts), dtype, tuple(shape)))
    return header, parts


def entry_bytes(key: str, chunks, nbytes: int, shape=(), dtype: str = "uint8") -> bytearray:
    """An entry in one buffer (header page, then the payload), for a client that sends one value (Redis, S3)."""
    header, parts = entry_parts(key, chunks, nbytes, shape, dtype)
    value = bytearray(PAGE + nbytes)
    value[:PAGE] = header
    pos = PAGE
    for c in parts:
        value[pos : pos + len(c)] = c
        pos += len(c)
    return value


def check_entry(header, payload, key: str, nbytes: int, where: str, size: int | None = None) -> EntryHeader:
    """An object read back whole is the entry asked for: its header names `key` and `nbytes` (and it held `size`
    bytes, where the client says), its payload matches the header's checksum; CorruptEntryError otherwise."""
    hdr = unpack_header(header, where)
    if hdr.key != key or hdr.payload_nbytes != nbytes or (size is not None and size != PAGE + nbytes):
        raise CorruptEntryError(f"{where}: holds {hdr.key!r} of {hdr.payload_nbytes} bytes, expected {key!r}")
    if xxhash.xxh3_64_intdigest(payload) != hdr.checksum:
        raise CorruptEntryError(f"{where}: payload checksum mismatch")
    return hdr


def show_key(key: str, n: int = 40) -> str:
    """A key for an error message: its start, so a 4 KB key does not become a 4 KB line."""
    return repr(key[:n]) + (f"... ({len(key)} characters)" if len(key) > n else "")


def check_key(key: object, max_bytes: int | None = MAX_KEY_BYTES) -> None:
    """Refuse a key a tier cannot hold, with InvalidArgumentError: not a str; with a byte limit (tiers that write
    the key into a header: disk, shared directory, Redis) also one that UTF-8 cannot encode (a lone surrogate) or
    longer than `max_bytes` once encoded. Any other str is fine: '/', '..', NUL, newlines and '' included, since a
    key never becomes a path (file_name_for hashes it) and the header stores its length."""
    if not isinstance(key, str):
        raise InvalidArgumentError(f"a key must be a str, not {type(key).__name__}")
    if max_bytes is None:
        return
    # Within the limit even at 4 bytes a character: no need to encode (the hot path of short ASCII keys).
    if 4 * len(key) <= max_bytes and key.isascii():
        return
    try:
        n = len(key.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidArgumentError(
            f"key {show_key(key)} cannot be stored: UTF-8 cannot encode its character {exc.start} (a lone surrogate)"
        ) from None
    if n > max_bytes:
        raise InvalidArgumentError(
            f"key {show_key(key)} cannot be stored: {n} bytes in UTF-8, an entry header holds at most {max_bytes}"
        )


def check_header_fields(shape: object, dtype: object) -> None:
    """Refuse a shape or dtype an entry header cannot hold (InvalidArgumentError): at most MAX_DIMS sizes, each an
    int from 0 to 2**64-1; a dtype name of 1 to 8 ASCII characters (a longer one would be cut short on disk)."""
    if not isinstance(shape, (tuple, list)) or len(shape) > MAX_DIMS:
        raise InvalidArgumentError(f"shape {shape!r} must be a tuple of at most {MAX_DIMS} sizes")
    for d in shape:
        try:
            v = operator.index(d)
        except TypeError:
            v = -1
        if isinstance(d, bool) or not 0 <= v < 1 << 64:
            raise InvalidArgumentError(f"shape {shape!r}: each size must be an int from 0 to 2**64-1")
    if not isinstance(dtype, str) or not dtype.isascii() or not 0 < len(dtype) <= 8:
        raise InvalidArgumentError(f"dtype {dtype!r} must be a name of 1 to 8 ASCII characters")


def pack_header(into: memoryview, hdr: EntryHeader) -> None:
    """Write the header into a PAGE-sized buffer (the rest of the page is zeroed). InvalidArgumentError for a key,
    shape or dtype it cannot hold."""
    check_key(hdr.key)
    check_header_fields(hdr.shape, hdr.dtype)
    key = hdr.key.encode("utf-8")
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
    """A fixed-length hex name: keys (which hold '/', '..', '@') never reach the filesystem as paths. A key UTF-8
    cannot encode has no name (InvalidArgumentError): no tier with files holds it."""
    try:
        return xxhash.xxh3_128_hexdigest(key.encode("utf-8")) + ".kv"
    except (UnicodeEncodeError, AttributeError):
        check_key(key)  # raises InvalidArgumentError saying why: not a str, or a lone surrogate
        raise


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
