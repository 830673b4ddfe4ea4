"""Preconditioning: sequential writes before the run so an SSD reaches steady state (its garbage collection is then
part of what the run measures, as it is in production). Its I/O is not part of the results.

What the MLPerf spec asks (section 4, "Preconditioning vs Prefill-Only vs Decode-Only"): sequential writes of twice
the capacity, then the run. Writing 2x a device's capacity cannot mean holding it: the bytes go into ONE file of at
most the disk tier's capacity (and at most 95% of the free space), overwritten in place pass after pass until the
volume is written, so no more than that file is ever on disk, and the default (2x the tier) works on any filesystem.

- `threads` writers (default one per CPU, as the spec's os.cpu_count()) each own a contiguous region of the file
  and write it front to back in 16 MiB writes, wrapping around, until their share of the volume is written.
- Every pass over a region ends with fdatasync, so with buffered I/O each byte reaches the device before it is
  overwritten (page-cache overwrites would otherwise never leave the host); O_DIRECT writes go there directly.
- A signal or a writer's error stops every writer within one write; the file is removed in all cases.
"""

from __future__ import annotations

import errno
import os
import random
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from kvconnector.errors import ConfigError
from kvconnector.timed_io import O_DIRECT
from kvconnector.units import human_bytes

from .payload import RandomPayload

WRITE_BYTES = 16 << 20
ALIGN = 1 << 20  # region starts and lengths: O_DIRECT needs 4 KiB; whole MiB keeps them simple
# Room left free on the filesystem beside the file (metadata, other writers).
FREE_SHARE = 0.95


def default_threads() -> int:
    return os.cpu_count() or 4


def plan(size_bytes: int, tier_capacity: int, free_bytes: int) -> tuple[int, int]:
    """(bytes to write, bytes of the file they overwrite): --precondition-size-gb in bytes (0 = 2x the tier), over a
    file of the tier's capacity within 95% of the free space. ConfigError when not even one MiB fits."""
    size = int(size_bytes) or 2 * tier_capacity
    span = min(tier_capacity, int(free_bytes * FREE_SHARE), size) // ALIGN * ALIGN
    if span <= 0:
        raise ConfigError(
            f"--precondition: no room for the preconditioning file ({human_bytes(free_bytes)} free, disk tier "
            f"{human_bytes(tier_capacity)})"
        )
    return size, span


def precondition(
    directory: str,
    size_bytes: int,
    threads: int,
    payload: RandomPayload,
    direct: bool,
    on_progress=None,
    span_bytes: int | None = None,
) -> dict:
    """Write `size_bytes` sequentially over one file of `span_bytes` (default: `size_bytes`, rounded to whole MiB)
    with `threads` writers, then remove it. Returns what was done."""
    span = (span_bytes if span_bytes is not None else size_bytes) // ALIGN * ALIGN
    span = max(ALIGN, span)
    threads = max(1, min(threads, span // ALIGN))  # every writer gets at least one MiB of the file
    os.makedirs(directory, mode=0o700, exist_ok=True)
    path = os.path.join(directory, "precondition-overwrite.bin")
    # Region i: [starts[i], starts[i + 1]); its share of the volume is in proportion to its length.
    starts = [span * i // threads // ALIGN * ALIGN for i in range(threads)] + [span]
    lengths = [starts[i + 1] - starts[i] for i in range(threads)]
    budgets = [size_bytes * n // span // 4096 * 4096 for n in lengths]
    budgets[-1] = size_bytes - sum(budgets[:-1])  # the last writer takes what rounding left
    written = [0]
    lock = threading.Lock()
    stop = threading.Event()  # a signal or an error in any writer stops the others at their next write
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (O_DIRECT if direct else 0)
    fd = os.open(path, flags, 0o600)
    errors: list[str] = []

    def fill(i: int) -> None:
        rng = random.Random(i)
        lo, hi = starts[i], starts[i + 1]
        budget = budgets[i]
        done, pos = 0, lo
        try:
            while done < budget and not stop.is_set():
                n = min(WRITE_BYTES, hi - pos, budget - done)
                if direct:  # O_DIRECT writes whole pages only
                    n -= n % 4096
                if n <= 0:
                    break
                n = os.pwritev(fd, payload.chunks(n, rng), pos)
                pos += n
                done += n
                with lock:
                    written[0] += n
                if on_progress:
                    on_progress(written[0], size_bytes)
                if pos >= hi:  # one pass over the region: on the device before it is overwritten
                    os.fdatasync(fd)
                    pos = lo
        except OSError as exc:
            errors.append("filesystem full" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc)))
            stop.set()

    t0 = time.perf_counter()
    pool = ThreadPoolExecutor(threads, thread_name_prefix="precondition")
    try:
        list(pool.map(fill, range(threads)))
        if not stop.is_set():
            os.fdatasync(fd)
    finally:
        # On an interrupt (Interrupted raised here by the signal handler) running writers stop within one write.
        stop.set()
        pool.shutdown(wait=True, cancel_futures=True)
        os.close(fd)
        try:
            os.unlink(path)
        except OSError:
            pass
    seconds = time.perf_counter() - t0
    out = {
        "bytes": written[0],
        "file_bytes": span,
        "passes": round(written[0] / span, 2),
        "seconds": round(seconds, 2),
        "gbps": round(written[0] / 1e9 / seconds, 3) if seconds else 0.0,
        "threads": threads,
        "direct": bool(direct),
    }
    if errors:
        out["error"] = errors[0]
    return out


def run_precondition(cfg, disk, run_dir: str, payload: RandomPayload, on_progress=None) -> dict:
    """--precondition for a run: the volume and file from the config and the disk tier, in the run directory."""
    size, span = plan(cfg.size_bytes(cfg.precondition_size_gb), disk.capacity_bytes, shutil.disk_usage(run_dir).free)
    return precondition(
        os.path.join(run_dir, "precondition"),
        size,
        cfg.precondition_threads or default_threads(),
        payload,
        direct=getattr(disk, "io_mode", None) is not None and disk.io_mode.value == "direct",
        on_progress=on_progress and (lambda done, total: on_progress("precondition", done, total)),
        span_bytes=span,
    )
