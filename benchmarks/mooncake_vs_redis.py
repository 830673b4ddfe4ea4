#!/usr/bin/env python3
"""Put and get through kvtier's Mooncake Store tier and its Redis tier, one process, same entries, alternating rounds.

Starts its own servers on 127.0.0.1 (free ports): redis-server (no persistence) and a Mooncake Store (the wheel's
mooncake_master and HTTP metadata server); one client each, over TCP. Each round writes `--count` entries of
`--size` bytes through each tier, then reads them back (checked: header and checksum, as every read), then deletes
them. Reported per tier: median put and get latency over all operations, MB/s of a round (medians over rounds), and
Mooncake / Redis as a ratio. Both are single-threaded clients here, so this is latency-bound, not a bandwidth figure.

  python -m benchmarks.mooncake_vs_redis                       # 1 MiB x 64, 5 rounds, about 20 s
  python -m benchmarks.mooncake_vs_redis --size 4MiB --count 32 --rounds 7
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from kvconnector.mooncake_tier import MooncakeTier
from kvconnector.redis_tier import RedisTier
from kvconnector.units import parse_size
from replay.common.ports import free_port

MiB = 1 << 20


def _exe(name: str) -> str:
    here = os.path.join(os.path.dirname(sys.executable), name)
    return here if os.access(here, os.X_OK) else (shutil.which(name) or sys.exit(f"{name} is not installed"))


def _wait_port(port: int, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{what} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"{what} did not listen on {port} within 20 s")


def start_servers(log_dir: str) -> tuple[list[subprocess.Popen], str, str, str]:
    rp, mp, hp, metrics = free_port(), free_port(), free_port(), free_port()

    def spawn(argv, log):
        with open(os.path.join(log_dir, log), "wb") as out:
            return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    redis = spawn([_exe("redis-server"), "--bind", "127.0.0.1", "--port", str(rp), "--save", "", "--dir", log_dir], "r")
    meta = spawn([_exe("mooncake_http_metadata_server"), "--host", "127.0.0.1", "--port", str(hp)], "meta.log")
    master = spawn(
        [
            _exe("mooncake_master"),
            "--rpc_address=127.0.0.1",
            f"--rpc_port={mp}",
            "--metrics_host=127.0.0.1",
            f"--metrics_port={metrics}",
            "--enable_metric_reporting=false",
        ],
        "master.log",
    )
    procs = [redis, meta, master]
    for port, p, what in ((rp, redis, "redis-server"), (hp, meta, "metadata server"), (mp, master, "mooncake_master")):
        _wait_port(port, p, what)
    return procs, f"redis://127.0.0.1:{rp}/0", f"127.0.0.1:{mp}", f"http://127.0.0.1:{hp}/metadata"


def one_round(t, payloads: list[bytes], out: memoryview, lat: dict[str, list[float]]) -> tuple[float, float]:
    n = len(payloads[0])
    t0 = time.perf_counter_ns()
    for i, p in enumerate(payloads):
        s = time.perf_counter_ns()
        t.write(f"k{i}", [memoryview(p)], n)
        lat["put"].append((time.perf_counter_ns() - s) / 1e6)
    t1 = time.perf_counter_ns()
    for i in range(len(payloads)):
        s = time.perf_counter_ns()
        t.read(f"k{i}", n, out)
        lat["get"].append((time.perf_counter_ns() - s) / 1e6)
    t2 = time.perf_counter_ns()
    assert bytes(out[:64]) == payloads[-1][:64]
    for i in range(len(payloads)):
        t.delete(f"k{i}")
    total_mb = n * len(payloads) / 1e6
    return total_mb / ((t1 - t0) / 1e9), total_mb / ((t2 - t1) / 1e9)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="1MiB", help="entry payload size (default 1MiB)")
    ap.add_argument("--count", type=int, default=64, help="entries per round (default 64)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds, alternating the tiers (default 5)")
    a = ap.parse_args(argv)
    size = int(parse_size(a.size))
    rng = np.random.default_rng(0)
    payloads = [rng.integers(0, 256, size, dtype=np.uint8).tobytes() for _ in range(a.count)]
    cap = 2 * size * a.count + 16 * MiB
    with tempfile.TemporaryDirectory(prefix="mc-vs-redis-") as d:
        procs, redis_url, master, meta = start_servers(d)
        tiers = {}
        try:
            tiers["redis"] = RedisTier(redis_url, cap, namespace="bench")
            tiers["mooncake"] = MooncakeTier(master, meta, cap, namespace="bench", local_buffer_bytes=size + 32 * MiB)
            out = memoryview(bytearray(size))
            lat = {k: {"put": [], "get": []} for k in tiers}
            rate = {k: {"put": [], "get": []} for k in tiers}
            for r in range(a.rounds):
                for name in tiers if r % 2 == 0 else reversed(list(tiers)):
                    put_mbs, get_mbs = one_round(tiers[name], payloads, out, lat[name])
                    rate[name]["put"].append(put_mbs)
                    rate[name]["get"].append(get_mbs)
        finally:
            for t in tiers.values():
                t.close()
            for p in reversed(procs):
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(10)
    print(f"{a.count} x {a.size} entries, {a.rounds} rounds, one client each over TCP on 127.0.0.1")
    print(f"{'':10} {'put ms p50':>11} {'get ms p50':>11} {'put MB/s':>9} {'get MB/s':>9}")
    med = {
        k: [statistics.median(lat[k]["put"]), statistics.median(lat[k]["get"])]
        + [statistics.median(rate[k]["put"]), statistics.median(rate[k]["get"])]
        for k in tiers
    }
    for k, (pl, gl, pr, gr) in med.items():
        print(f"{k:10} {pl:11.3f} {gl:11.3f} {pr:9.0f} {gr:9.0f}")
    ratio = [m / r for m, r in zip(med["mooncake"], med["redis"])]
    print(f"{'ratio':10} {ratio[0]:11.2f} {ratio[1]:11.2f} {ratio[2]:9.2f} {ratio[3]:9.2f}   (mooncake / redis)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
