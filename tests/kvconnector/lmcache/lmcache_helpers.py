"""Real LMCache memory objects, waits with a deadline, and the adapter as LMCache's factory builds it."""

import time

import torch
from lmcache.v1.distributed.api import ObjectKey
from lmcache.v1.distributed.l2_adapters import create_l2_adapter
from lmcache.v1.distributed.l2_adapters.plugin_l2_adapter import PluginL2AdapterConfig
from lmcache.v1.memory_management import MemoryFormat, MemoryObjMetadata, TensorMemoryObj

SHAPE = torch.Size([2, 2, 16, 64])  # (K/V, layers, tokens, hidden) in bf16: 8 KiB
NBYTES = SHAPE.numel() * 2


def mem_obj(seed: int | None = None, shape=SHAPE) -> TensorMemoryObj:
    n = shape.numel() * 2
    raw = torch.zeros(n, dtype=torch.uint8)
    if seed is not None:
        raw.copy_(torch.randint(0, 256, (n,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed)))
    meta = MemoryObjMetadata(
        shape=shape, dtype=torch.bfloat16, address=0, phy_size=n, ref_count=1, fmt=MemoryFormat.KV_2LTD
    )
    return TensorMemoryObj(raw, meta, None)


def okey(i: int, model: str = "org/../../etc/model", salt: str = "") -> ObjectKey:
    return ObjectKey(chunk_hash=i.to_bytes(8, "big"), model_name=model, kv_rank=0, object_group_id=0, cache_salt=salt)


def wait_result(fn, task_id, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        r = fn(task_id)
        if r is not None:
            return r
        time.sleep(0.002)
    raise TimeoutError(f"task {task_id} did not complete in {timeout_s} s")


def wait_store(adapter, task_id, timeout_s: float = 10.0):
    # pop_completed_store_tasks hands out every finished task once: keep the ones we are not waiting for yet.
    done = adapter.__dict__.setdefault("_test_done_store", {})
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done.update(adapter.pop_completed_store_tasks())
        if task_id in done:
            return done.pop(task_id)
        time.sleep(0.002)
    raise TimeoutError(f"store task {task_id} did not complete")


def make_adapter(params: dict):
    """kvtier's L2 adapter as LMCache's MP server builds it: through its plugin factory, from a config dict."""
    cfg = PluginL2AdapterConfig.from_dict(
        {
            "type": "plugin",
            "module_path": "kvconnector.lmcache.l2_adapter",
            "class_name": "KvtierL2Adapter",
            "adapter_params": params,
        }
    )
    return create_l2_adapter(cfg)


def storage_manager(**kvtier):
    """LMCache's StorageManager (CPU) with kvtier as its storage plugin, configured with these kvtier keys."""
    # imported here: the L2 adapter tests import this module on LMCache 0.5.7 too, which has no event_manager
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.event_manager import EventManager
    from lmcache.v1.metadata import LMCacheMetadata
    from lmcache.v1.storage_backend.storage_manager import StorageManager

    extra = {
        "storage_plugin.kvtier.module_path": "kvconnector.lmcache.storage_plugin",
        "storage_plugin.kvtier.class_name": "KvtierStoragePlugin",
    }
    extra.update({f"kvtier.{k}": v for k, v in kvtier.items()})
    cfg = LMCacheEngineConfig.from_defaults(
        chunk_size=16, local_cpu=True, max_local_cpu_size=0.05, storage_plugins=["kvtier"], extra_config=extra
    )
    md = LMCacheMetadata(
        model_name="org/../model",
        world_size=1,
        local_world_size=1,
        worker_id=0,
        local_worker_id=0,
        kv_dtype=torch.bfloat16,
        kv_shape=(2, 2, 16, 2, 32),
        chunk_size=16,
        role="worker",
    )
    return StorageManager(cfg, md, EventManager())
