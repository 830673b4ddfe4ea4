"""MP mode: kvtier as an LMCache L2 adapter (`L2AdapterInterface`), loaded by the LMCache MP server with

    --l2-adapter '{"type":"plugin","module_path":"kvconnector.lmcache.l2_adapter",
                   "class_name":"KvtierL2Adapter","adapter_params":{"disk_dir":"/var/cache/kvtier", ...}}'

`adapter_params` are the keys of `kvconnector.backend_config.BackendConfig` (bare or `kvtier.`-prefixed).
A thin layer: keys become strings, memory objects become byte views, every key of a store or load task runs on one of
the backend's I/O pools, and the last one to finish completes the task and signals its event fd. Lookup-and-lock is
answered from the in-memory index on the caller's thread (LMCache asks it on every request, L1 hits included, so it
does no I/O and waits for no pool; only keys to be probed in a shared tier go to the read pool) and pins the entries
found, so no eviction or demotion moves them before the load; unlock unpins them.

Supported: lmcache 0.5.6 (pinned) and 0.5.7rc2. What 0.5.7 added to `L2AdapterInterface`
(lmcache/v1/distributed/l2_adapters/base.py) and how kvtier answers it:
- `get_memory_tags()` (abstract): STORAGE, LOCAL for a local disk tier only; STORAGE, REMOTE as soon as a shared
  directory or Redis tier is configured (LMCache's own fs adapter says REMOTE when its `shared` flag is set): a hit may
  then be served from storage other hosts write into, which is what REMOTE means to LMCache's prefetch filter.
- `submit_touch(keys)`: the keys kvtier holds move to the most recently used end of their tier's LRU (memory only, no
  byte moves), so an L1 hit keeps its L2 copy from being the next victim.
Both versions' plugin factory (plugin_l2_adapter._resolve_config_class) looks for `<class_name>Config` in this module:
`KvtierL2AdapterConfig` validates `adapter_params` there and the adapter receives it instead of a dict.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import TYPE_CHECKING

from lmcache.lmcache_native import Bitmap
from lmcache.v1.distributed.internal_api import L2StoreResult
from lmcache.v1.distributed.l2_adapters.base import L2AdapterInterface, L2TaskId
from lmcache.v1.distributed.l2_adapters.config import L2AdapterConfigBase
from lmcache.v1.platform import create_event_notifier

from ..backend import KvtierBackend
from ..backend_config import BackendConfig
from ._common import build_backend_or_refuse, byte_view, config_or_refuse

try:  # lmcache >= 0.5.7: adapters report where their bytes live
    from lmcache.v1.distributed.api import MemoryResidency, MemorySegment, MemoryTags
except ImportError:  # lmcache 0.5.6 has no memory tags and never asks for them
    MemoryTags = None

if TYPE_CHECKING:
    from lmcache.v1.distributed.api import MemoryLayoutDesc, ObjectKey
    from lmcache.v1.memory_management import MemoryObj

log = logging.getLogger(__name__)


def object_key_str(key: ObjectKey) -> str:
    """Every field of the key, '@'-separated (LMCache forbids '@' in model names and salts). Never used as a path."""
    return f"{key.model_name}@{key.kv_rank:x}@{key.object_group_id:x}@{key.chunk_hash.hex()}@{key.cache_salt}"


class KvtierL2AdapterConfig(L2AdapterConfigBase):
    """`adapter_params`, validated when LMCache builds the adapter (found by its name, `<class_name>Config`)."""

    def __init__(self, backend: BackendConfig) -> None:
        self.backend = backend

    @classmethod
    def from_dict(cls, d: dict) -> KvtierL2AdapterConfig:
        return cls(config_or_refuse(d, "params", "L2 adapter"))

    @classmethod
    def help(cls) -> str:
        return (
            "kvtier L2 adapter: adapter_params are the keys of kvconnector.backend_config.BackendConfig "
            "(kvconnector/README.md), e.g. "
            '{"type": "plugin", "module_path": "kvconnector.lmcache.l2_adapter", "class_name": "KvtierL2Adapter", '
            '"adapter_params": {"disk_dir": "/var/cache/kvtier", "disk_capacity_gb": 100}}'
        )


class KvtierL2Adapter(L2AdapterInterface):
    def __init__(
        self, config: KvtierL2AdapterConfig | dict | None = None, l1_memory_desc=None, **kwargs: object
    ) -> None:
        """config: what LMCache's plugin factory hands over (a KvtierL2AdapterConfig), or the raw adapter_params.
        l1_memory_desc and any keyword a later LMCache passes are accepted and unused (kvtier copies through byte
        views of the memory objects it is given, it registers no L1 buffer)."""
        if isinstance(config, KvtierL2AdapterConfig):
            config = config.backend
        self.backend: KvtierBackend = build_backend_or_refuse(config, "params", "L2 adapter")
        # Capacity 0: LMCache's own L2 eviction stays off; kvtier bounds and evicts its tiers itself.
        super().__init__(max_capacity_bytes=0)
        self._store_efd = create_event_notifier()
        self._lookup_efd = create_event_notifier()
        self._load_efd = create_event_notifier()
        self._lock = threading.Lock()
        self._next_id = 0
        self._done_store: dict[L2TaskId, L2StoreResult] = {}
        self._done_lookup: dict[L2TaskId, Bitmap] = {}
        self._done_load: dict[L2TaskId, Bitmap] = {}
        log.info("kvtier L2 adapter ready: %s", [t.describe() for t in self.backend.store.tiers])

    # ---- event fds ---------------------------------------------------------------------------------------------------
    def get_store_event_fd(self) -> int:
        return self._store_efd.fileno()

    def get_lookup_and_lock_event_fd(self) -> int:
        return self._lookup_efd.fileno()

    def get_load_event_fd(self) -> int:
        return self._load_efd.fileno()

    def _task_id(self) -> L2TaskId:
        with self._lock:
            self._next_id += 1
            return self._next_id

    # ---- store -----------------------------------------------------------------------------------------------------
    def submit_store_task(self, keys: list[ObjectKey], objects: list[MemoryObj]) -> L2TaskId:
        tid = self._task_id()
        keys = list(keys)
        self._fan_out(
            self.backend.pool,
            self._store_one,
            list(zip(keys, objects, strict=True)),
            lambda sizes: self._finish_store(tid, keys, sizes),
        )
        return tid

    def _finish_store(self, tid: L2TaskId, keys, sizes: list) -> None:
        stored = [(k, n) for k, n in zip(keys, sizes) if n is not None and n >= 0]
        ok = len(stored) == len(keys)
        if stored:
            self._notify_keys_stored([k for k, _ in stored], [n for _, n in stored])
        with self._lock:
            self._done_store[tid] = L2StoreResult(ok, sum(n for _, n in stored))
        self._store_efd.notify()

    def _fan_out(self, pool, fn, items: list[tuple], finish) -> None:
        """Run fn(*item) for every item on one of the backend's I/O pools (so a task's keys move in parallel, and no
        thread blocks waiting for others); the last one to finish calls finish(results), a failure being None."""
        n = len(items)
        results: list = [None] * n
        left = [n]
        lock = threading.Lock()
        if n == 0:
            finish(results)
            return

        def done(i: int, fut) -> None:
            try:
                results[i] = fut.result()
            except Exception:
                log.exception("kvtier: I/O task failed")
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                finish(results)

        for i, item in enumerate(items):
            pool.submit(fn, *item).add_done_callback(functools.partial(done, i))

    def _store_one(self, key, obj) -> int:
        view = byte_view(obj, self.backend)
        return len(view) if self.backend.put(object_key_str(key), [view]) else -1

    def pop_completed_store_tasks(self) -> dict[L2TaskId, L2StoreResult]:
        with self._lock:
            done, self._done_store = self._done_store, {}
        return done

    # ---- lookup and lock -------------------------------------------------------------------------------------------
    def submit_lookup_and_lock_task(
        self, keys: list[ObjectKey], group_layout_descs: dict[int, MemoryLayoutDesc]
    ) -> L2TaskId:
        """Answered on the caller's thread from the in-memory index (pinning what it finds), and signalled before
        returning. LMCache sends every lookup here, L1 hits included (it drops the locks again with submit_unlock
        when L1 serves), so this path does no I/O and never waits for a pool. Only keys missing from the index, with
        a shared tier configured, go to the read pool to be probed there (file or Redis I/O)."""
        tid = self._task_id()
        keys = list(keys)
        bitmap = Bitmap(len(keys))
        missing: list[int] = []
        try:
            for i, hit in enumerate(self.backend.lookup_indexed([object_key_str(k) for k in keys], pin=True)):
                if hit:
                    bitmap.set(i)
                else:
                    missing.append(i)
        except Exception:
            log.exception("kvtier: lookup task %d failed", tid)
            missing = []
        if missing and self.backend.has_shared_tiers:
            self.backend.read_pool.submit(self._probe_shared, tid, keys, missing, bitmap)
        else:
            if missing:
                self.backend.count("lookup_misses", len(missing))
            self._finish_lookup(tid, bitmap)
        return tid

    def _probe_shared(self, tid: L2TaskId, keys, missing: list[int], bitmap: Bitmap) -> None:
        """The keys the index did not have, looked up in the shared tiers (another instance may have put them)."""
        try:
            for i in missing:
                if self.backend.lookup(object_key_str(keys[i]), pin=True):
                    bitmap.set(i)
        except Exception:
            log.exception("kvtier: lookup task %d failed", tid)
        self._finish_lookup(tid, bitmap)

    def _finish_lookup(self, tid: L2TaskId, bitmap: Bitmap) -> None:
        with self._lock:
            self._done_lookup[tid] = bitmap
        self._lookup_efd.notify()

    def query_lookup_and_lock_result(self, task_id: L2TaskId) -> Bitmap | None:
        with self._lock:
            return self._done_lookup.pop(task_id, None)

    def submit_unlock(self, keys: list[ObjectKey]) -> None:
        for key in keys:
            self.backend.unpin(object_key_str(key))

    # ---- load --------------------------------------------------------------------------------------------------------
    def submit_load_task(self, keys: list[ObjectKey], objects: list[MemoryObj]) -> L2TaskId:
        tid = self._task_id()
        keys = list(keys)
        items = [(object_key_str(k), byte_view(o, self.backend)) for k, o in zip(keys, objects, strict=True)]
        self._fan_out(
            self.backend.read_pool, self.backend.get_into, items, lambda hits: self._finish_load(tid, keys, hits)
        )
        return tid

    def _finish_load(self, tid: L2TaskId, keys, hits: list) -> None:
        bitmap = Bitmap(len(keys))
        for i, hit in enumerate(hits):
            if hit:
                bitmap.set(i)
        loaded = [keys[i] for i, hit in enumerate(hits) if hit]
        if loaded:
            self._notify_keys_accessed(loaded)
        with self._lock:
            self._done_load[tid] = bitmap
        self._load_efd.notify()

    def query_load_result(self, task_id: L2TaskId) -> Bitmap | None:
        with self._lock:
            return self._done_load.pop(task_id, None)

    # ---- touch and memory tags (lmcache >= 0.5.7 asks; harmless on 0.5.6) ------------------------------------------
    def submit_touch(self, keys: list[ObjectKey]) -> None:
        """The keys were used (LMCache's StorageManager.touch_cached_keys on an L1 hit): refresh kvtier's LRU for
        those it holds, with no I/O, on the caller's thread, then tell LMCache's listeners as the base class does."""
        keys = list(keys)
        held = [k for k, h in zip(keys, self.backend.store.touch([object_key_str(k) for k in keys])) if h]
        if held:
            self._notify_keys_accessed(held)

    @property
    def shares_storage(self) -> bool:
        """Whether some tier is written by other instances too (a shared directory, Redis)."""
        return self.backend.has_shared_tiers

    def get_memory_tags(self) -> MemoryTags:
        if MemoryTags is None:
            raise NotImplementedError("memory tags exist from lmcache 0.5.7 on")
        residency = MemoryResidency.REMOTE if self.shares_storage else MemoryResidency.LOCAL
        return MemoryTags(MemorySegment.STORAGE, residency)

    def set_backend_identity(self, name: str, shared: bool = False) -> None:
        """LMCache tags this adapter's cache events with the `shared` flag of its --l2-adapter JSON; kvtier knows from
        its tiers whether they are shared. A disagreement is logged and counted, not corrected: set `"shared": true`
        in the JSON exactly when a shared_dir or redis_url is configured."""
        super().set_backend_identity(name, shared)
        if shared != self.shares_storage:
            self.backend.count("shared_flag_mismatch")
            log.warning(
                "kvtier L2 adapter: the --l2-adapter JSON says shared=%s but kvtier's tiers are %s; "
                "LMCache will report this adapter's entries as %s",
                shared,
                "shared" if self.shares_storage else "local only",
                "shared" if shared else "private",
            )

    # ---- eviction, status, close -------------------------------------------------------------------------------------
    def delete(self, keys: list[ObjectKey]) -> None:
        deleted, sizes = [], []
        for key in keys:
            s = object_key_str(key)
            info = self.backend.store.entry_info(s)
            if info is not None and self.backend.remove(s):
                deleted.append(key)
                sizes.append(info[0])
        if deleted:
            self._notify_keys_deleted(deleted, sizes)

    def report_status(self) -> dict:
        return {
            "is_healthy": not self.backend.closed,
            "type": "KvtierL2Adapter",
            "tiers": self.backend.store.usage(),
            "events": self.backend.events_snapshot(),
        }

    def close(self) -> None:
        self.backend.close()
        for efd in (self._store_efd, self._lookup_efd, self._load_efd):
            efd.close()
