"""The GPU tier on a real CUDA device. Skipped where there is none (every CI machine); run by benchmarks/gpu_check.sh
on a machine with a GPU. No fake GPU: the CPU-only path is the tested default elsewhere."""

import numpy as np
import pytest

from kvconnector.store import TieredStore
from kvconnector.tiers import CPUTier, DiskTier, GPUTier, cuda_torch
from kvconnector.timed_io import IOMode, aligned_buffer

pytestmark = pytest.mark.skipif(cuda_torch() is None, reason="needs a CUDA device and torch with CUDA")

MB = 1 << 20


def payload(n, seed):
    buf = aligned_buffer(n)[:n]
    buf[:] = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()
    return buf


def test_gpu_tier_round_trip_is_byte_exact_and_timed():
    tier = GPUTier(256 * MB)
    src = payload(7 * MB + 123, 1)
    w = tier.write("k", [src[: 3 * MB], src[3 * MB :]], len(src))
    assert w.device_ns > 0 and w.nbytes == len(src)
    out = aligned_buffer(len(src))[: len(src)]
    r = tier.read("k", len(src), out)
    assert bytes(out) == bytes(src) and r.device_ns > 0
    tier.read("k", len(src))  # sink read through scratch
    tier.delete("k")


def test_waterfall_gpu_to_cpu_to_disk_keeps_bytes(tmp_path):
    store = TieredStore([GPUTier(40 * MB), CPUTier(40 * MB), DiskTier(str(tmp_path), 400 * MB, IOMode.DIRECT)])
    data = {f"k{i}": payload(10 * MB, i) for i in range(12)}
    for k, v in data.items():
        assert store.put(k, [v]).stored
    tiers = {k: store.contains(k) for k in data}
    assert set(tiers.values()) == {"gpu", "cpu", "disk"}
    for k, v in data.items():
        out = aligned_buffer(len(v))[: len(v)]
        assert store.get(k, out).hit and bytes(out) == bytes(v), (k, tiers[k])
    assert store.stats[0].events["demotions_out"] > 0 and store.stats[1].events["demotions_out"] > 0


def test_empty_entries_odd_buffers_and_close_on_the_gpu_tier(tmp_path):
    """The store's API contract (test_store_api.py) with a GPU tier on top: an empty entry goes down the waterfall,
    a numpy float destination takes the bytes, a too-small one is refused, a closed store refuses everything."""
    from kvconnector.errors import InvalidArgumentError, StoreClosedError

    store = TieredStore([GPUTier(4 * MB), DiskTier(str(tmp_path), 40 * MB, IOMode.DIRECT)])
    assert store.put("empty", [memoryview(b"")]).tier == "gpu"
    floats = np.arange(MB // 4, dtype=np.float32)
    assert store.put("f", [floats]).tier == "gpu" and store.entry_info("f")[0] == MB
    for i in range(4):  # pushes both down to the disk tier
        store.put(f"fill{i}", [payload(MB, i)])
    assert store.get("empty", bytearray()).hit
    out = np.zeros(MB // 4, dtype=np.float32)
    assert store.get("f", out).hit and np.array_equal(out, floats)
    with pytest.raises(InvalidArgumentError, match="dest holds 10 bytes"):
        store.get("fill3", bytearray(10))
    store.close()
    with pytest.raises(StoreClosedError):
        store.put("late", [memoryview(b"x")])
