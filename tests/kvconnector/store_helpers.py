"""Entries for the store tests: bytes derived from the key, put into a store and read back."""

import numpy as np


def data(key: str, n: int) -> bytes:
    # Bytes derived from the key, so any mix-up between entries shows.
    seed = int.from_bytes(key.encode()[-8:].rjust(8, b"\0"), "little")
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def put(store, key, n):
    return store.put(key, [memoryview(data(key, n))])


def read(store, key, n):
    out = memoryview(bytearray(n))
    res = store.get(key, out)
    return res, bytes(out)
