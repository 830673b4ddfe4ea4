"""Timestamps of the LMCache MP server's prefetch path (a diagnostic, not part of kvtier).

With this directory on PYTHONPATH and PFTRACE_LOG set, an LMCache MP server process
(`python -m lmcache.v1.multiprocess.http_server`) appends one line per event to $PFTRACE_LOG:
`<time.time_ns()> <thread> <event> [id]`. Events: LMCache's LookupModule.lookup (vLLM's lookup arriving, begin/end)
and query_prefetch_status (when it returns a result), LMCacheDrivenTransferModule.store / retrieve (begin/end),
PrefetchController.submit_prefetch_request / _transition_to_load_phase / _finish_request / query_prefetch_result,
the L2 adapter's submit_lookup_and_lock_task / submit_load_task / submit_store_task / submit_unlock / query_*
(kvtier's and LMCache's fs adapter), kvtier's task completions and backend calls (put, get_into, lookup,
lookup_indexed, unpin: begin, end with the duration in us), kvtier's metrics collection (collect start/end) and
garbage collections over 1 ms. Every other process ignores it. Wall-clock nanoseconds, so a client that logs its own
send times to the same file gives one timeline (`benchmarks/ttft_kvtier_vs_lmcache.py --timeline FILE` does;
`phases.py FILE` splits each request into its phases).

  PFTRACE_LOG=/tmp/pf.log PYTHONPATH=$PWD/tools/prefetch_timeline deploy/run-stack.sh up --model DIR --kv-dir DIR ...

This is how the TTFT gap of kvconnector/README.md was traced to a metrics scrape right before each timed request, and
how the "L1 hits" of an early TTFT run (benchmarks/README.md) were found to be L2 re-reads (every one of them submitted
a load task to kvtier).
"""

import functools
import gc
import os
import sys
import threading
import time

LOG = os.environ.get("PFTRACE_LOG")
TARGET = "lmcache.v1.multiprocess.http_server"


def _log(event: str, extra: object = "") -> None:
    with open(LOG, "a") as f:
        f.write(f"{time.time_ns()} {threading.current_thread().name.replace(' ', '_')} {event} {extra}\n")


def _wrap(cls, name: str, only_results: bool = False) -> None:
    orig = getattr(cls, name)

    @functools.wraps(orig)  # keeps the attributes LMCache's @request_handler sets (its handler registry reads them)
    def wrapper(self, *a, **k):
        r = orig(self, *a, **k)
        if not only_results or r is not None:
            _log(f"{cls.__name__}.{name}", r if isinstance(r, int) else "")
        return r

    setattr(cls, name, wrapper)


def _wrap_span(cls, name: str) -> None:
    """`<name>.begin` when the call starts, `<name>.end <duration_us>` when it returns (or raises)."""
    orig = getattr(cls, name)
    label = f"{cls.__name__}.{name}"

    @functools.wraps(orig)
    def wrapper(self, *a, **k):
        t0 = time.time_ns()
        _log(label + ".begin")
        try:
            return orig(self, *a, **k)
        finally:
            _log(label + ".end", (time.time_ns() - t0) // 1000)

    setattr(cls, name, wrapper)


def _wrap_collect(cls) -> None:
    orig = cls.collect

    def collect(self):
        _log("collect_start")
        yield from orig(self)
        _log("collect_end")

    cls.collect = collect


# (module, class, wrapper) applied once the module is imported (the server imports them lazily).
_PATCHES = [
    (
        "lmcache.v1.distributed.storage_controllers.prefetch_controller",
        "PrefetchController",
        lambda c: [
            _wrap(c, "submit_prefetch_request"),
            _wrap(c, "_transition_to_load_phase"),
            _wrap(c, "_finish_request"),
            _wrap(c, "query_prefetch_result", True),
        ],
    ),
    (
        "kvconnector.lmcache.l2_adapter",
        "KvtierL2Adapter",
        lambda c: [
            _wrap(c, "submit_lookup_and_lock_task"),
            _wrap(c, "submit_load_task"),
            _wrap(c, "query_lookup_and_lock_result", True),
            _wrap(c, "query_load_result", True),
            _wrap(c, "submit_store_task"),
            _wrap(c, "submit_unlock"),
            _wrap_span(c, "_probe_shared"),
            _wrap(c, "_finish_store"),
            _wrap(c, "_finish_load"),
        ],
    ),
    (
        "kvconnector.backend",
        "KvtierBackend",
        lambda c: [
            _wrap_span(c, "put"),
            _wrap_span(c, "get_into"),
            _wrap_span(c, "lookup"),
            _wrap_span(c, "lookup_indexed"),
            _wrap_span(c, "unpin"),
        ],
    ),
    (
        "lmcache.v1.multiprocess.modules.lookup",
        "LookupModule",
        lambda c: [_wrap_span(c, "lookup"), _wrap(c, "query_prefetch_status", True)],
    ),
    (
        "lmcache.v1.multiprocess.modules.lmcache_driven_transfer",
        "LMCacheDrivenTransferModule",
        lambda c: [_wrap_span(c, "store"), _wrap_span(c, "retrieve")],
    ),
    (
        "lmcache.v1.distributed.l2_adapters.fs_l2_adapter",
        "FSL2Adapter",
        lambda c: [
            _wrap(c, "submit_lookup_and_lock_task"),
            _wrap(c, "submit_load_task"),
            _wrap(c, "query_lookup_and_lock_result", True),
            _wrap(c, "query_load_result", True),
            _wrap(c, "submit_store_task"),
            _wrap(c, "submit_unlock"),
        ],
    ),
    ("kvconnector.metrics", "BackendCollector", _wrap_collect),
]


def _patch_when_imported() -> None:
    left = list(_PATCHES)
    deadline = time.monotonic() + 600
    while left and time.monotonic() < deadline:
        for item in list(left):
            mod = sys.modules.get(item[0])
            if mod is not None and hasattr(mod, item[1]):
                item[2](getattr(mod, item[1]))
                left.remove(item)
        time.sleep(0.05)


_gc_started_ns = 0


def _gc_callback(phase: str, info: dict) -> None:
    global _gc_started_ns
    if phase == "start":
        _gc_started_ns = time.time_ns()
    elif time.time_ns() - _gc_started_ns > 1_000_000:
        _log("gc", f"gen{info.get('generation')}_{(time.time_ns() - _gc_started_ns) / 1e6:.1f}ms")


if LOG and TARGET in " ".join(getattr(sys, "orig_argv", sys.argv)):
    gc.callbacks.append(_gc_callback)
    threading.Thread(target=_patch_when_imported, daemon=True, name="pftrace").start()
