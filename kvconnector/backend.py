"""The kvtier backend that both LMCache adapters wrap: tiers below LMCache's own memory.

A local disk tier (timed O_DIRECT or buffered+fdatasync+fadvise I/O), then an optional shared directory, an optional
Redis/Valkey tier, an optional Mooncake Store tier and an optional S3 tier, under one waterfall LRU store
(`TieredStore`): a put goes to the top tier, an entry evicted from a tier is demoted to the next, the bottom tier
deletes; every tier is capacity-bounded.
On start the directories are rescanned (`persistence.rescan_dir`) so a restart serves what was there. A key missing
from this instance's index is looked up in the shared tiers, where another instance may have put it, and adopted.

The backend speaks plain strings and buffers; the adapters translate LMCache's keys and memory objects. Its methods
are blocking and thread-safe; the adapters run stores on `self.pool`, lookups and loads on `self.read_pool`. Failures
on the I/O path never raise into LMCache: a refused store (full filesystem, I/O error) and a failed load are counted
and reported as such.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from . import uring
from .backend_config import BackendConfig
from .errors import KvtierError, StorageFullError
from .files import atomic_path
from .mooncake_tier import MIB, MooncakeTier
from .persistence import rescan_dir
from .redis_tier import RedisTier
from .s3_tier import S3Tier
from .shared_tier import SharedDirTier, SharedTier
from .store import TieredStore
from .tiers import DiskTier
from .timed_io import scratch
from .units import GB

log = logging.getLogger(__name__)


class KvtierBackend:
    def __init__(self, cfg: BackendConfig) -> None:
        self.cfg = cfg
        tiers = []
        uring.set_pin_budget(int(cfg.io_uring_pin_gb * GB))
        if cfg.has_disk:
            tiers.append(
                DiskTier(cfg.disk_dir, int(cfg.disk_capacity_gb * GB), cfg.io_mode, name="disk", sync=cfg.sync)
            )
        if cfg.shared_dir:
            tiers.append(
                SharedDirTier(
                    cfg.shared_dir, int(cfg.shared_capacity_gb * GB), cfg.shared_io_mode, sync=cfg.shared_sync
                )
            )
        if cfg.redis_url:
            tiers.append(RedisTier(cfg.redis_url, int(cfg.redis_capacity_gb * GB), cfg.redis_namespace))
        if cfg.mooncake_master:
            segment_gb = cfg.mooncake_segment_gb
            tiers.append(
                MooncakeTier(
                    cfg.mooncake_master,
                    cfg.mooncake_metadata_url,
                    int(cfg.mooncake_capacity_gb * GB),
                    cfg.mooncake_namespace,
                    segment_bytes=int(segment_gb * GB) if segment_gb is not None else None,
                    local_buffer_bytes=int(cfg.mooncake_local_buffer_mb * MIB),
                    timeout_s=cfg.mooncake_timeout_s,
                    local_hostname=cfg.mooncake_local_hostname,
                )
            )
        if cfg.s3_bucket:
            tiers.append(
                S3Tier(
                    cfg.s3_bucket,
                    int(cfg.s3_capacity_gb * GB),
                    cfg.s3_prefix,
                    endpoint=cfg.s3_endpoint,
                    timeout_s=cfg.s3_timeout_s,
                    max_attempts=cfg.s3_max_attempts,
                    max_connections=2 * cfg.io_workers,
                )
            )
        self.store = TieredStore(tiers, target_usage_ratio=cfg.target_usage_ratio, promote_on_hit=cfg.promote_on_hit)
        self._shared = [i for i, t in enumerate(tiers) if isinstance(t, SharedTier)]
        self._events: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.rescan_reports: list[dict] = []
        if cfg.rescan_on_start:
            self._rescan()
        self.pool = ThreadPoolExecutor(cfg.io_workers, thread_name_prefix="kvtier-io")
        # Lookups and loads stand in the way of a request's first token; stores do not. Their own pool keeps them
        # from queueing behind a burst of durable (fdatasync'd) stores.
        self.read_pool = ThreadPoolExecutor(cfg.io_workers, thread_name_prefix="kvtier-read")
        for pool in (self.pool, self.read_pool):
            self._start_workers(pool, cfg.io_workers)
        self.exporter = None
        if cfg.metrics_port is not None:
            from .metrics import MetricsExporter

            try:
                self.exporter = MetricsExporter(self, cfg.metrics_host, cfg.metrics_port)
            except OSError as exc:
                self.pool.shutdown()
                self.read_pool.shutdown()
                self.store.close()
                raise KvtierError(
                    f"kvtier: cannot serve metrics on {cfg.metrics_host}:{cfg.metrics_port}: {exc}"
                ) from exc
        self._closed = False

    # ---- start-up ------------------------------------------------------------------------------------------------
    def _rescan(self) -> None:
        # Bottom tier first, so entries that fit nowhere higher are not demoted into a tier not yet scanned.
        for t in reversed(range(len(self.store.tiers))):
            tier = self.store.tiers[t]
            if isinstance(tier, DiskTier):
                shared = isinstance(tier, SharedDirTier)
                rep = rescan_dir(
                    self.store,
                    t,
                    verify_payload=self.cfg.rescan_verify_payload,
                    stale_tmp_s=self.cfg.shared_stale_tmp_s if shared else None,
                    shared=shared,
                )
                self.rescan_reports.append(rep.to_dict())
            elif isinstance(tier, (RedisTier, S3Tier)):
                n = 0
                for hdr in tier.scan():
                    n += self.store.adopt(t, hdr.key, hdr.payload_nbytes, hdr.shape, hdr.dtype)
                self.rescan_reports.append({"tier": tier.name, "adopted": n})

    def _start_workers(self, pool: ThreadPoolExecutor, n: int) -> None:
        """Start all n workers of a pool now, each with its page-aligned I/O buffers, so that the first request's
        load does not pay for them (ThreadPoolExecutor starts a thread per submit, lazily; the buffers are made per
        thread on first use): measured, the first cold L2 hit of each fresh stack was 1.5x the later ones."""
        barrier = threading.Barrier(n + 1)

        def ready() -> None:
            _ = scratch.header  # this thread's aligned buffers, made on first touch
            barrier.wait(30)

        futures = [pool.submit(ready) for _ in range(n)]
        try:
            barrier.wait(30)
        except threading.BrokenBarrierError:
            self.count("pool_start_incomplete")  # workers still start on demand; counted, never silent
            log.warning("kvtier: not every I/O worker started within 30 s; the rest start on first use")
        for f in futures:
            f.exception()

    # ---- events --------------------------------------------------------------------------------------------------
    def count(self, event: str, n: int = 1) -> None:
        with self._lock:
            self._events[event] += n

    def events_snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._events)

    # ---- operations (blocking, thread-safe) ------------------------------------------------------------------------
    def put(self, key: str, chunks: list[memoryview], shape: tuple = (), dtype: str = "uint8") -> bool:
        """Store an entry. True if it is stored now (or already was); False if refused (counted)."""
        try:
            r = self.store.put(key, chunks, shape, dtype)
        except StorageFullError:
            self.count("store_refused_full")
            return False
        except (OSError, KvtierError):
            self.count("store_errors")
            return False
        if r.stored:
            self.count("store_ok")
            return True
        if r.reason == "exists":
            self.count("store_exists")
            return True
        self.count("store_refused_no_room")
        return False

    def lookup(self, key: str, pin: bool = False) -> bool:
        """Whether the key is here (in this instance's index, or put into a shared tier by another instance)."""
        hit = self.store.contains(key) is not None or self._adopt_shared(key)
        if hit and pin:
            hit = self.store.pin(key)
        self.count("lookup_hits" if hit else "lookup_misses")
        return hit

    @property
    def has_shared_tiers(self) -> bool:
        """Whether a key missing from this instance's index may still be found (in a shared tier, by a probe)."""
        return bool(self._shared)

    def lookup_indexed(self, keys: list[str], pin: bool = False) -> list[bool]:
        """Which keys are in this instance's index (pinned if asked), from memory alone: no I/O, no pool, only the
        store's and the counters' short locks. A key missing here may still be in a shared tier (`lookup` probes
        it); the caller decides whether to ask. Hits are counted here, misses by whoever has the final word."""
        hits = [self.store.pin(k) if pin else self.store.contains(k) is not None for k in keys]
        n = sum(hits)
        if n:
            self.count("lookup_hits", n)
        return hits

    def _adopt_shared(self, key: str) -> bool:
        for t in self._shared:
            hdr = self.store.tiers[t].probe(key)
            if hdr is not None:
                if self.store.adopt(t, key, hdr.payload_nbytes, hdr.shape, hdr.dtype) or self.store.contains(key):
                    self.count("shared_adopted")
                    return True
        return False

    def info(self, key: str) -> tuple[int, tuple, str, str] | None:
        """(nbytes, shape, dtype, tier) of a known entry, looking into the shared tiers if needed."""
        info = self.store.entry_info(key)
        if info is None and self._adopt_shared(key):
            info = self.store.entry_info(key)
        return info

    def get_into(self, key: str, dest: memoryview) -> bool:
        """Read an entry into `dest` (exactly its size). False on a miss, a size mismatch or an error (counted)."""
        info = self.info(key)
        if info is None:
            self.count("load_misses")
            return False
        if info[0] != len(dest):
            self.count("load_size_mismatch")
            return False
        try:
            r = self.store.get(key, dest)
        except (OSError, KvtierError, ValueError):
            self.count("load_errors")
            return False
        self.count("load_hits" if r.hit else "load_misses")
        return r.hit

    def pin(self, key: str) -> bool:
        return self.store.pin(key)

    def unpin(self, key: str) -> bool:
        return self.store.unpin(key)

    def remove(self, key: str) -> bool:
        return self.store.delete(key)

    # ---- reporting -----------------------------------------------------------------------------------------------
    def snapshot(self) -> dict:
        return {
            "config": self.cfg.model_dump(exclude={"redis_url"}),
            "tiers": [
                {**t.describe(), **u, "fallbacks": dict(t.fallbacks), "stats": s.to_dict()}
                for t, u, s in zip(self.store.tiers, self.store.usage(), self.store.stats)
            ],
            "store_events": dict(self.store.events),
            "io_uring": uring.registry.describe(),
            "backend_events": self.events_snapshot(),
            "rescan": self.rescan_reports,
        }

    def write_snapshot(self, path: str) -> None:
        # 0600 like the entry files beside it: the snapshot names the directories and settings of this instance.
        with atomic_path(path, suffix=".json.tmp", mode=0o600) as tmp, open(tmp, "w") as fh:
            json.dump(self.snapshot(), fh, indent=1)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.pool.shutdown(wait=True)
        self.read_pool.shutdown(wait=True)
        path = self.cfg.resolved_snapshot_path()
        if path:
            try:
                self.write_snapshot(path)
            except OSError as exc:
                log.error("kvtier: could not write the statistics snapshot %s: %s", path, exc)
        if self.exporter is not None:
            self.exporter.close()
        self.store.close()
        uring.registry.withdraw_tagged(self)
