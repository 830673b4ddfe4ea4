"""Mooncake Store as a tier (the `mooncake-transfer-engine-non-cuda` wheel: its master, an HTTP metadata server and the
store client, all on CPU over TCP). One Mooncake object per entry: the 4 KiB header page of a disk entry (key,
length, shape, dtype, payload checksum), then the payload, under `<namespace>:<hash of the key>.kv`, so a key never
reaches Mooncake unescaped. Several instances share one store (their clients each lend `segment_bytes` of memory to
it), so this is a shared tier: a key missing from this instance's index is probed there.

What kvtier relies on, and how it holds (each checked by tests/kvconnector/test_mooncake_tier.py against a real master):
- atomic visibility: Mooncake makes an object readable only once its put has ended (PutStart, transfer, PutEnd), so a
  reader sees all of an entry or none; a put of a key the store already holds leaves the old object and answers 0.
- integrity: every read checks the header (key, length) and the payload checksum, so a torn read (an object removed
  by another instance while this one read it: deletes are forced past Mooncake's read lease) or a foreign object is
  refused (`CorruptEntryError`), never served.
- bounded time: a call to a hung master ends after `timeout_s` (Mooncake's MC_RPC_TIMEOUT_MS and
  MC_RPC_CONNECT_TIMEOUT_MS, read from the environment by the first client of a process: set here before it starts);
  a dead master is refused at once. Once the client has lost its master it reconnects on each call, which costs about
  4.5 s here whatever the timeouts say: so each call ends within max(timeout_s, ~4.5 s), never hangs.
- errors: a call the store cannot answer becomes the `OSError` the store counts for any tier (`read_errors`,
  `write_errors` here); a miss is `EntryNotFound`. A master restarted has lost every object (Mooncake keeps its index in
  memory): reads miss, and the client mounts its segment again by itself, so writes work again within seconds.
- capacity: kvtier accounts for what this instance put or adopted (`capacity_bytes`), as for the other tiers; the
  store itself evicts once its segments pass the master's high watermark (90 % by default), and an entry it evicted
  is a miss (`vanished`). Lend at least `capacity_bytes / 0.9` (the default lends `capacity_bytes * 1.25`).
Device time is the Mooncake call (the master round trip and the TCP transfer); host time the header, checksum and
copies. Every value passes through the client's local buffer, so the largest entry is `local_buffer_bytes` less a page.
"""

from __future__ import annotations

import os
import socket
import threading
from time import perf_counter_ns

import numpy as np

from .entry_format import MAX_KEY_BYTES, PAGE, EntryHeader, check_entry, entry_parts, file_name_for, unpack_header
from .errors import ConfigError, CorruptEntryError, EntryNotFound
from .tiers import Tier
from .timed_io import OpTiming, scratch

# Mooncake's error codes (mooncake-store/include/types.h) that this tier tells apart.
REPLICA_IS_NOT_READY = -703  # its put has not ended: not visible yet
OBJECT_NOT_FOUND = -704
RPC_ERRORS = range(-999, -899)  # -900 RPC_FAIL (master gone), -901 RPC_TIMEOUT (master hung), ...

MIB = 1 << 20
# The client refuses to lend less ("Total size must be at least 16777216").
MIN_SEGMENT_BYTES = 16 * MIB


class MooncakeTier(Tier):
    kind = "mooncake"
    max_key_bytes = MAX_KEY_BYTES  # the key is in each value's header

    def __init__(
        self,
        master: str,
        metadata_url: str,
        capacity_bytes: int,
        namespace: str = "kvtier",
        name: str = "mooncake",
        segment_bytes: int | None = None,
        local_buffer_bytes: int = 64 * MIB,
        timeout_s: float = 5.0,
        local_hostname: str | None = None,
    ) -> None:
        super().__init__(name, capacity_bytes)
        host, port = _host_port(master)
        if not metadata_url.startswith(("http://", "https://")):
            raise ConfigError(f"tier {name}: the metadata server is an http:// URL, not {metadata_url!r}")
        try:
            from mooncake.store import MooncakeDistributedStore
        except ImportError as exc:
            raise ConfigError(
                f"tier {name}: the Mooncake client is not installed (pip install 'kvtier[mooncake]'): {exc}"
            ) from None
        self.master = f"{host}:{port}"
        self.metadata_url = metadata_url
        self.namespace = namespace
        self.segment_bytes = int(
            segment_bytes if segment_bytes is not None else max(MIN_SEGMENT_BYTES, self.capacity_bytes * 1.25)
        )
        if self.segment_bytes < MIN_SEGMENT_BYTES:
            raise ConfigError(f"tier {name}: Mooncake lends at least 16 MiB of memory, not {self.segment_bytes} bytes")
        if local_buffer_bytes < MIN_SEGMENT_BYTES:
            raise ConfigError(f"tier {name}: the Mooncake client's local buffer is at least 16 MiB")
        self.local_buffer_bytes = int(local_buffer_bytes)
        self.timeout_ms = max(1, int(timeout_s * 1000))
        # Read by the client when it starts; a client already started in this process keeps what it read then.
        os.environ["MC_RPC_TIMEOUT_MS"] = str(self.timeout_ms)
        os.environ["MC_RPC_CONNECT_TIMEOUT_MS"] = str(self.timeout_ms)
        os.environ.setdefault("MC_STORE_CLIENT_SETUP_RETRIES", "1")
        # The address other clients reach this one's segment at: the one the route to the master leaves from.
        self.local_hostname = local_hostname or _local_address(host, port)
        self._unwritten = threading.local()  # the key whose write just failed in this thread (see delete)
        self._closed = False
        self._s = MooncakeDistributedStore()
        rc = self._s.setup(
            self.local_hostname,
            metadata_url,
            self.segment_bytes,
            self.local_buffer_bytes,
            "tcp",
            "",
            self.master,
        )
        if rc != 0:
            raise ConfigError(
                f"kvtier: the Mooncake client did not start with master {self.master} and metadata {metadata_url}: "
                f"error {rc} (a master or metadata server it cannot reach, or memory it cannot lend)"
            )

    def _mkey(self, key: str) -> str:
        return f"{self.namespace}:{file_name_for(key)}"

    def write(self, key, chunks, nbytes, shape=(), dtype="uint8"):
        t0 = perf_counter_ns()
        header, parts = entry_parts(key, chunks, nbytes, shape, dtype)
        mkey = self._mkey(key)
        d0 = perf_counter_ns()
        # The store keeps a key's first value: a put of a key it holds answers 0 and changes nothing (0.3.13.post1,
        # tests/kvconnector/tier_contract.py found it). An overwrite removes the old value first (force: past the
        # read lease), so a reader meanwhile gets the old entry or a miss, and then the new one.
        rc = self._s.is_exist(mkey)  # 1, 0, or an error: a master that does not answer, which the put would not either
        if rc == 1:
            self._s.remove(mkey, True)
        if rc >= 0:
            rc = self._s.put_parts(mkey, header, *parts)  # no concatenation: the client gathers the parts
        d1 = perf_counter_ns()
        if rc != 0:
            self.fallbacks["write_errors"] += 1
            self._unwritten.key = key
            raise OSError(f"mooncake put {mkey}: error {rc}")
        return OpTiming(host_ns=d0 - t0, device_ns=d1 - d0, nbytes=nbytes)

    def read(self, key, nbytes, dest=None):
        t0 = perf_counter_ns()
        header = scratch.header
        payload = dest[:nbytes] if dest is not None else scratch.data_buffer(nbytes)
        mkey = self._mkey(key)
        ptrs = [_address(header)] + ([_address(payload)] if nbytes else [])
        sizes = [PAGE] + ([nbytes] if nbytes else [])
        d0 = perf_counter_ns()
        (rc,) = self._s.batch_get_into_multi_buffers([mkey], [ptrs], [sizes])  # header and payload land in place
        d1 = perf_counter_ns()
        where = f"mooncake {mkey}"
        if rc in (OBJECT_NOT_FOUND, REPLICA_IS_NOT_READY):
            raise EntryNotFound(key)
        if rc < 0 and rc not in RPC_ERRORS:
            # The buffers do not fit the object (-600, -800): a value of another length is damaged, not an error.
            size = self._s.get_size(mkey)
            if size >= 0 and size != PAGE + nbytes:
                raise CorruptEntryError(f"{where}: holds {size} bytes, expected {PAGE + nbytes}")
            if size == OBJECT_NOT_FOUND:
                raise EntryNotFound(key)
        if rc < 0:
            self.fallbacks["read_errors"] += 1
            raise OSError(f"{where}: error {rc}")
        check_entry(header, payload, key, nbytes, where, rc)
        return OpTiming(host_ns=(perf_counter_ns() - t0) - (d1 - d0), device_ns=d1 - d0, nbytes=nbytes)

    def delete(self, key):
        if getattr(self._unwritten, "key", None) == key:
            # The store deletes what a failed write may have left; a put that failed left nothing readable, and
            # asking a master that just failed would cost a second timeout.
            self._unwritten.key = None
            return
        # force: past Mooncake's read lease (10 s after any get), which would otherwise keep an evicted entry's
        # memory; a reader still transferring it then fails its checksum, and is refused.
        rc = self._s.remove(self._mkey(key), True)
        if rc not in (0, OBJECT_NOT_FOUND):
            self.fallbacks["delete_errors"] += 1

    def probe(self, key: str) -> EntryHeader | None:
        """The header of `key` if some instance stored it (and it looks whole); else None. The whole object is read
        (Mooncake reads a part of an object only into memory registered with it): an adoption is followed by a load."""
        mkey = self._mkey(key)
        size = self._s.get_size(mkey)
        if size < 0:
            if size not in (OBJECT_NOT_FOUND, REPLICA_IS_NOT_READY):
                self.fallbacks["probe_errors"] += 1
            return None
        buf = scratch.data_buffer(size)
        rc = self._s.get_into(mkey, _address(buf), size)
        if rc != size:
            if rc not in (OBJECT_NOT_FOUND, REPLICA_IS_NOT_READY):
                self.fallbacks["probe_errors"] += 1
            return None
        try:
            hdr = unpack_header(buf[:PAGE], mkey)
            if size != PAGE + hdr.payload_nbytes:
                raise CorruptEntryError(f"{mkey}: {size} bytes, the header says {PAGE + hdr.payload_nbytes}")
        except CorruptEntryError:
            self.fallbacks["corrupt_removed"] += 1
            self._s.remove(mkey, True)
            return None
        return hdr if hdr.key == key else None

    def describe(self):
        return {
            **super().describe(),
            "master": self.master,
            "metadata_url": self.metadata_url,
            "namespace": self.namespace,
            "segment_bytes": self.segment_bytes,
            "local_buffer_bytes": self.local_buffer_bytes,
            "rpc_timeout_ms": self.timeout_ms,
            "local_hostname": self.local_hostname,
            "shared": True,
        }

    def close(self):
        if not self._closed:
            self._closed = True
            self._s.close()  # unmounts this client's segment: the objects in it are gone for every instance


def _address(buf) -> int:
    return np.frombuffer(buf, dtype=np.uint8).ctypes.data


def _host_port(master: str) -> tuple[str, int]:
    host, _, port = master.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"the Mooncake master is host:port, not {master!r}")
    return host.strip("[]"), int(port)


def _local_address(host: str, port: int) -> str:
    """The local address of the route to host (a UDP connect sends nothing)."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, port))
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"
