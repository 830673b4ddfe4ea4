#!/usr/bin/env python3
"""Crash consistency of kvtier's directory tiers, as a figure: kill -9 a writer again and again, restart, verify.

A child process puts entries of mixed sizes into a real TieredStore (a DiskTier with spare-file reuse on, above a
SharedDirTier), O_DIRECT in one tier and buffered in the other (swapped every round), both with the durability
policy --sync (entry: fdatasync and directory fsync per put; none: neither; a kill spares the page cache, so
neither may lose an acknowledged put), and appends each key to a log it fsyncs after the put returns (the
acknowledgement). The parent SIGKILLs it at a random moment (after a random
number of acknowledged puts, plus a random 0-4 ms, so the kill lands anywhere in a put: in the payload write, the
fdatasync, the rename, a spare overwrite, an eviction). After each kill the parent restarts the tiers on the same
directories, as the backend does on start: both are rescanned with payload verification, then it checks
- every adopted entry reads back exactly the bytes that were put (payloads are derived from the key, so the parent
  needs nothing of the child's memory); a wrong byte returned is "corrupt served" and must be 0;
- the last acknowledged put of the round is there (it was durable before the kill);
- no temp file (a write in flight, a spare) survives the rescan;
- each tier's accounted bytes and entries equal the entry files in its directory.
With --corrupt-every N the parent also damages entries by hand before every Nth restart (a flipped payload byte, a
truncated file, a torn header, half a file): they must all be found and dropped, never adopted or served.

The shared tier is rescanned with stale_tmp_s=0 here: this loop is its only writer (a fleet keeps the default 600 s,
because a younger temp file may be another instance's write in flight).

  python benchmarks/crash_loop.py --kills 50 --dir /var/tmp/kvtier-crash
  python benchmarks/crash_loop.py --kills 20 --large --sync none
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

import numpy as np
import xxhash

from kvconnector import uring
from kvconnector.entry_format import ENTRY_NAME, PAGE, TEMP_NAME, file_name_for
from kvconnector.persistence import rescan_dir
from kvconnector.shared_tier import SharedDirTier
from kvconnector.store import TieredStore
from kvconnector.tiers import DiskTier
from kvconnector.timed_io import aligned_buffer, read_header
from replay.common.leftovers import disk_temp_dir

SPARE_RATIO = 0.3
# The checkout this file is in: its child imports this checkout's kvtier, not whichever one is installed.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass(frozen=True)
class Profile:
    sizes: tuple[int, ...]  # drawn per put; repeated sizes so evicted files are reused as spares
    disk_bytes: int
    shared_bytes: int
    max_acks: int  # acknowledged puts before a kill: up to this many
    kill_window_s: float  # the kill lands this long at most after the last acknowledgement: within the next put


# Mixed small sizes: sub-page, page-aligned, unaligned.
SMALL = Profile(
    (1000, 4096, 10_000, 65_536, 65_536, 65_536, 200_001, 262_144, 262_144, 1_000_000), 2_000_000, 4_000_000, 40, 0.004
)
# --large: the paths only large entries take (timed_io): from 1 MiB the checksum is computed beside the payload's
# write and its header page written last; from 64 MiB a read comes in pieces hashed behind the next, and a write in
# several calls. 2 MiB + 1 and 32 MiB (an LMCache chunk of Llama-3.1-8B, 256 tokens), 80 MiB + 5.
LARGE = Profile(
    (65_536, 1_000_000, 2_097_153, 2_097_153, 33_554_432, 33_554_432, 83_886_085), 200_000_000, 400_000_000, 8, 0.15
)


def payload(key: str) -> bytes:
    """The bytes of `key`'s entry: its size is the key's last field, its content seeded by the key."""
    size = int(key.rsplit("-", 1)[1])
    return np.random.default_rng(xxhash.xxh64_intdigest(key.encode())).bytes(size)


def modes(round_no: int) -> tuple[str, str]:
    """(disk, shared) I/O modes: O_DIRECT and buffered, swapped every round."""
    return ("direct", "buffered") if round_no % 2 == 0 else ("buffered", "direct")


def open_store(
    d: str, round_no: int, verify_payload: bool = True, p: Profile = SMALL, sync: str = "entry"
) -> tuple[TieredStore, list]:
    """The tiers on d, rescanned (bottom tier first, as the backend does), with payload verification; both tiers
    with the sync policy `sync` (kvconnector.timed_io.Sync)."""
    disk_mode, shared_mode = modes(round_no)
    store = TieredStore(
        [
            DiskTier(os.path.join(d, "disk"), p.disk_bytes, disk_mode, spare_ratio=SPARE_RATIO, sync=sync),
            SharedDirTier(os.path.join(d, "shared"), p.shared_bytes, shared_mode, sync=sync),
        ]
    )
    reports = [
        rescan_dir(store, 1, verify_payload=verify_payload, stale_tmp_s=0.0, shared=True),
        rescan_dir(store, 0, verify_payload=verify_payload),
    ]
    return store, reports


@functools.cache
def registered_buffer(nbytes: int) -> memoryview:
    """Memory as LMCache's CPU buffer is (4 KiB pages, long-lived: one per size and process), offered to io_uring as
    the adapters offer that: puts and reads from and into it take the ring's registered-buffer paths."""
    buf = aligned_buffer(nbytes)
    uring.offer_view(buf)
    return buf


# ---- the child: puts until it is killed ------------------------------------------------------------------------------
def child(d: str, round_no: int, seed: int, log_path: str, p: Profile, sync: str) -> None:
    store, _ = open_store(d, round_no, p=p, sync=sync)
    rng = random.Random(seed)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    disk = store.tiers[0]
    src = registered_buffer(max(p.sizes))
    for i in range(1_000_000):
        key = f"r{round_no}-{i}-{rng.choice(p.sizes)}"
        want = payload(key)
        src[: len(want)] = want
        r = store.put(key, [src[: len(want)]])
        if not r.stored:
            raise SystemExit(f"crash_loop child: put {key} refused: {r.reason}")
        os.write(fd, f"{key} {disk.counters['spare_writes']} {uring.registry.fixed_ops}\n".encode())
        os.fsync(fd)  # acknowledged: from here the entry must survive a kill


# ---- the parent ---------------------------------------------------------------------------------------------------
@dataclass
class Figures:
    kills: int = 0
    stores: int = 0  # acknowledged puts
    spare_writes: int = 0  # of them, overwriting a spare file in place
    adopted: int = 0  # entries adopted by the restarts (summed over restarts)
    verified: int = 0  # adopted entries read back byte for byte
    corrupt_injected: int = 0
    corrupt_dropped: int = 0  # found by a rescan and removed (injected, or torn by a kill)
    temp_removed: int = 0  # temp files (writes in flight, spares) a kill left behind, removed by the rescans
    duplicates_removed: int = 0  # second copies a kill in the middle of a demotion left behind, removed
    corrupt_served: int = 0  # a read returned bytes other than those put: must be 0
    adopted_unreadable: int = 0  # adopted, then refused by the load's own check: must be 0
    acked_lost: int = 0  # a round's last acknowledged put missing after the restart: must be 0
    temp_survived: int = 0  # temp files left after a rescan: must be 0
    accounting_mismatch: int = 0  # restarts where a tier's accounted bytes differ from its files: must be 0
    o_direct_fallbacks: int = 0
    # Transfers through io_uring's registered buffers (kvconnector/uring.py): the children's puts up to their last
    # acknowledged one, and the restarts' reads (both from and into a registered buffer, as LMCache's).
    uring_writes: int = 0
    uring_reads: int = 0
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not (
            self.corrupt_served
            or self.adopted_unreadable
            or self.acked_lost
            or self.temp_survived
            or self.accounting_mismatch
            or self.corrupt_dropped < self.corrupt_injected
        )


def read_log(path: str) -> list[tuple[str, int]]:
    try:
        with open(path) as fh:
            lines = fh.read().split("\n")
    except FileNotFoundError:
        return []
    # The last line may be cut short by the kill only if its write was: a line counts once it ends in a newline.
    return [(k, int(s), int(u)) for k, s, u in (line.split() for line in lines[:-1])]


def corrupt_some(d: str, rng: random.Random, spare: str | None) -> int:
    """Damage up to four entry files by hand, one way each; returns how many. The entry of key `spare` (the round's
    last acknowledged put) is never one: its check is that a kill cannot lose it, and a file damaged by hand is lost
    by design (dropped, not served)."""
    keep = file_name_for(spare) if spare is not None else None
    files = sorted(
        os.path.join(d, t, n)
        for t in ("disk", "shared")
        for n in os.listdir(os.path.join(d, t))
        if ENTRY_NAME.fullmatch(n) and n != keep
    )
    victims = rng.sample(files, min(4, len(files)))
    for how, path in zip(("flip", "truncate", "header", "half"), victims):
        size = os.path.getsize(path)
        nbytes = read_header(path).payload_nbytes  # the padding after the payload is nobody's bytes: damage the payload
        with open(path, "r+b") as fh:
            if how == "flip":  # one payload byte: the header still verifies, the payload checksum does not
                fh.seek(PAGE + rng.randrange(nbytes))
                b = fh.read(1)
                fh.seek(-1, 1)
                fh.write(bytes([b[0] ^ 0x40]))
            elif how == "truncate":  # the end of the file is gone
                fh.truncate(size - PAGE)
            elif how == "header":  # a torn header: its own checksum fails
                fh.seek(rng.randrange(4, 40))
                fh.write(b"\xff\xff")
            else:  # the first half of a write, the rest never written (zeros)
                fh.seek(PAGE + nbytes // 2)
                fh.write(bytes(nbytes - nbytes // 2))
    return len(victims)


def check_restart(
    d: str,
    round_no: int,
    f: Figures,
    last_acked: str | None,
    verify_payload: bool = True,
    p: Profile = SMALL,
    sync: str = "entry",
) -> None:
    store, reports = open_store(d, round_no, verify_payload, p, sync)
    try:
        f.adopted += sum(r.adopted for r in reports)
        f.corrupt_dropped += sum(r.corrupt_removed for r in reports)
        f.temp_removed += sum(r.stale_tmp_removed for r in reports)
        f.duplicates_removed += sum(r.duplicate_removed for r in reports)
        f.o_direct_fallbacks += sum(t.fallbacks["o_direct_unavailable"] for t in store.tiers)
        dest = registered_buffer(max(p.sizes))
        for keys in store.keys_by_tier().values():
            for key in keys:
                want = payload(key)
                out = dest[: len(want)]
                if not store.get(key, out).hit:
                    f.adopted_unreadable += 1
                elif out != want:
                    f.corrupt_served += 1
                else:
                    f.verified += 1
        if last_acked is not None and store.contains(last_acked) is None:
            f.acked_lost += 1
        for tier, usage in zip(store.tiers, store.usage()):
            names = os.listdir(tier.directory)
            f.temp_survived += sum(1 for n in names if TEMP_NAME.fullmatch(n))
            entries = [n for n in names if ENTRY_NAME.fullmatch(n)]
            on_disk = sum(read_header(os.path.join(tier.directory, n)).payload_nbytes for n in entries)
            if (on_disk, len(entries)) != (usage["used_bytes"], usage["entries"]):
                f.accounting_mismatch += 1
    finally:
        store.close()


def run_loop(
    d: str,
    kills: int,
    seed: int = 0,
    corrupt_every: int = 0,
    max_acks: int | None = None,
    verify_payload: bool = True,
    p: Profile = SMALL,
    sync: str = "entry",
) -> Figures:
    """Kill a writing child `kills` times in d (which must be empty or absent), checking a restart after each.
    `verify_payload=False` restarts with header-only rescans: what the figures must show as a failure. `sync`: the
    tiers' durability policy; a kill leaves the page cache in place, so even with `none` nothing acknowledged may be
    lost (a power cut is another matter)."""
    max_acks = max_acks or p.max_acks
    rng = random.Random(seed)
    f = Figures()
    t0 = time.monotonic()
    uring_reads_before = uring.registry.fixed_ops
    os.makedirs(d, exist_ok=True)
    log_path = os.path.join(d, "acks.log")
    for n in range(kills):
        if os.path.exists(log_path):
            os.unlink(log_path)
        target = rng.randrange(max_acks)  # acknowledged puts before the kill: 0 kills it during start-up
        proc = subprocess.Popen(
            [
                sys.executable,
                os.path.abspath(__file__),
                "--child",
                "--dir",
                d,
                "--round",
                str(n),
                "--seed",
                str(seed * 100_003 + n),
                "--log",
                log_path,
                *(["--large"] if p is LARGE else []),
                "--sync",
                sync,
            ],
            env=dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))),
        )
        deadline = time.monotonic() + 60
        while len(read_log(log_path)) < target and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        time.sleep(rng.uniform(0, p.kill_window_s))
        if proc.poll() is not None:
            raise RuntimeError(f"crash_loop: the child exited by itself with status {proc.returncode}")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        f.kills += 1
        acks = read_log(log_path)
        f.stores += len(acks)
        if acks:
            f.spare_writes += acks[-1][1]
            f.uring_writes += acks[-1][2]
        if corrupt_every and (n + 1) % corrupt_every == 0:
            f.corrupt_injected += corrupt_some(d, rng, acks[-1][0] if acks else None)
        check_restart(d, n + 1, f, acks[-1][0] if acks else None, verify_payload, p, sync)
    f.uring_reads = uring.registry.fixed_ops - uring_reads_before
    f.elapsed_s = round(time.monotonic() - t0, 1)
    return f


def table(f: Figures) -> str:
    rows = [
        ("kills (SIGKILL)", f.kills),
        ("stores acknowledged", f.stores),
        ("  of them spare overwrites", f.spare_writes),
        ("adopted by the restarts", f.adopted),
        ("  read back byte for byte", f.verified),
        ("corrupt injected by hand", f.corrupt_injected),
        ("corrupt found and dropped", f.corrupt_dropped),
        ("  of them torn by a kill", max(0, f.corrupt_dropped - f.corrupt_injected)),
        ("temp files removed", f.temp_removed),
        ("second copies removed", f.duplicates_removed),
        ("corrupt served", f.corrupt_served),
        ("adopted but unreadable", f.adopted_unreadable),
        ("acknowledged puts lost", f.acked_lost),
        ("temp files after rescan", f.temp_survived),
        ("accounting mismatches", f.accounting_mismatch),
        ("O_DIRECT fallbacks", f.o_direct_fallbacks),
        ("io_uring transfers, puts", f.uring_writes),
        ("io_uring transfers, reads", f.uring_reads),
        ("elapsed (s)", f.elapsed_s),
    ]
    return "\n".join(f"{k:<28}{v:>10}" for k, v in rows) + f"\n{'result':<28}{'PASS' if f.ok else 'FAIL':>10}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="example:\n  " + __doc__.rsplit("\n\n", 1)[1].strip(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--kills", type=int, default=50, help="how many times the writer is killed (default 50)")
    ap.add_argument(
        "--dir", help="where the tiers live (must be new or empty; default: a temporary directory, removed)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--corrupt-every", type=int, default=10, help="damage entries by hand before every Nth restart (0 = never)"
    )
    ap.add_argument(
        "--large", action="store_true", help="entries of 2 MiB to 80 MiB (the large-entry write and read paths)"
    )
    ap.add_argument(
        "--sync",
        choices=["entry", "none"],
        default="entry",
        help="the tiers' durability policy (default entry); a kill must lose nothing acknowledged under either",
    )
    ap.add_argument("--json", action="store_true", help="print the figures as JSON instead of a table")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--round", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--log", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        child(a.dir, a.round, a.seed, a.log, LARGE if a.large else SMALL, a.sync)
        return 0
    if a.kills < 1 or a.corrupt_every < 0:
        ap.error("--kills must be >= 1 and --corrupt-every >= 0")
    if a.dir and os.path.exists(a.dir) and not (os.path.isdir(a.dir) and not os.listdir(a.dir)):
        print(f"crash_loop: --dir {a.dir} is not an empty directory; give a new or empty one", file=sys.stderr)
        return 2
    d = a.dir or tempfile.mkdtemp(prefix="kvtier-crash-", dir=disk_temp_dir())
    try:
        f = run_loop(d, a.kills, a.seed, a.corrupt_every, p=LARGE if a.large else SMALL, sync=a.sync)
    finally:
        if not a.dir:
            shutil.rmtree(d, ignore_errors=True)
    print(json.dumps(asdict(f), indent=1) if a.json else table(f))
    return 0 if f.ok else 1


if __name__ == "__main__":
    sys.exit(main())
