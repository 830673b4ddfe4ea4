"""A thread pool that runs the most urgent storage operation first, not the oldest submitted one.

With a FIFO pool, hundreds of users' operations interleave and every request waits behind everyone's queue, so few
requests ever finish. Ordering by (priority class, request start time) lets requests that began earlier complete
first, as an engine's scheduler would, and lets QoS classes overtake lower ones.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
import time
from concurrent.futures import Future


class PriorityExecutor:
    def __init__(self, workers: int, name: str = "kvtier-io") -> None:
        self._heap: list = []
        self._cv = threading.Condition()
        self._seq = itertools.count()
        self._closed = False
        self.workers = workers
        # Time each worker spent running operations; a slot per worker, so no lock is needed.
        self._busy_ns = [0] * workers
        self._threads = [threading.Thread(target=self._work, args=(i,), name=f"{name}-{i}", daemon=True)
                         for i in range(workers)]
        for t in self._threads:
            t.start()

    def submit(self, priority: tuple, fn, *args) -> Future:
        fut: Future = Future()
        with self._cv:
            if self._closed:
                raise RuntimeError("executor is shut down")
            heapq.heappush(self._heap, (priority, next(self._seq), fut, fn, args))
            self._cv.notify()
        return fut

    async def run(self, priority: tuple, fn, *args):
        return await asyncio.wrap_future(self.submit(priority, fn, *args))

    def busy_ns(self) -> int:
        """Total time the workers spent running operations (for saturation = busy / (workers x interval))."""
        return sum(self._busy_ns)

    def _work(self, index: int) -> None:
        while True:
            with self._cv:
                while not self._heap and not self._closed:
                    self._cv.wait()
                if not self._heap:
                    return
                _, _, fut, fn, args = heapq.heappop(self._heap)
            if not fut.set_running_or_notify_cancel():
                continue
            t0 = time.perf_counter_ns()
            try:
                result = fn(*args)
            except BaseException as exc:
                self._busy_ns[index] += time.perf_counter_ns() - t0
                fut.set_exception(exc)
            else:
                self._busy_ns[index] += time.perf_counter_ns() - t0
                fut.set_result(result)

    def shutdown(self, cancel_pending: bool = True) -> None:
        """Stop taking work; drop what has not started (if asked); wait for what is running."""
        with self._cv:
            self._closed = True
            if cancel_pending:
                for _, _, fut, _, _ in self._heap:
                    fut.cancel()
                self._heap.clear()
            self._cv.notify_all()
        for t in self._threads:
            t.join()
