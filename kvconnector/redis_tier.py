"""Redis / Valkey as a tier (redis-py). One Redis string per entry: the same 4 KiB header page as a disk entry (key,
length, shape, dtype, payload checksum), then the payload. Redis keys are `<namespace>:<hash of the key>.kv`, so an
LMCache key never reaches Redis unescaped either. Every read checks the header and the checksum; an entry another
instance deleted is a miss (`EntryNotFound`). Device time is the round trip (the redis-py call); host time the header,
checksum and copies.
"""

from __future__ import annotations

from time import perf_counter_ns

import xxhash

from .entry_format import PAGE, EntryHeader, file_name_for, pack_header, unpack_header
from .errors import ConfigError, CorruptEntryError, EntryNotFound
from .tiers import Tier
from .timed_io import OpTiming


class RedisTier(Tier):
    kind = "redis"

    def __init__(
        self,
        url: str,
        capacity_bytes: int,
        namespace: str = "kvtier",
        name: str = "redis",
        socket_timeout_s: float = 10.0,
    ) -> None:
        super().__init__(name, capacity_bytes)
        import redis  # a declared dependency; imported here so the core does not pay for it

        self.url = url
        self.namespace = namespace
        self._redis_errors = (redis.RedisError, OSError)
        try:
            self._r = redis.Redis.from_url(url, socket_timeout=socket_timeout_s, socket_connect_timeout=5)
            self._r.ping()
        except (redis.RedisError, OSError, ValueError) as exc:
            raise ConfigError(f"kvtier: cannot reach Redis at {_safe_url(url)}: {exc}") from None

    def _rkey(self, key: str) -> str:
        return f"{self.namespace}:{file_name_for(key)}"

    def write(self, key, chunks, nbytes, shape=(), dtype="uint8"):
        t0 = perf_counter_ns()
        value = bytearray(PAGE + nbytes)
        mv = memoryview(value)
        h = xxhash.xxh3_64()
        pos = PAGE
        for c in chunks:
            c = c.cast("B") if c.format != "B" else c
            mv[pos : pos + len(c)] = c
            h.update(c)
            pos += len(c)
        pack_header(mv[:PAGE], EntryHeader(key, nbytes, h.intdigest(), dtype, tuple(shape)))
        d0 = perf_counter_ns()
        self._r.set(self._rkey(key), value)
        d1 = perf_counter_ns()
        return OpTiming(host_ns=(d0 - t0), device_ns=d1 - d0, nbytes=nbytes)

    def read(self, key, nbytes, dest=None):
        t0 = perf_counter_ns()
        d0 = perf_counter_ns()
        value = self._r.get(self._rkey(key))
        d1 = perf_counter_ns()
        if value is None:
            raise EntryNotFound(key)
        where = f"redis {self._rkey(key)}"
        hdr = unpack_header(memoryview(value)[:PAGE], where)
        if hdr.key != key or hdr.payload_nbytes != nbytes or len(value) != PAGE + nbytes:
            raise CorruptEntryError(f"{where}: holds {hdr.key!r} of {hdr.payload_nbytes} bytes, expected {key!r}")
        payload = memoryview(value)[PAGE:]
        if xxhash.xxh3_64_intdigest(payload) != hdr.checksum:
            raise CorruptEntryError(f"{where}: payload checksum mismatch")
        if dest is not None:
            dest[:nbytes] = payload
        return OpTiming(host_ns=(perf_counter_ns() - t0) - (d1 - d0), device_ns=d1 - d0, nbytes=nbytes)

    def delete(self, key):
        try:
            self._r.delete(self._rkey(key))
        except self._redis_errors:
            self.fallbacks["delete_errors"] += 1

    def probe(self, key: str) -> EntryHeader | None:
        """The header of `key` if some instance stored it (and it looks whole); else None."""
        try:
            page = self._r.getrange(self._rkey(key), 0, PAGE - 1)
        except self._redis_errors:
            self.fallbacks["probe_errors"] += 1
            return None
        if not page:
            return None
        try:
            hdr = unpack_header(page, self._rkey(key))
        except CorruptEntryError:
            self.fallbacks["corrupt_removed"] += 1
            self.delete(key)
            return None
        return hdr if hdr.key == key else None

    def scan(self) -> list[EntryHeader]:
        """Headers of every entry in this namespace (for a restart); corrupt ones are deleted and counted."""
        out = []
        for rkey in self._r.scan_iter(match=f"{self.namespace}:*.kv", count=1000):
            page = self._r.getrange(rkey, 0, PAGE - 1)
            try:
                hdr = unpack_header(page, str(rkey))
                if self._r.strlen(rkey) != PAGE + hdr.payload_nbytes:
                    raise CorruptEntryError(f"{rkey!r}: wrong length")
            except CorruptEntryError:
                self._r.delete(rkey)
                self.fallbacks["corrupt_removed"] += 1
                continue
            out.append(hdr)
        return out

    def describe(self):
        return {**super().describe(), "url": _safe_url(self.url), "namespace": self.namespace, "shared": True}

    def close(self):
        try:
            self._r.close()
        except self._redis_errors:
            pass


def _safe_url(url: str) -> str:
    """The URL without a password."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url
