"""The floor under kvtier's disk tier: the same system calls in a bare loop, no kvtier code, variant by variant.

Each variant writes (or reads) `--total-gib` in objects of `--object-mib` with `--threads` threads, O_DIRECT from one
page-aligned buffer, and reports GB/s. Rounds run the variants in alternating order and the table shows medians, so a
disk that drifts during the run weighs on every variant alike. What the variants separate:

  new                 a new file per object, pwrite only (no durability)
  new+durable         a new file per object: posix_fallocate, pwrite, fdatasync (kvtier's fill of an empty tier)
  new+durable-nofalloc  the same without posix_fallocate: the O_DIRECT write allocates the blocks itself
  overwrite           one file per object, laid out before, overwritten in place + fdatasync (kvtier's spare files)
  overwrite+rename    the same, written under a temp name and renamed into place, with an xxh3 of the payload
  fio-layout          one large file per thread, overwritten at object offsets + fdatasync (how fio lays out a job)
  spare-fallocated    one file per object, fallocated ahead but never written (unwritten extents), then written in
                      place + fdatasync (a spare laid out in idle time by fallocate alone)
  segment-fallocated  one large file per thread, fallocated ahead but never written, written at object offsets +
                      fdatasync (a fresh preallocated segment file; fio's first round)
  read                O_DIRECT read of each object file
  read+xxh3           the same, plus the xxh3 kvtier checks on every read

examples:
  python benchmarks/syscall_floor.py --dir /var/tmp/floor
  python benchmarks/syscall_floor.py --dir /mnt/nvme/floor --object-mib 32 --total-gib 4 --rounds 5
"""

from __future__ import annotations

import argparse
import mmap
import os
import shutil
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import xxhash

from deploy.host import drop_caches

WRITES = (
    "new",
    "new+durable",
    "new+durable-nofalloc",
    "overwrite",
    "overwrite+rename",
    "fio-layout",
    "spare-fallocated",
    "segment-fallocated",
)
READS = ("read", "read+xxh3")


def _write_object(
    path: str, buf: mmap.mmap, *, create: bool, durable: bool, rename: bool, offset: int = 0, falloc: bool = True
) -> None:
    target = path + ".tmp" if rename else path
    if rename:
        os.replace(path, target)  # a spare file taken for the next entry: kvtier renames it back when done
    flags = os.O_WRONLY | os.O_DIRECT | os.O_CLOEXEC | (os.O_CREAT | os.O_TRUNC if create else 0)
    fd = os.open(target, flags, 0o644)
    try:
        if create and durable and falloc:
            os.posix_fallocate(fd, 0, len(buf))
        if rename:
            xxhash.xxh3_64_intdigest(buf)
        os.pwrite(fd, buf, offset)
        if durable:
            os.fdatasync(fd)
    finally:
        os.close(fd)
    if rename:
        os.replace(target, path)


def _read_object(path: str, buf: mmap.mmap, checksum: bool) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT | os.O_CLOEXEC)
    try:
        os.preadv(fd, [buf], 0)
    finally:
        os.close(fd)
    if checksum:
        xxhash.xxh3_64_intdigest(buf)


def run_variant(name: str, directory: str, n_objects: int, object_bytes: int, threads: int) -> float:
    bufs = [mmap.mmap(-1, object_bytes) for _ in range(threads)]  # page-aligned, as O_DIRECT wants
    for b in bufs:
        b.write(os.urandom(1 << 20) * (object_bytes >> 20))
    objects = [os.path.join(directory, f"obj-{i}") for i in range(n_objects)]
    if name.startswith("new"):  # new files: the objects laid out before are removed first (not timed)
        for p in objects:
            if os.path.exists(p):
                os.unlink(p)
    fresh = [os.path.join(directory, f"fresh-{i}") for i in range(n_objects)]
    segments = [os.path.join(directory, f"seg-{t}") for t in range(threads)]
    if name == "spare-fallocated":
        for p in fresh:
            _fallocate_new(p, object_bytes)
    if name == "segment-fallocated":
        for p in segments:
            _fallocate_new(p, -(-n_objects // threads) * object_bytes)
    # What the set-up freed or allocated reaches the journal (and, on a discard mount, the device) now, untimed.
    os.sync()
    per_thread = -(-n_objects // threads)

    def work(t: int) -> None:
        buf = bufs[t]
        for i in range(t * per_thread, min(n_objects, (t + 1) * per_thread)):
            if name == "new":
                _write_object(objects[i], buf, create=True, durable=False, rename=False)
            elif name == "new+durable":
                _write_object(objects[i], buf, create=True, durable=True, rename=False)
            elif name == "new+durable-nofalloc":
                _write_object(objects[i], buf, create=True, durable=True, rename=False, falloc=False)
            elif name == "overwrite":
                _write_object(objects[i], buf, create=False, durable=True, rename=False)
            elif name == "overwrite+rename":
                _write_object(objects[i], buf, create=False, durable=True, rename=True)
            elif name == "spare-fallocated":
                _write_object(fresh[i], buf, create=False, durable=True, rename=False)
            elif name == "segment-fallocated":
                off = (i - t * per_thread) * object_bytes
                _write_object(segments[t], buf, create=False, durable=True, rename=False, offset=off)
            elif name == "fio-layout":
                big = os.path.join(directory, f"job-{t}")
                _write_object(
                    big, buf, create=False, durable=True, rename=False, offset=(i - t * per_thread) * object_bytes
                )
            else:
                _read_object(objects[i], buf, checksum=name == "read+xxh3")

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(work, range(threads)))
    seconds = time.perf_counter() - t0
    for b in bufs:
        b.close()
    for p in fresh + segments:
        if os.path.exists(p):
            os.unlink(p)
    return n_objects * object_bytes / 1e9 / seconds


def lay_out(directory: str, n_objects: int, object_bytes: int, threads: int) -> None:
    """Files the overwrite variants and reads find in place: one per object, and one large file per thread."""
    buf = mmap.mmap(-1, object_bytes)
    for i in range(n_objects):
        _write_object(os.path.join(directory, f"obj-{i}"), buf, create=True, durable=True, rename=False)
    per_thread = -(-n_objects // threads)
    for t in range(threads):
        fd = os.open(os.path.join(directory, f"job-{t}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.posix_fallocate(fd, 0, per_thread * object_bytes)
        os.fsync(fd)
        os.close(fd)


def _fallocate_new(path: str, nbytes: int) -> None:
    """A new file with its blocks reserved but never written (unwritten extents), made durable."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.posix_fallocate(fd, 0, nbytes)
        os.fsync(fd)
    finally:
        os.close(fd)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True, help="a new or empty directory on the disk to measure (removed after)")
    ap.add_argument("--object-mib", type=int, default=16, help="object size in MiB (default 16)")
    ap.add_argument("--total-gib", type=float, default=2.0, help="bytes per variant and round (default 2)")
    ap.add_argument("--threads", type=int, default=8, help="writer/reader threads (default 8)")
    ap.add_argument("--rounds", type=int, default=4, help="rounds, variants in alternating order (default 4)")
    ap.add_argument("--variants", default="", help="comma-separated subset of the variants (default all)")
    args = ap.parse_args(argv)
    chosen = [v for v in args.variants.split(",") if v] or list(WRITES + READS)
    if unknown := sorted(set(chosen) - set(WRITES + READS)):
        ap.error(f"--variants: unknown {', '.join(unknown)} (known: {', '.join(WRITES + READS)})")
    if args.object_mib < 1 or args.total_gib <= 0 or args.threads < 1 or args.rounds < 1:
        ap.error("sizes, threads and rounds must be positive")
    if os.path.exists(args.dir) and (not os.path.isdir(args.dir) or os.listdir(args.dir)):
        ap.error(f"--dir {args.dir} must be a new or empty directory (it is removed afterwards)")
    os.makedirs(args.dir, exist_ok=True)
    object_bytes = args.object_mib << 20
    n_objects = max(args.threads, int(args.total_gib * (1 << 30)) // object_bytes)
    results: dict[str, list[float]] = {v: [] for v in chosen}
    try:
        lay_out(args.dir, n_objects, object_bytes, args.threads)
        for r in range(args.rounds):
            writes = [v for v in WRITES if v in chosen]
            order = writes if r % 2 == 0 else list(reversed(writes))
            for v in order + [v for v in READS if v in chosen]:
                if v in READS:
                    drop_caches()
                gbps = run_variant(v, args.dir, n_objects, object_bytes, args.threads)
                results[v].append(gbps)
                print(f"round {r + 1} {v:<22} {gbps:6.2f} GB/s", file=sys.stderr)
    finally:
        shutil.rmtree(args.dir, ignore_errors=True)
    base = statistics.median(results["fio-layout"]) if "fio-layout" in results else float("nan")
    print(f"\n{args.threads} threads, {args.object_mib} MiB objects, {n_objects} per variant, medians of {args.rounds}")
    print(f"{'variant':<22} {'GB/s':>6} {'x fio-layout':>13}")
    for v in chosen:
        med = statistics.median(results[v])
        ratio = f"{med / base:13.2f}" if v in WRITES else f"{'':>13}"
        print(f"{v:<22} {med:6.2f} {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
