"""An I/O trace log: one CSV row per storage operation of the tiered store, for looking at what the storage saw
(sizes, order, timing) after a run, or for replaying it elsewhere. Two layouts:

- `columns="kvtier"` (`kvtier bench --io-op-log`, a real run): the columns below, with host and device times.
- `columns="mlperf"` (`kvtier bench --io-trace-log`, the trace-only mode): the MLPerf KV Cache reference's trace
  (kv_cache_benchmark/kv_cache/tracer.py and docs/io_trace_log_usage.md at hazemawadalla/storage a56caea), for the
  tools that replay it: `Timestamp,Operation,Object_Size_Bytes,Tier,Key,Phase`, with Timestamp the Unix time of
  the operation (6 decimals), Operation `Read` or `Write`, Tier `Tier-0` (GPU), `Tier-1` (CPU), `Tier-2` (disk),
  Phase `Evict` for both rows of a move between tiers (the reference's demotion pair; kvtier's promotions too),
  else `Prefill` for a write and `Decode` for a read, as the reference labels them. Deletions (an entry evicted
  from the bottom tier) have no row there, as in the reference.

    log = IOTraceLog("run.io.csv.zst", start_ns=driver_start_ns)
    store.op_listener = log                 # called from the I/O worker threads
    driver = SyntheticDriver(..., phase_hook=set_request_phase)
    ...
    log.close()

Columns: `t_s,op,bytes,tier,key,phase,request_phase,host_ms,device_ms`. `t_s` is when the operation finished, in
seconds since `start_ns` (a `time.perf_counter_ns()` instant, the clock the driver's timeline uses; it started at
about `t_s - (host_ms + device_ms) / 1000`). `phase` is the store's reason (put/get/demote/promote/evict),
`request_phase` what the request was doing (set by the driver per thread with `set_request_phase`; empty when unset).
`host_ms`/`device_ms` are empty for an eviction (no I/O timing).

Cost per operation: one clock read, a thread-local read, a tuple and a deque append; no formatting, no lock, no
write. A background thread formats and writes the rows every `flush_interval_s` (1 s by default), so after a crash
every row up to the last flush is readable. A `.zst` suffix compresses with zstandard, `.gz` with gzip, streaming:
each flush ends a zstd block (a deflate sync point), and `read_trace` reads a file cut short after any flush. Any
other compressed suffix (`.xz`, `.bz2`, ...) is refused (`compression`): plain CSV under a compressed name would
mislead every tool that reads it.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import csv
import io
import os
import threading
import time
import zlib
from collections.abc import Iterator
from typing import Any

__all__ = [
    "COLUMNS",
    "MLPERF_COLUMNS",
    "IOTraceLog",
    "compression",
    "get_request_phase",
    "read_trace",
    "request_phase",
    "set_request_phase",
    "tagged",
]

COLUMNS = ("t_s", "op", "bytes", "tier", "key", "phase", "request_phase", "host_ms", "device_ms")
MLPERF_COLUMNS = ("Timestamp", "Operation", "Object_Size_Bytes", "Tier", "Key", "Phase")
MLPERF_TIERS = {"gpu": "Tier-0", "cpu": "Tier-1", "disk": "Tier-2", "s3": "Tier-2"}
MLPERF_OPS = {"read": "Read", "write": "Write"}

_local = threading.local()

# What a trace's name says about its bytes: the suffixes written compressed, and other compressed ones (refused).
WRITTEN = {".zst": "zstd", ".gz": "gzip"}
REFUSED = (".zstd", ".gzip", ".tgz", ".xz", ".lzma", ".bz2", ".lz4", ".lz", ".z", ".zip", ".7z", ".br", ".sz")


def compression(path: str | os.PathLike) -> str | None:
    """ "zstd", "gzip" or None (plain CSV) for a trace at `path`, by its suffix (any case); ValueError, naming the
    suffixes written, for another compressed suffix."""
    suffix = os.path.splitext(os.fspath(path))[1].lower()
    if suffix in REFUSED:
        raise ValueError(f"{os.fspath(path)}: {suffix} is not written here; name it .csv (plain), .csv.zst or .csv.gz")
    return WRITTEN.get(suffix)


def tagged(path: str, tag: str) -> str:
    """The trace of one process of a job (`tag`: client-0, rank-1): `<path>.<tag>`, the tag before a compressed suffix
    (run.csv.zst -> run.csv.client-0.zst) so the name still says how it is written."""
    stem, suffix = os.path.splitext(path)
    if suffix.lower() in WRITTEN:
        return f"{stem}.{tag}{suffix}"
    return f"{path}.{tag}"


def set_request_phase(name: str | None) -> str | None:
    """Set what the calling thread's request is doing (prefix, prefill, decode, ...); returns the previous value.
    Usable directly as the driver's `phase_hook`."""
    prev = getattr(_local, "phase", None)
    _local.phase = name
    return prev


def get_request_phase() -> str | None:
    return getattr(_local, "phase", None)


@contextlib.contextmanager
def request_phase(name: str | None) -> Iterator[None]:
    """`with request_phase("decode"): store.get(key)`: the phase holds for the block, then the previous one returns."""
    prev = set_request_phase(name)
    try:
        yield
    finally:
        set_request_phase(prev)


class IOTraceLog:
    """A `TieredStore.op_listener` that writes one CSV row per storage operation (see the module docstring)."""

    def __init__(
        self,
        path: str | os.PathLike,
        start_ns: int | None = None,
        flush_interval_s: float = 1.0,
        wake_rows: int = 65_536,
        zstd_level: int = 3,
        columns: str = "kvtier",
    ) -> None:
        if columns not in ("kvtier", "mlperf"):
            raise ValueError(f"columns: kvtier or mlperf, got {columns!r}")
        self.columns = columns
        self.path = os.fspath(path)
        # Public so a driver that starts its clock later can set it before the first operation.
        self.start_ns = time.perf_counter_ns() if start_ns is None else int(start_ns)
        # The Unix time of start_ns (the mlperf layout's timestamps are Unix times).
        self.start_unix_s = time.time() - (time.perf_counter_ns() - self.start_ns) / 1e9
        self.flush_interval_s = flush_interval_s
        self.rows_written = 0
        self.rows_dropped_after_close = 0
        self._wake_rows = wake_rows
        self._pending: collections.deque = collections.deque()
        self._closed = False
        self._write_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        kind = compression(self.path)
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        self._raw = open(self.path, "wb")
        self._zst = None
        self._gz = zlib.compressobj(6, zlib.DEFLATED, 31) if kind == "gzip" else None  # wbits 31: a gzip member
        if kind == "zstd":
            import zstandard

            self._zstd_flush = zstandard.FLUSH_BLOCK
            self._zst = zstandard.ZstdCompressor(level=zstd_level).stream_writer(self._raw, closefd=False)
        self._text = io.StringIO()
        self._csv = csv.writer(self._text, lineterminator="\n")
        self._csv.writerow(MLPERF_COLUMNS if columns == "mlperf" else COLUMNS)
        self._write_out()
        self._thread = threading.Thread(target=self._run, name="kvtier-io-trace", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    # ---- the listener (I/O worker threads) ---------------------------------------------------------------------------
    def __call__(self, op: str, tier: str, key: str, nbytes: int, timing: Any, phase: str) -> None:
        now = time.perf_counter_ns()
        if self._closed:
            self.rows_dropped_after_close += 1
            return
        if op not in MLPERF_OPS and self.columns == "mlperf":
            return  # a deletion: the reference's trace has no row for it
        q = self._pending
        if timing is None:
            q.append((now, op, nbytes, tier, key, phase, getattr(_local, "phase", None), -1, -1))
        else:
            q.append(
                (now, op, nbytes, tier, key, phase, getattr(_local, "phase", None), timing.host_ns, timing.device_ns)
            )
        if len(q) >= self._wake_rows:
            self._wake.set()

    # ---- writing (background thread, close) ----------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            self.flush()

    def flush(self) -> None:
        """Format and write every pending row, then push them to the OS (and end a zstd block)."""
        with self._write_lock:
            if self._raw.closed:
                return
            q, start, w = self._pending, self.start_ns, self._csv
            n = len(q)
            if self.columns == "mlperf":
                self._write_mlperf(n)
                n = 0
            for _ in range(n):
                t, op, nbytes, tier, key, phase, rphase, host, dev = q.popleft()
                w.writerow(
                    (
                        f"{(t - start) / 1e9:.6f}",
                        op,
                        nbytes,
                        tier,
                        key,
                        phase,
                        rphase or "",
                        "" if host < 0 else f"{host / 1e6:.4f}",
                        "" if dev < 0 else f"{dev / 1e6:.4f}",
                    )
                )
            self.rows_written += n
            self._write_out()

    def _write_mlperf(self, n: int) -> None:
        q, start, unix0, w = self._pending, self.start_ns, self.start_unix_s, self._csv
        for _ in range(n):
            t, op, nbytes, tier, key, phase, _rphase, _host, _dev = q.popleft()
            if phase in ("demote", "promote"):
                label = "Evict"
            else:
                label = "Prefill" if op == "write" else "Decode"
            w.writerow(
                (f"{unix0 + (t - start) / 1e9:.6f}", MLPERF_OPS[op], nbytes, MLPERF_TIERS.get(tier, tier), key, label)
            )
        self.rows_written += n

    def _write_out(self) -> None:
        data = self._text.getvalue().encode("utf-8")
        self._text.seek(0)
        self._text.truncate()
        if self._zst is not None:
            if data:
                self._zst.write(data)
            self._zst.flush(self._zstd_flush)
        elif self._gz is not None:
            self._raw.write(self._gz.compress(data) + self._gz.flush(zlib.Z_SYNC_FLUSH))
        elif data:
            self._raw.write(data)
        self._raw.flush()

    def close(self) -> None:
        """Write what is pending, end the file (the zstd frame) and close it. Later operations are counted, not
        written. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        self._stop.set()
        self._wake.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
        self.flush()
        with self._write_lock:
            if self._zst is not None:
                self._zst.close()
            if self._gz is not None:
                self._raw.write(self._gz.flush())  # the gzip trailer (length, CRC)
            self._raw.close()

    def __enter__(self) -> IOTraceLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_trace(path: str | os.PathLike) -> list[dict[str, str]]:
    """The rows of a trace (plain, `.zst` or `.gz`) as dicts of strings, including a file cut short by a crash: a
    compressed one is read up to its last complete block."""
    path = os.fspath(path)
    with open(path, "rb") as fh:
        data = fh.read()
    kind = compression(path)
    if kind == "zstd":
        import zstandard

        dobj = zstandard.ZstdDecompressor().decompressobj()
        data = dobj.decompress(data)
    elif kind == "gzip":
        data = zlib.decompressobj(31).decompress(data)
    text = data.decode("utf-8")
    if not text.endswith("\n"):  # a row cut in half (plain file written by another tool): leave it out
        text = text[: text.rfind("\n") + 1]
    return list(csv.DictReader(io.StringIO(text)))
