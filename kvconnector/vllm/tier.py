"""kvtier's tiers as a secondary tier of vLLM's own tiered KV offloading (`OffloadingConnector` with
`TieringOffloadingSpec`, vllm/v1/kv_offload/tiering/ in vLLM 0.32.0 and 0.34.0), no LMCache involved.

vLLM's `SecondaryTierFactory` loads it by class name and module path from the spec's config:

    "secondary_tiers": [{"type": "KvtierTier", "module_path": "kvconnector.vllm.tier",
                         "disk_dir": "/var/cache/kvtier", "disk_capacity_gb": 100}]

Every other key of that object is a key of `kvconnector.backend_config.BackendConfig` (the same keys as the LMCache
adapters' `adapter_params`), except the ones vLLM itself reads: `backpressure` (vLLM builds the detector) and
`locality` (`LOCAL` or `REMOTE`, for vLLM's per-request tier filter). Behind it is the same `KvtierBackend`: entry
files with checksummed headers, rescan on restart, waterfall LRU over disk, shared directory and Redis, telemetry and
the `kvtier_*` Prometheus exporter (`metrics_port`).

How vLLM drives a secondary tier (tiering/base.py): every call comes from the scheduler and must not block; data moves
only between this tier and the CPU primary tier's memory (`primary_kv_view[chunk_id]`, one row per chunk); stores and
loads are jobs, submitted and then polled with `get_finished_jobs`. What this class keeps:
- the scheduler thread does no I/O: `lookup` answers from the backend's in-memory index; a key missing there is probed
  in the shared tiers (where another instance may have put it) on the read pool, and answered RETRY until the probe is
  back, as vLLM's own fs tier does with its async lookups;
- each key of a job runs on the backend's pools (stores on `pool`, loads on `read_pool`); the last key to finish
  reports the job, once, with the keys that succeeded. A job is reported only when none of its I/O can touch the
  primary memory any more (vLLM reuses those chunks as soon as it hears), and `drain_jobs` waits for every one;
- an entry's key is `<vLLM's storage namespace>_r<rank>/<offload key hex>`: the namespace is the base name vLLM's own
  fs tier uses (`FileMapper`: model, dtype, block size, KV groups, parallel layout), so two models or layouts never
  share an entry, and kvtier names the file by a hash of the key, as on the LMCache path;
- a load that fails (a corrupt or vanished entry) fails only its own keys; the entry is dropped by the backend, so
  the next lookup is a miss and vLLM recomputes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadingConnectorStats
from vllm.v1.kv_offload.base import (
    Locality,
    LookupResult,
    Medium,
    OffloadingCounterMetadata,
    OffloadingGaugeMetadata,
    OffloadingMetricMetadata,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
)
from vllm.v1.kv_offload.file_mapper import FileMapper
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob

from ..backend import KvtierBackend
from ..backend_config import BackendConfig

if TYPE_CHECKING:
    from vllm.v1.kv_offload.base import OffloadingSpec
    from vllm.v1.kv_offload.tiering.backpressure import BackpressureDetector

log = logging.getLogger(__name__)

# The `type` users write in the tier config, and this module's path.
TIER_TYPE = "KvtierTier"
MODULE_PATH = __name__


class KvtierMetrics:
    """Metric names this tier reports through vLLM's offloading stats, beside the ones vLLM's tiering manager
    reports for every secondary tier (read/write bytes and time, chunk queries and hits, job failures:
    `TieringOffloadingMetrics` in tiering/base.py). Labels: `tier` as vLLM writes it (`<index>:<type>`),
    `kvtier_tier` the level inside kvtier (disk, shared, redis)."""

    USED_BYTES = "vllm:kv_offload_tiering_kvtier_used_bytes"
    CAPACITY_BYTES = "vllm:kv_offload_tiering_kvtier_capacity_bytes"
    ENTRIES = "vllm:kv_offload_tiering_kvtier_entries"
    TIER_EVENTS = "vllm:kv_offload_tiering_kvtier_tier_events"
    BACKEND_EVENTS = "vllm:kv_offload_tiering_kvtier_backend_events"


_LEVEL_LABELS = ("tier", "kvtier_tier")


@dataclass(slots=True)
class _Job:
    job: TransferJob
    keys: list[OffloadKey]
    pending: int
    ok: list[bool] = field(default_factory=list)
    # When the first of its keys started its I/O: vLLM's transfer_time is the data movement, not the queueing before.
    start_ns: int = 1 << 62


class KvtierTier(SecondaryTierManager):
    medium: ClassVar[Medium] = Medium.STORAGE

    def __init__(
        self,
        offloading_spec: OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: BackpressureDetector | None = None,
        locality: str | None = None,
        **params: Any,
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        cfg = BackendConfig.from_params(params)  # one-line ConfigError naming the key; vLLM then refuses to start
        self.locality = Locality(locality) if locality is not None else None
        self._namespace = _namespace(offloading_spec)
        self.label = (_tier_label(offloading_spec, tier_type, params),)
        self.backend = KvtierBackend(cfg)
        # One flat byte view over the primary tier's rows: chunk c is [c * size, (c + 1) * size). Made last: if the
        # constructor fails, vLLM closes the primary tier's mmap, which a leftover view would keep from closing.
        self._flat = primary_kv_view.cast("B") if primary_kv_view.ndim != 1 else primary_kv_view
        # Jobs in flight; a job leaves (and `_done` is notified) when its result is queued for the scheduler.
        self._done = threading.Condition()
        self._jobs: dict[int, _Job] = {}
        self._finished: deque[JobResult] = deque()
        # Shared-tier probes in flight, touched only by the scheduler thread: key -> future, request -> its keys.
        self._probes: dict[str, Future] = {}
        self._probes_by_req: dict[str, set[str]] = {}
        self._reported: dict[tuple[str, ...], int] = {}
        log.info(
            "kvtier secondary tier %s ready: %s, chunk %d bytes, rescan %s",
            self.label[0],
            [t.describe() for t in self.backend.store.tiers],
            self.block_size_bytes,
            self.backend.rescan_reports,
        )

    def key_of(self, key: OffloadKey) -> str:
        return f"{self._namespace}/{bytes(key).hex()}"

    def _chunk(self, chunk_id: int) -> memoryview:
        size = self.block_size_bytes
        start = int(chunk_id) * size
        return self._flat[start : start + size]

    # ---- lookups ---------------------------------------------------------------------------------------------------
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        k = self.key_of(key)
        if self.backend.lookup_indexed([k])[0]:
            return LookupResult.HIT
        if not self.backend.has_shared_tiers:
            self.backend.count("lookup_misses")
            return LookupResult.MISS
        probe = self._probes.get(k)
        if probe is None:
            self._probes[k] = self.backend.read_pool.submit(self.backend.lookup, k)
            self._probes_by_req.setdefault(req_context.req_id, set()).add(k)
            return LookupResult.RETRY
        if not probe.done():
            return LookupResult.RETRY
        del self._probes[k]
        hit = probe.exception() is None and probe.result()
        return LookupResult.HIT if hit else LookupResult.MISS

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: ReqContext) -> None:
        for k in self._probes_by_req.pop(req_context.req_id, ()):
            self._probes.pop(k, None)

    def has_pending_work(self) -> bool:
        return any(not f.done() for f in self._probes.values())

    # ---- jobs ------------------------------------------------------------------------------------------------------
    def submit_store(self, job_metadata: TransferJob) -> None:
        self._submit(job_metadata, self.backend.pool, self._store_one)

    def submit_load(self, job_metadata: TransferJob) -> None:
        self._submit(job_metadata, self.backend.read_pool, self._load_one)

    def _submit(self, job_metadata: TransferJob, pool, one) -> None:
        keys = list(job_metadata.keys)
        chunk_ids = [int(c) for c in job_metadata.chunk_ids]
        assert len(keys) == len(chunk_ids), f"{len(keys)} keys but {len(chunk_ids)} chunk ids"
        if not keys:
            self._finished.append(JobResult(job_id=job_metadata.job_id, success=True, transfer_time=0.0))
            return
        job = _Job(job_metadata, keys, pending=len(keys), ok=[False] * len(keys))
        with self._done:
            self._jobs[job_metadata.job_id] = job
        for i, (key, cid) in enumerate(zip(keys, chunk_ids)):
            pool.submit(self._run_key, job, i, one, self.key_of(key), cid)

    def _store_one(self, k: str, chunk_id: int) -> bool:
        return self.backend.put(k, [self._chunk(chunk_id)], (self.block_size_bytes,), "uint8")

    def _load_one(self, k: str, chunk_id: int) -> bool:
        return self.backend.get_into(k, self._chunk(chunk_id))

    def _run_key(self, job: _Job, i: int, one, k: str, chunk_id: int) -> None:
        """On a pool thread: one key's I/O, then its share of the job's completion (the last key reports the job)."""
        t0 = time.perf_counter_ns()
        try:
            ok = bool(one(k, chunk_id))
        except Exception:  # the backend counts the failures it expects; anything else is counted here, never lost
            self.backend.count("job_key_errors")
            log.exception("kvtier: a %s of job %d failed", "load" if job.job.is_promotion else "store", job.job.job_id)
            ok = False
        with self._done:
            job.ok[i] = ok
            job.start_ns = min(job.start_ns, t0)
            job.pending -= 1
            if job.pending:
                return
            n_ok = sum(job.ok)
            result = JobResult(
                job_id=job.job.job_id,
                success=n_ok == len(job.keys),
                transfer_time=(time.perf_counter_ns() - job.start_ns) / 1e9,
                transfer_bytes=n_ok * self.block_size_bytes,
            )
            if job.job.is_promotion and 0 < n_ok < len(job.keys):
                result.successful_keys = tuple(key for key, good in zip(job.keys, job.ok) if good)
            # Reported only now: no I/O of this job touches the primary memory any more.
            self._finished.append(result)
            del self._jobs[job.job.job_id]
            self._done.notify_all()

    def get_finished_jobs(self) -> Iterable[JobResult]:
        out = []
        while self._finished:
            out.append(self._finished.popleft())
        return out

    def drain_jobs(self) -> None:
        with self._done:
            self._done.wait_for(lambda: not self._jobs)

    def shutdown(self) -> None:
        self.drain_jobs()
        self.backend.close()
        # vLLM closes the primary tier's mmap next, which fails while a view of it is still exported.
        if self._flat is not self._primary_kv_view:
            self._flat.release()

    # ---- metrics ---------------------------------------------------------------------------------------------------
    @classmethod
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, OffloadingMetricMetadata]:
        return {
            KvtierMetrics.USED_BYTES: OffloadingGaugeMetadata("Bytes held in each kvtier tier.", _LEVEL_LABELS),
            KvtierMetrics.CAPACITY_BYTES: OffloadingGaugeMetadata("Capacity of each kvtier tier.", _LEVEL_LABELS),
            KvtierMetrics.ENTRIES: OffloadingGaugeMetadata("Entries in each kvtier tier.", _LEVEL_LABELS),
            KvtierMetrics.TIER_EVENTS: OffloadingCounterMetadata(
                "kvtier tier events (hits, evictions, demotions, corrupt_dropped, vanished, enospc, rescan_*).",
                (*_LEVEL_LABELS, "event"),
            ),
            KvtierMetrics.BACKEND_EVENTS: OffloadingCounterMetadata(
                "kvtier backend events (lookup_hits/misses, load_hits/misses, store_ok, store_refused_*, errors).",
                ("tier", "event"),
            ),
        }

    def get_stats(self) -> OffloadingConnectorStats | None:
        stats = OffloadingConnectorStats()
        for u in self.backend.store.usage():
            labels = (*self.label, u["tier"])
            stats.set_gauge(KvtierMetrics.USED_BYTES, u["used_bytes"], labels)
            stats.set_gauge(KvtierMetrics.CAPACITY_BYTES, u["capacity_bytes"], labels)
            stats.set_gauge(KvtierMetrics.ENTRIES, u["entries"], labels)
        # Counters go to vLLM as increments since the last call.
        for tier, st in zip(self.backend.store.tiers, self.backend.store.stats):
            for event, n in (st.events + tier.counters).items():
                self._report_delta(stats, KvtierMetrics.TIER_EVENTS, (*self.label, tier.name, event), n)
        for event, n in self.backend.events_snapshot().items():
            self._report_delta(stats, KvtierMetrics.BACKEND_EVENTS, (*self.label, event), n)
        return stats

    def _report_delta(self, stats: OffloadingConnectorStats, name: str, labels: tuple[str, ...], total: int) -> None:
        delta = total - self._reported.get((name, *labels), 0)
        if delta > 0:
            stats.increase_counter(name, delta, labels)
            self._reported[(name, *labels)] = total


def _namespace(spec: OffloadingSpec) -> str:
    """vLLM's own storage namespace for this engine (what its fs tier names its directory by), without a root."""
    mapper = FileMapper.from_offloading_spec(
        root_dir="vllm", offloading_spec=spec, blocks_per_file=spec.blocks_per_chunk, parallel_agnostic=True
    )
    return f"{mapper.base_path}_r{mapper.rank}"


def _tier_label(spec: OffloadingSpec, tier_type: str, params: dict[str, Any]) -> str:
    """The `tier` label vLLM's tiering manager gives this tier (`<index + 1>:<type>`, tiering/metrics.py). A tier is
    not told its index, so it is found in the spec's list of tier configs: the entry of this type with these params."""
    for i, cfg in enumerate(getattr(spec, "secondary_tier_configs", ())):
        if cfg.get("type") == tier_type and all(cfg.get(k) == v for k, v in params.items()):
            return f"{i + 1}:{tier_type}"
    return f"?:{tier_type}"


__all__ = ["MODULE_PATH", "TIER_TYPE", "KvtierMetrics", "KvtierTier"]
