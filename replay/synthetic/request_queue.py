"""The MLPerf reference's request queue, for --request-model reference with synthetic users.

In the reference (kv_cache_benchmark/kv_cache/benchmark.py of mlcommons/storage: `generate_requests` and
`process_requests`), a user does not wait for its request: it sleeps its think time, puts the request on one priority
queue (higher QoS priority first, then the earlier request) and goes on to the next. min(users, 500) worker threads
take requests off that queue and run each one whole. So under load requests wait in the queue, the higher classes
overtake the lower ones, a turn can be taken before the turn it re-reads was written (a miss, no I/O), and the
requests still queued when the window ends are never run. Which requests complete, and so the device's read:write
mix, follows from that; a closed loop (each user waiting for its answer) completes a different mix.

The reference's queue has no bound; this one holds at most QUEUE_PER_WORKER requests per worker, then a user waits
for room (counted), so users that never think (--performance-profile throughput) cannot grow it without limit.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Awaitable, Callable

QUEUE_PER_WORKER = 1024


class RequestQueue:
    def __init__(self, workers: int, on_error: Callable[[BaseException], None]) -> None:
        self.workers = workers
        self._on_error = on_error
        self._heap: list[tuple[object, int, Callable[[], Awaitable[None]]]] = []
        self._seq = itertools.count()  # equal priorities leave in arrival order
        self._ready = asyncio.Semaphore(0)
        self._room = asyncio.Semaphore(QUEUE_PER_WORKER * workers)
        self.max_depth = 0
        self.full_waits = 0

    async def put(self, priority: object, request: Callable[[], Awaitable[None]]) -> None:
        if self._room.locked():
            self.full_waits += 1
        await self._room.acquire()
        heapq.heappush(self._heap, (priority, next(self._seq), request))
        self.max_depth = max(self.max_depth, len(self._heap))
        self._ready.release()

    async def work(self) -> None:
        """One worker: runs the first request of the queue, whole, then the next (cancelled at the window's end)."""
        while True:
            await self._ready.acquire()
            _, _, request = heapq.heappop(self._heap)
            self._room.release()
            try:
                await request()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a storage failure or a bug: the run ends failed
                self._on_error(exc)
                return

    def report(self) -> dict:
        return {
            "workers": self.workers,
            "max_depth": self.max_depth,
            "not_run_at_end": len(self._heap),
            "user_waits_for_room": self.full_waits,
        }
