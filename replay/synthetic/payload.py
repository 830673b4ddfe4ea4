"""Entry payloads sliced from one pre-generated random buffer (MLPerf KV Cache spec section 8.4).

Generating random data per request would cost more CPU than the I/O it feeds; slicing a 256 MiB random buffer costs
nothing. Slices start on page boundaries, so O_DIRECT writes take them without a copy. Entries larger than the buffer
wrap around it as several views.
"""

from __future__ import annotations

import random

import numpy as np

from kvconnector.entry_format import PAGE
from kvconnector.timed_io import aligned_buffer


class RandomPayload:
    def __init__(self, size_mb: int = 256, seed: int | None = None) -> None:
        size = size_mb << 20
        self._buf = aligned_buffer(size)
        gen = np.random.default_rng(seed)
        step = 16 << 20
        for pos in range(0, size, step):  # in pieces, so start-up does not need a second copy of the buffer
            n = min(step, size - pos)
            self._buf[pos : pos + n] = gen.bytes(n)
        self.size = size
        self._pages = size // PAGE

    def chunks(self, nbytes: int, rng: random.Random) -> list[memoryview]:
        pos = rng.randrange(self._pages) * PAGE
        out = []
        while nbytes > 0:
            n = min(nbytes, self.size - pos)
            out.append(self._buf[pos : pos + n])
            nbytes -= n
            pos = 0
        return out
