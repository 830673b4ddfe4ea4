"""Entry payloads sliced from one pre-generated random buffer (MLPerf KV Cache spec section 8.4).

Generating random data per request would cost more CPU than the I/O it feeds; slicing a 256 MiB random buffer costs
nothing. Slices start on page boundaries, so O_DIRECT writes take them without a copy. Entries larger than the buffer
wrap around it as several views, made on demand (`Chunks`): building a payload is O(1) whatever its size, so it never
holds up the event loop, and no list proportional to the entry is made until the I/O thread walks it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np

from kvconnector.entry_format import PAGE
from kvconnector.timed_io import aligned_buffer


class RandomPayload:
    def __init__(self, size_mb: int = 256, seed: int | None = None) -> None:
        size = size_mb << 20
        self._buf = aligned_buffer(size, huge=True)  # long-lived, carries every O_DIRECT write of the run
        gen = np.random.default_rng(seed)
        step = 16 << 20
        for pos in range(0, size, step):  # in pieces, so start-up does not need a second copy of the buffer
            n = min(step, size - pos)
            self._buf[pos : pos + n] = gen.bytes(n)
        self.size = size
        self._pages = size // PAGE

    def chunks(self, nbytes: int, rng: random.Random) -> Chunks:
        return Chunks(self._buf, rng.randrange(self._pages) * PAGE, nbytes)


class Chunks(Sequence):
    """`nbytes` of the buffer from `start`, wrapping around: view i is made when asked for (no list is built)."""

    __slots__ = ("_buf", "_first", "_n", "_size", "_start", "nbytes")

    def __init__(self, buf: memoryview, start: int, nbytes: int) -> None:
        self._buf, self._start, self.nbytes = buf, start, max(0, nbytes)
        self._size = len(buf)
        self._first = min(self.nbytes, self._size - start)
        rest = self.nbytes - self._first
        self._n = (1 if self._first else 0) + -(-rest // self._size)

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._n))]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(i)
        if i == 0:
            return self._buf[self._start : self._start + self._first]
        pos = self._first + (i - 1) * self._size
        return self._buf[: min(self._size, self.nbytes - pos)]
