"""Drive vLLM's real `TieringOffloadingManager` through the calls its scheduler makes, with no engine and no GPU.

`ManagerDriver` builds a real `TieringOffloadingSpec` through vLLM's `OffloadingSpecFactory` from an
`OffloadingConfig` (the normalized config vLLM hands an offloading spec), and from it the manager, the primary CPU
tier and the secondary tiers exactly as vLLM does (`spec.get_manager()`, `SecondaryTierFactory`). Then it makes the
scheduler's calls: `on_new_request`, `prepare_store` / `complete_store` (the cascade to every secondary tier),
`lookup` (a secondary hit starts a promotion), `on_schedule_end` (one engine step), `prepare_load` / `complete_load`,
`on_request_finished`, `reset_cache`.

The one stand-in is vLLM's GPU worker (`CPUOffloadingWorker`, which asserts CUDA tensors): where it would copy GPU
blocks into the primary tier's chunks and back, `GpuStandIn` writes and reads those chunks in the primary memory.
Used by the tests, `benchmarks/vllm_tier_vs_fs.py` and the CPU half of `benchmarks/gpu_check_vllm_tier.sh`.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Sequence

from vllm.v1.kv_offload.base import LookupResult, OffloadKey, ReqContext, ScheduleEndContext, make_offload_key
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.factory import OffloadingSpecFactory

from .tier import MODULE_PATH, TIER_TYPE

_STEP = ScheduleEndContext(new_req_ids=(), preempted_req_ids=())


def kvtier_tier_config(**backend_params) -> dict:
    """A `secondary_tiers` entry for kvtier, as users write it in `kv_connector_extra_config`."""
    return {"type": TIER_TYPE, "module_path": MODULE_PATH, **backend_params}


def fs_tier_config(root_dir: str, **params) -> dict:
    """A `secondary_tiers` entry for vLLM's own filesystem tier."""
    return {"type": "fs", "root_dir": root_dir, **params}


def offloading_config(
    extra_config: dict,
    chunk_bytes: int,
    *,
    model: str = "kvtier-driver",
    engine_id: str | None = None,
    kv_events: bool = False,
) -> OffloadingConfig:
    """One KV group, one worker, one block per chunk of `chunk_bytes` (a page multiple, as vLLM aligns chunks);
    `kv_events` is vLLM's global KV events switch (`--kv-events-config '{"enable_kv_cache_events": true}'`)."""
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("model.layers.0",), group_id=0),),
        worker_kv_bytes_per_block=chunk_bytes,
        enable_kv_cache_events=kv_events,
        extra_config=extra_config,
        engine_id=engine_id or f"kvtier-driver-{uuid.uuid4().hex[:12]}",
        model=OffloadingModelConfig(name=model, dtype="float16"),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0,
            world_size=1,
            tp_size=1,
            pp_size=1,
            pcp_size=1,
            dcp_size=1,
            data_parallel_index=0,
            data_parallel_size=1,
            data_parallel_rank_local=None,
            is_parallelism_agnostic=True,
        ),
    )


def primary_region_path(engine_id: str) -> str:
    """Where vLLM's CPU primary tier keeps its shared memory (SharedOffloadRegion, vllm/v1/kv_offload/cpu/): a
    process killed with SIGKILL leaves it behind, so whoever kills one removes it."""
    return f"/dev/shm/vllm_offload_{engine_id}.mmap"


def chunk_key(i: int, salt: bytes = b"") -> OffloadKey:
    """An offload key as vLLM makes one: a 32-byte block hash and the KV group index."""
    import hashlib

    return make_offload_key(hashlib.sha256(salt + i.to_bytes(8, "big")).digest(), 0)


class GpuStandIn:
    """What vLLM's GPU worker does to the primary tier's chunks, done in host memory (there is no GPU here)."""

    def __init__(self, primary_view: memoryview) -> None:
        self.chunk_bytes = primary_view.strides[0]
        self._view = primary_view
        self.flat = primary_view.cast("B") if primary_view.ndim != 1 else primary_view

    def write(self, chunk_id: int, data) -> None:
        start = int(chunk_id) * self.chunk_bytes
        mv = memoryview(data).cast("B")
        self.flat[start : start + len(mv)] = mv

    def read(self, chunk_id: int) -> bytes:
        start = int(chunk_id) * self.chunk_bytes
        return bytes(self.flat[start : start + self.chunk_bytes])

    def release(self) -> None:
        # The primary tier's mmap cannot be closed while a view of it is exported.
        if self.flat is not self._view:
            self.flat.release()


class _Locked:
    """The manager's methods, each called holding its lock: vLLM 0.34 asks callers to hold `manager.lock` across its
    calls (a tier-poll thread may enter too; its `shutdown` takes the lock itself); 0.32 has no lock."""

    def __init__(self, manager) -> None:
        self._manager = manager
        self._lock = getattr(manager, "lock", None) or contextlib.nullcontext()

    def __getattr__(self, name: str):
        fn = getattr(self._manager, name)

        def locked(*args, **kwargs):
            with self._lock:
                return fn(*args, **kwargs)

        return locked


class DriverTimeout(RuntimeError):
    """The manager still had work in flight at the deadline."""


class ManagerDriver:
    def __init__(
        self,
        secondary_tiers: list[dict],
        chunk_bytes: int,
        cpu_bytes: int,
        *,
        model: str = "kvtier-driver",
        engine_id: str | None = None,
        kv_events: bool = False,
    ) -> None:
        extra = {
            "spec_name": "TieringOffloadingSpec",
            "cpu_bytes_to_use": cpu_bytes,
            "secondary_tiers": secondary_tiers,
        }
        # vLLM's own path: the connector asks the spec factory for `spec_name`, then the spec for its manager.
        self.spec = OffloadingSpecFactory.create_spec(
            offloading_config(extra, chunk_bytes, model=model, engine_id=engine_id, kv_events=kv_events)
        )
        self.manager = self.spec.get_manager()
        self._m = _Locked(self.manager)
        self.gpu = GpuStandIn(self.manager.primary_tier.get_kv_memoryview())
        self.chunk_bytes = self.gpu.chunk_bytes
        self.num_chunks = self.spec.num_chunks
        self._req = 0
        self._events_tracker = None

    @property
    def tiers(self) -> list:
        return self.manager.secondary_tiers

    def _new_request(self) -> ReqContext:
        self._req += 1
        rc = ReqContext(req_id=f"req-{self._req}")
        self._m.on_new_request(rc)
        return rc

    def step(self) -> None:
        self._m.on_schedule_end(_STEP)

    def settle(self, timeout_s: float = 120.0) -> None:
        """Step until no transfer is in flight (cascades and promotions), as an idle engine keeps stepping."""
        deadline = time.monotonic() + timeout_s
        self.step()
        while self._m.has_pending_work():
            if time.monotonic() > deadline:
                raise DriverTimeout(f"transfers still in flight after {timeout_s} s")
            time.sleep(0.0002)
            self.step()

    def store(self, keys: Sequence[OffloadKey], payloads: Sequence, *, settle: bool = True) -> int:
        """Store chunks the way a request's prefill does: into the primary tier, which cascades them to every secondary
        tier. Returns how many the primary took (it refuses when every chunk is pinned)."""
        rc = self._new_request()
        out = self._m.prepare_store(list(keys), rc)
        stored = []
        if out is not None:
            by_key = dict(zip(keys, payloads))
            for key, cid in zip(out.keys_to_store, out.store_spec.chunk_ids):
                self.gpu.write(cid, by_key[key])
            stored = list(out.keys_to_store)
            self._m.complete_store(stored, rc, True)
        self._m.on_request_finished(rc)
        if settle:
            self.settle()
        return len(stored)

    def drop_primary(self) -> None:
        """Empty the CPU primary tier (what vLLM does on reset_cache); the secondary tiers keep their entries."""
        self._m.reset_cache()
        # vLLM 0.34 then holds promotions until the connector has heard from its workers about every transfer in
        # flight at the reset (`on_reset_flushed`); the GPU stand-in has none in flight. 0.32 has no such hold.
        if hasattr(self.manager, "on_reset_flushed"):
            self._m.on_reset_flushed()

    def _resolve(self, requests: list[tuple[ReqContext, list]], timeout_s: float) -> dict[OffloadKey, LookupResult]:
        """Each step, look up every unresolved key of every request (a secondary hit starts a promotion, which the
        step submits), until each is HIT or MISS."""
        deadline = time.monotonic() + timeout_s
        results: dict[OffloadKey, LookupResult] = {}
        todo = [(rc, key) for rc, keys in requests for key in keys]
        while todo:
            waiting = []
            for rc, key in todo:
                r = self._m.lookup(key, rc)
                if r in (LookupResult.HIT, LookupResult.MISS):
                    results[key] = r
                else:
                    waiting.append((rc, key))
            todo = waiting
            self.step()
            if todo:
                if time.monotonic() > deadline:
                    raise DriverTimeout(f"{len(todo)} lookups unresolved after {timeout_s} s")
                time.sleep(0.0002)
        return results

    def load(self, keys: Sequence[OffloadKey], timeout_s: float = 120.0) -> dict[OffloadKey, bytes | None]:
        """Look the keys up as one request (promoting from secondary tiers), then read the hits out of the primary
        as the GPU worker would. None for a miss."""
        return self.load_many([keys], timeout_s)

    def load_many(self, batches: Sequence[Sequence[OffloadKey]], timeout_s: float = 120.0) -> dict:
        """`load` for several requests at once, their lookups and promotions in the same steps (one promotion job
        per request, as vLLM submits them)."""
        requests = [(self._new_request(), list(keys)) for keys in batches]
        results = self._resolve(requests, timeout_s)
        data: dict[OffloadKey, bytes | None] = {}
        for rc, keys in requests:
            data.update(dict.fromkeys(keys))
            hits = [k for k in keys if results[k] is LookupResult.HIT]
            if hits:
                spec = self._m.prepare_load(hits, rc)
                for key, cid in zip(hits, spec.chunk_ids):
                    data[key] = self.gpu.read(cid)
                self._m.complete_load(hits, rc)
            self._m.on_request_finished(rc)
        self.step()
        return data

    def take_events(self) -> list:
        """The manager's raw `OffloadingEvent`s since the last call (every tier's, primary first)."""
        return list(self._m.take_events())

    def kv_cache_events(self) -> list:
        """What the connector would publish since the last call: the manager's events through vLLM's own
        `OffloadingEventsTracker` (the scheduler's `take_events`), as BlockStored / BlockRemoved."""
        if self._events_tracker is None:
            from vllm.distributed.kv_transfer.kv_connector.v1.offloading.events import OffloadingEventsTracker

            self._events_tracker = OffloadingEventsTracker(self.spec.kv_events_config)
        return list(self._events_tracker.take_events(self.take_events()))

    def stats(self) -> dict:
        """vLLM's offloading stats since the last call (what the connector sends to its Prometheus logger)."""
        s = self._m.get_stats()
        return s.data if s is not None else {}

    def close(self) -> None:
        self.gpu.release()
        self.manager.shutdown()

    def __enter__(self) -> ManagerDriver:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
