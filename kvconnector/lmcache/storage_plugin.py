"""In-process mode: kvtier as an LMCache storage plugin (`StoragePluginInterface`) for LMCacheConnectorV1.

LMCache configuration (YAML named by LMCACHE_CONFIG_FILE, or LMCACHE_* env vars):

    local_cpu: true
    max_local_cpu_size: 5
    storage_plugins: ["kvtier"]
    extra_config:
      storage_plugin.kvtier.module_path: kvconnector.lmcache.storage_plugin
      storage_plugin.kvtier.class_name: KvtierStoragePlugin
      kvtier.disk_dir: /var/cache/kvtier
      kvtier.disk_capacity_gb: 100

Puts run on the backend's I/O pool (the memory object is held with ref_count_up until written); gets are blocking
and allocate the result from LMCache's local CPU backend. The entry header keeps the tensor's shape and a compact
dtype+format code, so an entry read back after a restart is rebuilt exactly.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import torch
from lmcache.v1.memory_management import MemoryFormat, MemoryObj
from lmcache.v1.storage_backend.abstract_backend import StoragePluginInterface

from ._common import KvtierRefusedToRun, build_backend_or_refuse, byte_view

EXIT_CONFIG = 78  # sysexits.h EX_CONFIG

log = logging.getLogger(__name__)

_DTYPES = {
    torch.bfloat16: "bf16",
    torch.float16: "f16",
    torch.float32: "f32",
    torch.float64: "f64",
    torch.uint8: "u8",
    torch.int8: "i8",
    torch.int32: "i32",
    torch.int64: "i64",
}
for _name, _code in (("float8_e4m3fn", "f8e4"), ("float8_e5m2", "f8e5")):
    if hasattr(torch, _name):
        _DTYPES[getattr(torch, _name)] = _code
_CODES = {v: k for k, v in _DTYPES.items()}


def encode_dtype(dtype: torch.dtype, fmt: MemoryFormat) -> str:
    """At most 8 characters (the entry header's dtype field): '<code>/<format value>', e.g. 'bf16/1'."""
    code = _DTYPES.get(dtype)
    if code is None:
        raise ValueError(f"kvtier: unsupported dtype {dtype}")
    return f"{code}/{fmt.value}"


def decode_dtype(s: str) -> tuple[torch.dtype, MemoryFormat]:
    code, fmt = s.split("/", 1)
    return _CODES[code], MemoryFormat(int(fmt))


class KvtierStoragePlugin(StoragePluginInterface):
    def __init__(self, config=None, dst_device: str = "cpu", metadata=None, local_cpu_backend=None, loop=None) -> None:
        extra = getattr(config, "extra_config", None) or {}
        try:
            self.backend = build_backend_or_refuse(extra, "extra_config", "storage plugin")
        except KvtierRefusedToRun as exc:
            # LMCache's loader logs and drops an Exception from here and runs on without kvtier; a SystemExit would
            # leave the half-built StorageManager's non-daemon threads holding the process open. Exit, loudly.
            sys.stderr.write(f"{exc} (exit status {EXIT_CONFIG})\n")
            sys.stderr.flush()
            os._exit(EXIT_CONFIG)
        super().__init__(
            dst_device=dst_device, config=config, metadata=metadata, local_cpu_backend=local_cpu_backend, loop=loop
        )
        self._put_lock = threading.Lock()
        self._putting: set[str] = set()
        if local_cpu_backend is None:
            log.warning(
                "kvtier storage plugin: LMCache gave no local CPU backend (max_local_cpu_size must be > 0); "
                "gets will miss"
            )
            self.backend.count("no_local_cpu_backend")

    def __str__(self) -> str:
        return "KvtierStoragePlugin"

    # ---- lookups and pins --------------------------------------------------------------------------------------------
    def contains(self, key, pin: bool = False) -> bool:
        return self.backend.lookup(key.to_string(), pin=pin)

    def exists_in_put_tasks(self, key) -> bool:
        with self._put_lock:
            return key.to_string() in self._putting

    def pin(self, key) -> bool:
        return self.backend.pin(key.to_string())

    def unpin(self, key) -> bool:
        return self.backend.unpin(key.to_string())

    def remove(self, key, force: bool = True) -> bool:
        return self.backend.remove(key.to_string())

    # ---- puts ------------------------------------------------------------------------------------------------------
    def batched_submit_put_task(
        self,
        keys: Sequence,
        objs: list[MemoryObj],
        transfer_spec: Any = None,
        on_complete_callback: Callable | None = None,
    ) -> list[Future] | None:
        futures = []
        for key, obj in zip(keys, objs, strict=True):
            skey = key.to_string()
            with self._put_lock:
                if skey in self._putting:
                    continue
                self._putting.add(skey)
            obj.ref_count_up()  # LMCache drops its reference when this call returns; hold the bytes until written
            futures.append(self.backend.pool.submit(self._put_one, key, skey, obj, on_complete_callback))
        return futures or None

    def _put_one(self, key, skey: str, obj: MemoryObj, callback) -> bool:
        try:
            meta = obj.meta
            view = byte_view(obj, self.backend)
            ok = self.backend.put(skey, [view], tuple(meta.shape), encode_dtype(meta.dtype, meta.fmt))
        except ValueError:
            self.backend.count("store_unsupported")
            ok = False
        finally:
            obj.ref_count_down()
            with self._put_lock:
                self._putting.discard(skey)
        if callback is not None:
            try:
                callback(key)
            except Exception:
                log.exception("kvtier: on_complete_callback failed")
        return ok

    # ---- gets ------------------------------------------------------------------------------------------------------
    def get_blocking(self, key) -> MemoryObj | None:
        skey = key.to_string()
        info = self.backend.info(skey)
        if info is None or self.local_cpu_backend is None:
            self.backend.count("load_misses")
            return None
        _nbytes, shape, dtype_code, _tier = info
        try:
            dtype, fmt = decode_dtype(dtype_code)
        except (KeyError, ValueError):
            self.backend.count("load_unsupported")
            return None
        obj = self.local_cpu_backend.allocate(torch.Size(shape), dtype, fmt)
        if obj is None:
            self.backend.count("load_no_memory")
            return None
        if not self.backend.get_into(skey, byte_view(obj, self.backend)):
            obj.ref_count_down()
            return None
        return obj

    def get_allocator_backend(self):
        return self.local_cpu_backend

    def close(self) -> None:
        self.backend.close()
