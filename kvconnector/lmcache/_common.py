"""What both adapters share: building the backend (loudly refusing to run on a bad configuration) and byte views."""

from __future__ import annotations

import logging

from .. import uring
from ..backend import KvtierBackend
from ..backend_config import BackendConfig
from ..errors import KvtierError

log = logging.getLogger("kvconnector.lmcache")


class KvtierRefusedToRun(SystemExit):
    """Raised when the kvtier backend cannot be built. A SystemExit on purpose: LMCache's plugin loader catches and
    merely logs `Exception`s from a constructor, which would leave a deployment silently running without its tiers."""


def build_backend_or_refuse(source: dict | BackendConfig | None, kind: str, who: str) -> KvtierBackend:
    """kind: "params" (L2 adapter_params) or "extra_config" (LMCache extra_config with kvtier.* keys); a source that
    is already a BackendConfig is used as it is."""
    cfg = source if isinstance(source, BackendConfig) else config_or_refuse(source, kind, who)
    try:
        return KvtierBackend(cfg)
    except (KvtierError, OSError) as exc:
        log.error("kvtier %s refuses to run: %s", who, exc)
        raise KvtierRefusedToRun(f"kvtier {who} refuses to run: {exc}") from exc


def config_or_refuse(source: dict | None, kind: str, who: str) -> BackendConfig:
    """The validated configuration, or KvtierRefusedToRun with the one-line cause (logged at ERROR)."""
    try:
        return BackendConfig.from_params(source) if kind == "params" else BackendConfig.from_extra_config(source)
    except KvtierError as exc:
        log.error("kvtier %s refuses to run: %s", who, exc)
        raise KvtierRefusedToRun(f"kvtier {who} refuses to run: {exc}") from exc


def byte_view(obj, backend: KvtierBackend) -> memoryview:
    """An LMCache MemoryObj's bytes as a flat unsigned-byte memoryview (its byte_array has format '<B'). The memory
    behind it (LMCache's CPU buffer, allocated once when LMCache starts) is offered to io_uring on behalf of `backend`,
    so O_DIRECT transfers from and to it need not pin its pages each time (kvconnector/uring.py); the backend withdraws
    it when it closes, since LMCache frees that memory itself when it shuts down."""
    storage = getattr(getattr(obj, "raw_data", None), "untyped_storage", None)
    if storage is not None:
        st = storage()
        if st.device.type == "cpu":
            uring.offer(st, st.data_ptr(), st.nbytes(), tag=backend)
    mv = obj.byte_array
    if not isinstance(mv, memoryview):
        mv = memoryview(mv)
    return mv if mv.format == "B" else mv.cast("B")
