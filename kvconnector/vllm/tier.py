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
  the next lookup is a miss and vLLM recomputes;
- with `enable_kv_events` (and vLLM's KV events on), the tier yields vLLM's `OffloadingEvent`s from `take_events`, as
  vLLM's fs and object tiers do: stored when a key enters kvtier's index (a store, a shared entry adopted, and at
  start every entry the rescan found), removed when it leaves kvtier altogether (evicted from its last level, dropped
  as corrupt, vanished); a demotion inside kvtier is no event. Medium STORAGE, ownership `kvtier`, and
  `removal_expected` (the connector keeps a stored chunk's payload until its removal, as for vLLM's kvcr tier).
"""

from __future__ import annotations

import dataclasses
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
    OffloadingEvent,
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
from ..errors import ConfigError

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
    USAGE_PERC = "vllm:kv_offload_tiering_kvtier_usage_perc"
    ENTRIES = "vllm:kv_offload_tiering_kvtier_entries"
    TIER_EVENTS = "vllm:kv_offload_tiering_kvtier_tier_events"
    BACKEND_EVENTS = "vllm:kv_offload_tiering_kvtier_backend_events"


_LEVEL_LABELS = ("tier", "kvtier_tier")

# The tier's name in its KV events (BlockStored/BlockRemoved `ownership`): the connector keeps one residency per
# (medium, ownership), so kvtier's removals never clear what another STORAGE tier holds.
EVENT_OWNERSHIP = "kvtier"
# vLLM 0.34 carries the storing request on a stored event (the connector builds the full payload from it); 0.32 has no
# such field.
_EVENT_HAS_REQ_CONTEXT = "req_context" in {f.name for f in dataclasses.fields(OffloadingEvent)}


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
        enable_kv_events: bool = False,
        **params: Any,
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        if not isinstance(enable_kv_events, bool):  # checked before anything is opened
            raise ConfigError(
                f"kvtier: invalid configuration: enable_kv_events: must be true or false, not {enable_kv_events!r}"
            )
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
        self._events_on = self._kv_events_wanted(offloading_spec, tier_type, enable_kv_events)
        # Index changes as (present, key, storing request or None), appended by the store's key listener (I/O threads)
        # and drained by `take_events` (the scheduler); the requests of store jobs in flight, by kvtier key.
        self._changes: deque[tuple[bool, str, ReqContext | None]] = deque()
        self._store_ctx: dict[str, ReqContext] = {}
        if self._events_on:
            held = self.backend.store.watch_keys(self._on_key)
            # What the rescan found is announced once, so a router learns it after a restart.
            self._changes.extend((True, k, None) for k in held if k.startswith(self._prefix))
        log.info(
            "kvtier secondary tier %s ready: %s, chunk %d bytes, rescan %s",
            self.label[0],
            [t.describe() for t in self.backend.store.tiers],
            self.block_size_bytes,
            self.backend.rescan_reports,
        )

    @property
    def _prefix(self) -> str:
        return f"{self._namespace}/"

    def key_of(self, key: OffloadKey) -> str:
        return f"{self._prefix}{bytes(key).hex()}"

    def offload_key_of(self, k: str) -> OffloadKey | None:
        """The offload key a kvtier key of this engine's namespace was made from (None for another namespace's)."""
        if not k.startswith(self._prefix):
            return None
        try:
            return OffloadKey(bytes.fromhex(k[len(self._prefix) :]))
        except ValueError:
            return None

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
        if self._events_on and not job_metadata.is_promotion:
            ctx = getattr(job_metadata, "req_context", None)
            if ctx is not None:
                self._store_ctx.update((self.key_of(key), ctx) for key in keys)
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
            if self._events_on and not job.job.is_promotion:
                for key in job.keys:
                    self._store_ctx.pop(self.key_of(key), None)
            # Reported only now: no I/O of this job touches the primary memory any more.
            self._finished.append(result)
            del self._jobs[job.job.job_id]
            self._done.notify_all()

    def get_finished_jobs(self) -> Iterable[JobResult]:
        out = []
        while self._finished:
            out.append(self._finished.popleft())
        return out

    # ---- KV events ---------------------------------------------------------------------------------------------------
    @staticmethod
    def _kv_events_wanted(spec: OffloadingSpec, tier_type: str, enable_kv_events: bool) -> bool:
        """As vLLM's fs tier decides: the tier's key asks for events, and vLLM publishes KV events at all (otherwise
        nobody drains `take_events`, and the tier keeps none)."""
        if not enable_kv_events:
            return False
        cfg = getattr(spec, "kv_events_config", None)
        if cfg is None or not cfg.enable_kv_cache_events:
            log.warning(
                "enable_kv_events is set on secondary tier '%s' but KV cache events are disabled globally "
                "(kv_events_config); the tier will not emit events.",
                tier_type,
            )
            return False
        return True

    def _on_key(self, k: str, present: bool) -> None:
        """The store's key listener: runs under the store's lock on an I/O thread, so it only appends."""
        if k.startswith(self._prefix):
            self._changes.append((present, k, self._store_ctx.get(k) if present else None))

    def take_events(self) -> Iterable[OffloadingEvent]:
        """The index changes since the last call, in their order, one event per run of stores (of one request) or
        removals, for the connector to publish as BlockStored / BlockRemoved."""
        events: list[OffloadingEvent] = []
        run_key = None
        while self._changes:
            present, k, ctx = self._changes.popleft()
            key = self.offload_key_of(k)
            if key is None:
                continue
            if run_key != (present, id(ctx)) or not events:
                events.append(self._event([], removed=not present, ctx=ctx))
                run_key = (present, id(ctx))
            events[-1].keys.append(key)
        return events

    def _event(self, keys: list[OffloadKey], *, removed: bool, ctx: ReqContext | None) -> OffloadingEvent:
        extra = {"req_context": ctx} if _EVENT_HAS_REQ_CONTEXT and ctx is not None else {}
        return OffloadingEvent(
            keys=keys,
            medium=self.medium,
            removed=removed,
            locality=self.locality,
            ownership=EVENT_OWNERSHIP,
            removal_expected=True,
            **extra,
        )

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
            KvtierMetrics.USAGE_PERC: OffloadingGaugeMetadata(
                "Fraction of each kvtier tier's capacity in use (0.0-1.0).", _LEVEL_LABELS
            ),
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
            stats.set_gauge(KvtierMetrics.USAGE_PERC, _fraction(u["used_bytes"], u["capacity_bytes"]), labels)
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


def _fraction(used: int, capacity: int) -> float:
    return used / capacity if capacity > 0 else 0.0


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


__all__ = ["EVENT_OWNERSHIP", "MODULE_PATH", "TIER_TYPE", "KvtierMetrics", "KvtierTier"]
