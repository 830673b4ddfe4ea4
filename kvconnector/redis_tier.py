"""Redis / Valkey as a tier (redis-py). One Redis string per entry: the same 4 KiB header page as a disk entry (key,
length, shape, dtype, payload checksum), then the payload. Redis keys are `<namespace>:<hash of the key>.kv`, so an
LMCache key never reaches Redis unescaped either. Every read checks the header and the checksum; an entry another
instance deleted is a miss (`EntryNotFound`). Device time is the round trip (the redis-py call); host time the header,
checksum and copies.

A Redis Cluster is named by `redis-cluster://[user[:password]@]host:port[,host:port...]` (LMCache's form for its own
Redis Cluster connector; the query options of a `redis://` URL, such as `?socket_timeout=1`, apply to every node):
redis-py's cluster client follows MOVED and ASK, and keys spread over every slot (no hash tags). An operation the
server cannot answer (a master down, a timeout) fails once, within the socket timeout, as the `OSError` the store
counts for any tier: a read is a miss to the caller (`read_errors` here), a write a store error (`write_errors`). The
client does not retry it; it refreshes its slot map, so the next operation finds a master that took the slots over.
"""

from __future__ import annotations

import threading
from time import perf_counter_ns

from .entry_format import MAX_KEY_BYTES, PAGE, EntryHeader, check_entry, entry_bytes, file_name_for, unpack_header
from .errors import ConfigError, CorruptEntryError, EntryNotFound, one_line
from .tiers import Tier
from .timed_io import OpTiming

CLUSTER_SCHEME = "redis-cluster://"


class RedisTier(Tier):
    kind = "redis"
    max_key_bytes = MAX_KEY_BYTES  # the key is in each value's header

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
        self.cluster = url.startswith(CLUSTER_SCHEME)
        self._unwritten = threading.local()  # the key whose write just failed in this thread (see delete)
        # RedisClusterException (no node reachable, a slot no master serves) is not a RedisError.
        self._redis_errors = (redis.RedisError, redis.exceptions.RedisClusterException, OSError)
        timeouts = {"socket_timeout": socket_timeout_s, "socket_connect_timeout": min(5.0, socket_timeout_s)}
        try:
            if self.cluster:
                self._r = _cluster_client(url, timeouts)
            else:
                self._r = redis.Redis.from_url(url, **timeouts)
            self._r.ping()
        except (*self._redis_errors, ValueError, TypeError) as exc:  # TypeError: an unknown URL option
            what = "Redis Cluster" if self.cluster else "Redis"
            raise ConfigError(f"kvtier: cannot reach {what} at {_safe_url(url)}: {one_line(exc)}") from None

    def _rkey(self, key: str) -> str:
        return f"{self.namespace}:{file_name_for(key)}"

    def write(self, key, chunks, nbytes, shape=(), dtype="uint8"):
        t0 = perf_counter_ns()
        value = entry_bytes(key, chunks, nbytes, shape, dtype)
        d0 = perf_counter_ns()
        try:
            self._call("write_errors", self._r.set, self._rkey(key), value)
        except OSError:
            self._unwritten.key = key
            raise
        d1 = perf_counter_ns()
        return OpTiming(host_ns=(d0 - t0), device_ns=d1 - d0, nbytes=nbytes)

    def read(self, key, nbytes, dest=None):
        t0 = perf_counter_ns()
        d0 = perf_counter_ns()
        value = self._call("read_errors", self._r.get, self._rkey(key))
        d1 = perf_counter_ns()
        if value is None:
            raise EntryNotFound(key)
        where = f"redis {self._rkey(key)}"
        payload = memoryview(value)[PAGE:]
        check_entry(memoryview(value)[:PAGE], payload, key, nbytes, where, len(value))
        if dest is not None:
            dest[:nbytes] = payload
        return OpTiming(host_ns=(perf_counter_ns() - t0) - (d1 - d0), device_ns=d1 - d0, nbytes=nbytes)

    def _call(self, counter: str, fn, *args):
        """One redis-py call; a server that cannot answer is counted and becomes the OSError the store counts."""
        try:
            return fn(*args)
        except self._redis_errors as exc:
            self.fallbacks[counter] += 1
            raise OSError(f"redis {args[0]}: {one_line(exc)}") from exc

    def delete(self, key):
        if getattr(self._unwritten, "key", None) == key:
            # The store deletes what a failed write may have left; a SET that failed left nothing, and asking the
            # master that just failed would cost a second socket timeout.
            self._unwritten.key = None
            return
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
        """Headers of every entry in this namespace (for a restart), from every master of a cluster; corrupt ones are
        deleted and counted. A master that cannot be scanned is counted (`scan_errors`) and the others still are."""
        out = []
        for node in self._r.get_primaries() if self.cluster else [None]:
            where = {"target_nodes": node} if self.cluster else {}
            try:
                for rkey in self._r.scan_iter(match=f"{self.namespace}:*.kv", count=1000, **where):
                    hdr = self._scanned(rkey)
                    if hdr is not None:
                        out.append(hdr)
            except self._redis_errors:
                self.fallbacks["scan_errors"] += 1
        return out

    def _scanned(self, rkey: bytes) -> EntryHeader | None:
        page = self._r.getrange(rkey, 0, PAGE - 1)
        try:
            hdr = unpack_header(page, str(rkey))
            if self._r.strlen(rkey) != PAGE + hdr.payload_nbytes:
                raise CorruptEntryError(f"{rkey!r}: wrong length")
        except CorruptEntryError:
            self._r.delete(rkey)
            self.fallbacks["corrupt_removed"] += 1
            return None
        return hdr

    def describe(self):
        return {
            **super().describe(),
            "url": _safe_url(self.url),
            "namespace": self.namespace,
            "cluster": self.cluster,
            "shared": True,
        }

    def close(self):
        try:
            self._r.close()
        except self._redis_errors:
            pass


def _cluster_client(url: str, timeouts: dict):
    """redis-py's cluster client for `redis-cluster://[auth@]host:port,...[?options]`. Options are a `redis://` URL's
    (redis-py parses them, one node standing for all); each operation is tried once (redis-py's default is ten tries
    with backoff, which would hold a caller far past the socket timeout while a master is down)."""
    from redis.backoff import NoBackoff
    from redis.cluster import ClusterNode, RedisCluster
    from redis.connection import parse_url
    from redis.retry import Retry

    rest, _, query = url[len(CLUSTER_SCHEME) :].partition("?")
    auth, _, hosts = rest.rpartition("@")
    hosts = hosts.rstrip("/")
    if "/" in hosts:
        raise ValueError("a Redis Cluster has no database number (nothing after the last host:port)")
    nodes = []
    for hp in hosts.split(","):
        host, _, port = hp.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"{hp!r} is not host:port")
        nodes.append(ClusterNode(host, int(port)))
    options = parse_url(f"redis://{auth + '@' if auth else ''}{nodes[0].host}:{nodes[0].port}/?{query}")
    for k in ("host", "port", "db"):
        options.pop(k, None)
    if "socket_timeout" in options and "socket_connect_timeout" not in options:
        options["socket_connect_timeout"] = min(5.0, options["socket_timeout"])
    return RedisCluster(
        startup_nodes=nodes,
        retry=Retry(NoBackoff(), 0),
        require_full_coverage=False,  # the slots of live masters are served while another is down
        **{**timeouts, **options},
    )


def _safe_url(url: str) -> str:
    """The URL without a password."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url
