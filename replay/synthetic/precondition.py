"""Preconditioning: sequential writes before the run so an SSD reaches steady state (its garbage collection is
then part of what the run measures, as it is in production). Its I/O is not part of the results."""

from __future__ import annotations

import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from kvconnector.timed_io import O_DIRECT

from .payload import RandomPayload

FILE_BYTES = 1 << 30
WRITE_BYTES = 16 << 20


def precondition(
    directory: str, size_bytes: int, threads: int, payload: RandomPayload, direct: bool, on_progress=None
) -> dict:
    """Write `size_bytes` in 1 GiB files with `threads` writers, then delete them. Returns what was done."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    files = [os.path.join(directory, f"precondition-{i}.bin") for i in range(max(1, -(-size_bytes // FILE_BYTES)))]
    written = [0]
    lock = threading.Lock()
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | (O_DIRECT if direct else 0)

    stop = threading.Event()  # a signal or an error in any writer stops the others at their next write

    def fill(i: int) -> None:
        if stop.is_set():
            return
        rng = random.Random(i)
        budget = min(FILE_BYTES, size_bytes - i * FILE_BYTES)
        fd = os.open(files[i], flags, 0o600)
        try:
            pos = 0
            while pos < budget and not stop.is_set():
                n = min(WRITE_BYTES, budget - pos)
                n -= n % 4096 or 0
                if n <= 0:
                    break
                pos += os.pwritev(fd, payload.chunks(n, rng), pos)
                with lock:
                    written[0] += n
                if on_progress:
                    on_progress(written[0], size_bytes)
            os.fdatasync(fd)
        finally:
            os.close(fd)

    t0 = time.perf_counter()
    pool = ThreadPoolExecutor(threads)
    try:
        list(pool.map(fill, range(len(files))))
    finally:
        # On an interrupt, files not started are never begun and running writers stop within one write.
        stop.set()
        pool.shutdown(wait=True, cancel_futures=True)
        for f in files:
            try:
                os.unlink(f)
            except OSError:
                pass
    seconds = time.perf_counter() - t0
    return {
        "bytes": written[0],
        "seconds": round(seconds, 2),
        "gbps": round(written[0] / 1e9 / seconds, 3) if seconds else 0.0,
        "threads": threads,
    }
