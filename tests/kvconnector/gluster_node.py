"""One kvtier "node" on a shared directory, run as its own process by test_shared_glusterfs.py.

    python gluster_node.py --dir MOUNT/kv --name a --peer b --until EPOCH_S [--keys N] [--nbytes N] [--cap-mb M]
                           [--restored-file PATH --settle-s S]

Until the given wall-clock time it loops: store its own key `<name>-<i>` (removing it first, so every round writes a
fresh file), then load a key of its own or of the peer and compare every byte with what that key must hold (bytes
derived from the key, so a torn or foreign file cannot pass). Each operation is classified from the backend's own
counters and written with its end time and duration; the summary (JSON, one line on stdout) is what the test checks.
With --restored-file it also ends once the test has written the time a fault ended into that file and, since then and
since its last failed operation, S seconds have passed with a store and a load that worked: it has recovered.
"""

from __future__ import annotations

import argparse
import errno
import json
import random
import sys
import time
import zlib
from collections import Counter
from pathlib import Path

import numpy as np

from kvconnector.backend import KvtierBackend
from kvconnector.backend_config import BackendConfig


def payload(key: str, n: int) -> bytes:
    return np.random.default_rng(zlib.crc32(key.encode())).integers(0, 256, n, dtype=np.uint8).tobytes()


def classify(before: dict, after: dict, names: tuple[str, ...]) -> str:
    for name in names:
        if after.get(name, 0) > before.get(name, 0):
            return name
    return "other"


def _record_errors(tier, errnos: Counter, last: list) -> None:
    """Wrap the tier's read and write so each OSError they raise is counted by its errno name (then raised on)."""
    for name in ("read", "write"):
        inner = getattr(tier, name)

        def wrapped(*a, _inner=inner, _name=name, **kw):
            try:
                return _inner(*a, **kw)
            except OSError as exc:
                kind = f"{_name}:{errno.errorcode.get(exc.errno, str(exc.errno))}"
                errnos[kind] += 1
                last.append((time.time(), kind))
                raise

        setattr(tier, name, wrapped)


ERRORS = ("store_errors", "load_errors")


class Recovery:
    """Whether the fault is over and this node has worked cleanly for `settle_s` since: a store and a load that
    worked, and no failed operation. The test writes the time the fault ended into `path`."""

    def __init__(self, path: str | None, settle_s: float) -> None:
        self.path, self.settle_s = path, settle_s
        self.checked = 0.0

    def done(self, ops: list) -> bool:
        if not self.path or not ops or ops[-1][0] - self.checked < 0.5:  # looked at twice a second
            return False
        self.checked = ops[-1][0]
        try:
            restored_at = float(Path(self.path).read_text())
        except (OSError, ValueError):  # not written (yet)
            return False
        clean_from = max([restored_at, *(t for t, _, outcome, _ in ops if outcome in ERRORS)])
        worked = {(op, outcome) for t, op, outcome, _ in ops if t > clean_from}
        return ops[-1][0] - clean_from >= self.settle_s and {("put", "ok"), ("get", "hit")} <= worked


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--peer", required=True)
    ap.add_argument("--until", type=float, required=True)
    ap.add_argument("--keys", type=int, default=8)
    ap.add_argument("--nbytes", type=int, default=256 << 10)
    ap.add_argument("--cap-mb", type=float, default=64)
    ap.add_argument("--io-mode", default="direct")
    ap.add_argument("--store-only", action="store_true", help="only store (fill the tier), do not load")
    ap.add_argument("--restored-file", help="where the test writes the time the fault ended")
    ap.add_argument("--settle-s", type=float, default=10.0, help="clean seconds after it that end the run")
    args = ap.parse_args()
    be = KvtierBackend(
        BackendConfig(
            shared_dir=args.dir,
            shared_capacity_gb=args.cap_mb / 1024,
            shared_io_mode=args.io_mode,
            snapshot_path="",
            io_workers=1,
        )
    )
    errnos: Counter[str] = Counter()  # what the tier's failed reads and writes raised, by errno
    last_errors: list[tuple[float, str]] = []
    _record_errors(be.store.tiers[0], errnos, last_errors)
    rng = random.Random(args.name)
    data = {
        f"{who}-{i}": payload(f"{who}-{i}", args.nbytes) for who in (args.name, args.peer) for i in range(args.keys)
    }
    dest = memoryview(bytearray(args.nbytes))
    ops: list[tuple[float, str, str, float]] = []  # (end time, op, outcome, seconds)
    wrong = 0
    i = 0
    recovery = Recovery(args.restored_file, args.settle_s)
    while time.time() < args.until and not recovery.done(ops):
        key = f"{args.name}-{i % args.keys}" if not args.store_only else f"{args.name}-{i}"
        i += 1
        t0 = time.time()
        ev0 = be.events_snapshot()
        be.remove(key)
        ok = be.put(key, [memoryview(data.get(key) or payload(key, args.nbytes))])
        ev1 = be.events_snapshot()
        ops.append(
            (
                time.time(),
                "put",
                "ok" if ok else classify(ev0, ev1, ("store_errors", "store_refused_full", "store_refused_no_room")),
                time.time() - t0,
            )
        )
        if args.store_only:
            continue
        key = f"{rng.choice((args.name, args.peer))}-{rng.randrange(args.keys)}"
        t0 = time.time()
        st0 = dict(be.store.stats[0].events)
        hit = be.get_into(key, dest)
        ev2 = be.events_snapshot()
        if hit and bytes(dest) != data[key]:
            wrong += 1
        st1 = dict(be.store.stats[0].events)
        outcome = (
            "hit"
            if hit
            else classify({**ev1, **st0}, {**ev2, **st1}, ("corrupt_dropped", "vanished", "load_errors", "load_misses"))
        )
        ops.append((time.time(), "get", outcome, time.time() - t0))
    usage = be.store.usage()[0]
    out = {
        "name": args.name,
        "ops": ops,
        "wrong_bytes_served": wrong,
        "events": be.events_snapshot(),
        "tier_events": dict(be.store.stats[0].events),
        "fallbacks": dict(be.store.tiers[0].fallbacks),
        "used_bytes": usage["used_bytes"],
        "capacity_bytes": usage["capacity_bytes"],
        "keys": be.store.keys_by_tier()["shared"],
        "counts": dict(Counter(f"{op}:{outcome}" for _, op, outcome, _ in ops)),
        "errnos": dict(errnos),
        "last_errors": last_errors[-5:],
    }
    be.close()
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
