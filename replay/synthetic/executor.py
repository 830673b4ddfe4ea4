"""A thread pool that runs the most urgent storage operation first, not the oldest submitted one.

With a FIFO pool, hundreds of users' operations interleave and every request waits behind everyone's queue, so few
requests ever finish. Each operation is submitted with `(class, request start ns)`; within a class, operations of the
request that began earliest go first, as an engine's scheduler would, so requests complete instead of all crawling.

Between classes, two policies:
- weighted fair queuing (`weights` given; the default of `kvtier bench`): every class with work waiting gets a share
  of the workers' time in proportion to its weight. Each class has a virtual time, the worker time its operations
  used divided by its weight; a free worker takes the next operation of the waiting class with the lowest virtual
  time (ties: the smaller class key, i.e. the higher priority). An operation is charged the class's recent mean
  operation time when it starts (so concurrent workers do not all pick the same class before anything is charged)
  and corrected to its measured time when it ends. A class that was idle resumes at the current virtual time: idle
  time is not banked as credit for a burst later.
- strict priority (`weights=None`): the smallest key first, `(-priority, start ns)`: a busy higher class keeps every
  worker and lower classes complete nothing while it stays busy.

Why fair queuing and not aging for a storage I/O queue: under saturation the backlog can be longer than the whole run
(the default bench, 100 users of multi-hundred-MB requests on a small machine, completes fewer requests in 30 s than
it has users). Aging (effective priority = priority + wait / interval) only bounds a lower class's extra wait to
(priority gap x interval): with a backlog longer than the run, whichever order the first round lands in decides who
completes anything, and the higher class's latency grows with every class's backlog. Fair queuing gives every waiting
class its share from the first second, whatever the depth of the backlog, and isolates classes: a class's latency
depends on its own load against its share (15 interactive users with weight 4 see far less queueing than 50 batch
users with weight 2). The cost is that a class crowded with users relative to its weight can be slower than a lower
one; weights are configurable per class for that.

Invariants: queues and virtual times are touched only under `_cv`, operations run outside it; each queue entry is
(start ns, seq, future, fn, args), `seq` breaking ties in submit order so futures and functions are never compared;
taking an operation is O(log n) plus a look at each class (a handful), never a scan of the queue.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
import time
from collections.abc import Hashable
from concurrent.futures import Future

# Starting estimate of an operation's time (charged until a class has measured some): 1 ms.
_FIRST_ESTIMATE_NS = 1_000_000


class PriorityExecutor:
    def __init__(self, workers: int, weights: dict[Hashable, float] | None = None, name: str = "kvtier-io") -> None:
        self._cv = threading.Condition()
        self._seq = itertools.count()
        self._closed = False
        self.workers = workers
        self._weights = dict(weights) if weights is not None else None
        if self._weights is not None:
            if any(w <= 0 for w in self._weights.values()):
                raise ValueError("class weights must be positive")
            self._queues: dict = {c: [] for c in self._weights}
            self._vtime = {c: 0.0 for c in self._weights}
            self._estimate_ns = {c: _FIRST_ESTIMATE_NS for c in self._weights}
            self._vnow = 0.0
        self._heap: list = []  # strict priority: one heap of (priority, seq, future, fn, args)
        self._pending = 0
        # Time each worker spent running operations; a slot per worker, so no lock is needed.
        self._busy_ns = [0] * workers
        self._threads = [
            threading.Thread(target=self._work, args=(i,), name=f"{name}-{i}", daemon=True) for i in range(workers)
        ]
        for t in self._threads:
            t.start()

    def submit(self, priority: tuple, fn, *args) -> Future:
        """Queue fn(*args). priority = (class, request start ns); with strict priority the class is -priority."""
        fut: Future = Future()
        with self._cv:
            if self._closed:
                raise RuntimeError("executor is shut down")
            if self._weights is None:
                heapq.heappush(self._heap, (priority, next(self._seq), fut, fn, args))
            else:
                cls, start_ns = priority
                queue = self._queues[cls]
                if not queue:  # resuming after idle: no credit for the time it had nothing waiting
                    self._vtime[cls] = max(self._vtime[cls], self._vnow)
                heapq.heappush(queue, (start_ns, next(self._seq), fut, fn, args))
            self._pending += 1
            self._cv.notify()
        return fut

    async def run(self, priority: tuple, fn, *args):
        return await asyncio.wrap_future(self.submit(priority, fn, *args))

    def busy_ns(self) -> int:
        """Total time the workers spent running operations (for saturation = busy / (workers x interval))."""
        return sum(self._busy_ns)

    def _take(self):
        """The next operation and its class (None with strict priority); called under _cv with work pending."""
        self._pending -= 1
        if self._weights is None:
            _, _, fut, fn, args = heapq.heappop(self._heap)
            return None, fut, fn, args
        cls = min((c for c, q in self._queues.items() if q), key=lambda c: (self._vtime[c], c))
        self._vnow = self._vtime[cls]
        self._vtime[cls] += self._estimate_ns[cls] / self._weights[cls]
        _, _, fut, fn, args = heapq.heappop(self._queues[cls])
        return cls, fut, fn, args

    def _charge(self, cls, estimate_ns: int, used_ns: int) -> None:
        with self._cv:
            self._vtime[cls] += (used_ns - estimate_ns) / self._weights[cls]
            self._estimate_ns[cls] = (3 * self._estimate_ns[cls] + used_ns) // 4

    def _work(self, index: int) -> None:
        while True:
            with self._cv:
                while not self._pending and not self._closed:
                    self._cv.wait()
                if not self._pending:
                    return
                cls, fut, fn, args = self._take()
                estimate_ns = self._estimate_ns[cls] if cls is not None else 0
            if not fut.set_running_or_notify_cancel():
                if cls is not None:
                    self._charge(cls, estimate_ns, 0)
                continue
            t0 = time.perf_counter_ns()
            try:
                result = fn(*args)
            except BaseException as exc:
                used = time.perf_counter_ns() - t0
                fut.set_exception(exc)
            else:
                used = time.perf_counter_ns() - t0
                fut.set_result(result)
            self._busy_ns[index] += used
            if cls is not None:
                self._charge(cls, estimate_ns, used)

    def shutdown(self, cancel_pending: bool = True) -> None:
        """Stop taking work; drop what has not started (if asked); wait for what is running."""
        with self._cv:
            self._closed = True
            if cancel_pending:
                queues = [self._heap] + (list(self._queues.values()) if self._weights is not None else [])
                for q in queues:
                    for entry in q:
                        entry[2].cancel()
                    q.clear()
                self._pending = 0
            self._cv.notify_all()
        for t in self._threads:
            t.join()
