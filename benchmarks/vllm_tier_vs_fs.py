#!/usr/bin/env python3
"""vllm_tier_vs_fs.py	kvtier's tier vs vLLM's own fs tier behind vLLM's real tiering manager: GB/s, CPU, kill -9.

usage: benchmarks/vllm_tier_vs_fs.py [--dir DIR] [--chunk-mib 2] [--total-gb 1] [--batch 16] [--inflight 1]
                                     [--threads 8] [--rounds 3] [--kills 5] [--corrupt 4] [--no-drop-caches]
                                     [--json OUT]

Both secondary tiers sit behind the same vLLM objects, built as vLLM builds them (OffloadingSpecFactory ->
TieringOffloadingSpec -> TieringOffloadingManager with its CPU primary tier -> SecondaryTierFactory), driven through
the same scheduler calls by kvconnector.vllm.driver.ManagerDriver, on the same directory's filesystem:
- kvtier: kvconnector.vllm.tier.KvtierTier, one disk tier, O_DIRECT, fdatasync + rename, checksummed header;
- fs: vLLM's FileSystemTierManager ("fs"), O_DIRECT when the directory takes it (as here), write + rename, no fsync.
Each uses --threads I/O threads per direction. A third row, vLLM's in-memory "example" tier (it moves no bytes), is the
baseline: the same manager calls and the same copies in and out of the primary tier's memory (done by the driver
where vLLM's GPU worker would), so tier CPU = a side's CPU minus the baseline's.
- store: --total-gb of --chunk-mib chunks, --batch chunks per request, --inflight requests at a time (the primary
  holds one request more, so its chunks are reused as a running engine's are), stored and cascaded to the tier until
  their jobs finish (vLLM's fs tier runs each job, one request's chunks, as one task; kvtier one task per chunk);
- load (cold): the primary emptied (reset_cache), the page cache dropped (root), every chunk looked up, promoted
  from the tier and read back; the bytes are compared with what was stored (exit 1 on any difference or miss).
Every side runs --rounds times in a fresh directory, the order alternating between rounds; the table gives medians.
GB/s = 1e9 bytes per second of wall time; CPU = the process's user + system time (getrusage) per GB.
Durability: --kills times per side, a forked writer stores batches and logs (fsync'd) each batch whose store jobs
vLLM saw succeed (the acknowledgement); it is SIGKILLed after a random number of batches plus a random fraction of
the time a batch takes, so in the middle of a store.
Then --corrupt entry files get one payload byte flipped (bit rot, a torn copy), and a new manager opens the same
directory (kvtier rescans it) and loads every acknowledged chunk: "lost" = acknowledged, not served; "served
corrupt" = served with bytes that differ; "temp left" = writers' temp files still there after the restart.
A kill -9 leaves the page cache intact: a power cut, where the missing fsync would matter, is not simulated.

example (2 cores, virtio disk, root; the disk's speed drifts within a run, compare ratios):
  $ .venv/bin/python benchmarks/vllm_tier_vs_fs.py --total-gb 1 --rounds 3 --kills 5 --corrupt 4
  (prints a per-round line, then the table: store GB/s, cold load GB/s, tier CPU-s/GB both ways, fsync before
  acknowledging, and per side the acknowledged chunks lost, flipped bytes served and temp files left after the kills)
  $ .venv/bin/python benchmarks/vllm_tier_vs_fs.py --total-gb 0.05 --rounds 1 --kills 1 --no-drop-caches  # smoke
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import shutil
import signal
import statistics
import sys
import time
import uuid
from pathlib import Path

from deploy.host import cpu_s, drop_caches
from replay.outputs.provenance import write_run_json

ROOT = Path(__file__).resolve().parents[1]

SIDES = ("kvtier", "fs", "baseline")
KILL_BATCHES = 8  # a killed writer stores at most this many batches
# From the code: kvtier's DiskTier fdatasyncs before its rename; vLLM 0.32's fs tier writes and renames (io.py, and
# its C extension vllm/fs_io_C imports open, write and rename, no fsync or fdatasync).
DURABLE = {"kvtier": "yes (fdatasync, rename)", "fs": "no (write, rename)", "baseline": "-"}


def payload(i: int, nbytes: int, salt: int = 0) -> bytes:
    """Chunk i's bytes, derived from i alone (the parent checks a killed writer's chunks without its memory)."""
    import numpy as np

    return np.random.default_rng((salt << 32) | i).bytes(nbytes)


def tier_configs(side: str, d: Path, total_bytes: int, threads: int) -> list[dict]:
    from kvconnector.vllm.driver import fs_tier_config, kvtier_tier_config

    if side == "kvtier":
        # Room for everything at the default 0.9 target usage: vLLM's fs tier never evicts, so neither does this.
        cap_gb = total_bytes / 0.85 / 1e9 + 0.01
        return [kvtier_tier_config(disk_dir=str(d), disk_capacity_gb=cap_gb, io_workers=threads, snapshot_path="")]
    if side == "fs":
        return [fs_tier_config(str(d), n_read_threads=threads, n_write_threads=threads)]
    return [{"type": "example"}]


def open_driver(side: str, d: Path, a, engine_id: str | None = None, total: int | None = None):
    from kvconnector.vllm.driver import ManagerDriver

    nbytes = a.chunk_mib << 20
    total = total or a.n * nbytes
    return ManagerDriver(
        tier_configs(side, d, total, a.threads),
        nbytes,
        (a.inflight + 1) * a.batch * nbytes,  # room for the requests in flight, and one more
        model="bench",
        engine_id=engine_id,
    )


def bench_side(side: str, d: Path, a, keys: list, data: list[bytes]) -> dict:
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    nbytes = a.chunk_mib << 20
    with open_driver(side, d, a) as drv:
        group = a.batch * a.inflight  # --inflight requests, stored (and later loaded) in the same steps
        c0, t0 = cpu_s(), time.perf_counter_ns()
        for g in range(0, len(keys), group):
            for i in range(g, min(g + group, len(keys)), a.batch):
                assert drv.store(keys[i : i + a.batch], data[i : i + a.batch], settle=False) == len(
                    keys[i : i + a.batch]
                )
            drv.settle()
        store_ns, store_cpu = time.perf_counter_ns() - t0, cpu_s() - c0
        drv.drop_primary()
        dropped = drop_caches() if a.drop_caches else False
        bad = check_ns = check_cpu = 0
        c0, t0 = cpu_s(), time.perf_counter_ns()
        for g in range(0, len(keys), group):
            got = drv.load_many([keys[i : i + a.batch] for i in range(g, min(g + group, len(keys)), a.batch)])
            if side != "baseline":  # the comparison's own time is taken out of the load's
                c1, t1 = cpu_s(), time.perf_counter_ns()
                bad += sum(got[k] != data[g + j] for j, k in enumerate(keys[g : g + group]))
                check_ns, check_cpu = check_ns + time.perf_counter_ns() - t1, check_cpu + cpu_s() - c1
        load_ns, load_cpu = time.perf_counter_ns() - t0 - check_ns, cpu_s() - c0 - check_cpu
    gb = len(keys) * nbytes / 1e9
    return {
        "store_gbps": gb / (store_ns / 1e9),
        "load_gbps": gb / (load_ns / 1e9),
        "store_cpu_s": store_cpu,
        "load_cpu_s": load_cpu,
        "gb": gb,
        "bad_chunks": bad,
        "caches_dropped": dropped,
    }


# ---- durability ----------------------------------------------------------------------------------------------------
def writer(side: str, d: Path, a, engine_id: str, ack_path: Path, salt: int) -> None:
    """The child: store batches until killed (at most KILL_BATCHES, then wait); log each batch vLLM saw stored (its
    store jobs all succeeded)."""
    from kvconnector.vllm.driver import chunk_key

    nbytes = a.chunk_mib << 20
    failures = "vllm:kv_offload_tiering_cascade_job_failures"
    n = KILL_BATCHES * a.batch
    keys = [chunk_key(j, b"kill%d" % salt) for j in range(n)]
    data = [payload(j, nbytes, salt) for j in range(n)]  # made first: the kill is to land in a store, not in this
    with open_driver(side, d, a, engine_id, n * nbytes) as drv, open(ack_path, "a") as log:
        for i in range(0, n, a.batch):
            idx = list(range(i, i + a.batch))
            drv.store(keys[i : i + a.batch], data[i : i + a.batch])
            if not drv.stats().get("data", {}).get(failures):
                log.write("".join(f"{j}\n" for j in idx))
                log.flush()
                os.fsync(log.fileno())
        while True:
            time.sleep(1)


def entry_files(side: str, d: Path) -> dict[Path, str]:
    """Each entry file and the block hash (hex) of the chunk it holds."""
    if side == "kvtier":
        from kvconnector.entry_format import ENTRY_NAME
        from kvconnector.timed_io import read_header

        # kvtier's key is "<namespace>/<offload key hex>"; the offload key is the block hash and 4 bytes of group.
        return {p: read_header(str(p)).key.rsplit("/", 1)[1][:-8] for p in d.iterdir() if ENTRY_NAME.fullmatch(p.name)}
    return {p: p.stem for p in d.rglob("*.bin") if p.is_file()}  # vLLM's FileMapper: <block hash hex>.bin


def temp_files(side: str, d: Path) -> int:
    if side == "kvtier":
        from kvconnector.entry_format import TEMP_NAME

        return sum(1 for p in d.iterdir() if TEMP_NAME.fullmatch(p.name))
    return sum(1 for p in d.rglob("*.tmp") if p.is_file())


def flip_a_byte(side: str, path: Path, rng: random.Random) -> None:
    """One payload byte inverted (kvtier's file starts with its 4 KiB header; vLLM's fs file is all payload)."""
    from kvconnector.entry_format import PAGE

    start = PAGE if side == "kvtier" else 0
    with open(path, "r+b") as fh:
        off = rng.randrange(start, fh.seek(0, os.SEEK_END))
        fh.seek(off)
        b = fh.read(1)
        fh.seek(off)
        fh.write(bytes([b[0] ^ 0xFF]))


def kill_loop(side: str, base: Path, a, seed: int) -> dict:
    from vllm.v1.kv_offload.base import get_offload_block_hash

    from kvconnector.vllm.driver import chunk_key, primary_region_path

    rng = random.Random(seed)
    nbytes = a.chunk_mib << 20
    out = {"kills": 0, "acked": 0, "lost": 0, "flipped": 0, "flipped_dropped": 0, "served_corrupt": 0, "temp_left": 0}
    for k in range(a.kills):
        d = base / f"kill-{side}-{k}"  # a fresh directory per kill, so every chunk fits (no eviction in either tier)
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        salt = seed * 1000 + k
        ack_path = base / f"acks-{side}-{k}"
        ack_path.unlink(missing_ok=True)
        engine_id = f"bench-kill-{uuid.uuid4().hex[:12]}"
        want = rng.randint(2, KILL_BATCHES - 3)
        pid = os.fork()
        if pid == 0:  # the writer; never returns
            code = 0
            try:
                logging.disable(logging.CRITICAL)
                writer(side, d, a, engine_id, ack_path, salt)
            except BaseException:
                code = 3
            os._exit(code)
        # Wait for `want` acknowledged batches, timing the last one, then kill at a random point of a batch's length:
        # in the middle of the next store (its writes, fsyncs, renames, or vLLM's bookkeeping around them).
        deadline = time.monotonic() + 120
        seen, t_prev, batch_s = 0, None, 0.02
        while seen < want:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the {side} writer acknowledged {seen} of {want} batches in 120 s")
            if os.waitpid(pid, os.WNOHANG)[0]:
                raise RuntimeError(f"the {side} writer died before it was killed")
            now_seen = ack_path.read_text().count("\n") // a.batch if ack_path.exists() else 0
            if now_seen > seen:
                now = time.monotonic()
                batch_s = (now - t_prev) / (now_seen - seen) if t_prev is not None else batch_s
                seen, t_prev = now_seen, now
            time.sleep(0.0005)
        time.sleep(rng.uniform(0, batch_s))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        Path(primary_region_path(engine_id)).unlink(missing_ok=True)
        out["kills"] += 1
        acked = [int(x) for x in ack_path.read_text().split()]
        keys = [chunk_key(j, b"kill%d" % salt) for j in acked]
        acked_hashes = {get_offload_block_hash(key).hex() for key in keys}
        files = {p: h for p, h in entry_files(side, d).items() if h in acked_hashes}
        flipped = set()
        for p in rng.sample(sorted(files), min(a.corrupt, len(files))):  # only acknowledged chunks' files
            flip_a_byte(side, p, rng)
            flipped.add(files[p])
        out["flipped"] += len(flipped)
        with open_driver(side, d, a, total=KILL_BATCHES * a.batch * nbytes) as drv:  # the restart: same directory
            for i in range(0, len(keys), a.batch):
                got = drv.load(keys[i : i + a.batch])
                for j, key in zip(acked[i : i + a.batch], keys[i : i + a.batch]):
                    was_flipped = get_offload_block_hash(key).hex() in flipped
                    if got[key] is None:
                        out["flipped_dropped" if was_flipped else "lost"] += 1
                    elif got[key] != payload(j, nbytes, salt):
                        out["served_corrupt"] += 1
        out["acked"] += len(acked)
        out["temp_left"] += temp_files(side, d)
    return out


# ---- report ------------------------------------------------------------------------------------------------------
def summarize(rounds: dict[str, list[dict]], kills: dict[str, dict]) -> dict:
    med = {s: {k: statistics.median(r[k] for r in rs) for k in ("store_gbps", "load_gbps")} for s, rs in rounds.items()}
    base = rounds.get("baseline")
    for s, rs in rounds.items():
        gb = rs[0]["gb"]
        for way in ("store", "load"):
            cpu = [r[f"{way}_cpu_s"] for r in rs]
            ref = [r[f"{way}_cpu_s"] for r in base] if base and s != "baseline" else [0.0] * len(cpu)
            med[s][f"{way}_cpu_s_per_gb"] = statistics.median((c - b) / gb for c, b in zip(cpu, ref))
        med[s]["bad_chunks"] = sum(r["bad_chunks"] for r in rs)
        med[s].update(kills.get(s, {}))
    if "kvtier" in med and "fs" in med:
        med["ratio"] = {
            k: med["kvtier"][k] / med["fs"][k] if med["fs"][k] else float("nan")
            for k in ("store_gbps", "load_gbps", "store_cpu_s_per_gb", "load_cpu_s_per_gb")
        }
        # The same bandwidth ratio round by round (the two sides ran back to back): robust to the disk's drift.
        med["round_ratio"] = {
            k: [kv[k] / fs[k] for kv, fs in zip(rounds["kvtier"], rounds["fs"]) if fs[k]]
            for k in ("store_gbps", "load_gbps")
        }
    return med


def print_table(med: dict, a) -> None:
    from rich.table import Table

    from replay.outputs.terminal import console

    t = Table(
        title=f"kvtier vs vLLM fs tier behind vLLM's TieringOffloadingManager: {a.n} x {a.chunk_mib} MiB chunks, "
        f"batch {a.batch}, {a.inflight} in flight, {a.threads} threads, medians of {a.rounds}",
    )
    for col in ("side", "store GB/s", "load GB/s", "store CPU-s/GB", "load CPU-s/GB", "fsync before ack"):
        t.add_column(col, justify="left" if col in ("side", "fsync before ack") else "right")
    if a.kills:
        for col in ("kills", "acked", "lost", "flipped: dropped / served", "temp left"):
            t.add_column(col, justify="right")
    names = {"kvtier": "kvtier (KvtierTier)", "fs": "vLLM fs", "baseline": "baseline (example tier, no I/O)"}
    for s in SIDES:
        if s not in med:
            continue
        m = med[s]
        cpu_note = "" if s != "baseline" else " (all)"
        row = [
            names[s],
            f"{m['store_gbps']:.2f}",
            f"{m['load_gbps']:.2f}",
            f"{m['store_cpu_s_per_gb']:.3f}{cpu_note}",
            f"{m['load_cpu_s_per_gb']:.3f}{cpu_note}",
            DURABLE[s],
        ]
        if a.kills:
            row += (
                [str(m["kills"]), str(m["acked"]), str(m["lost"]), f"{m['flipped_dropped']} / {m['served_corrupt']}"]
                + [str(m["temp_left"])]
                if "kills" in m
                else ["-"] * 5
            )
        t.add_row(*row)
    if "ratio" in med:
        r, rr = med["ratio"], med["round_ratio"]
        row = ["kvtier / fs", *(f"{r[k]:.2f}x" for k in r), ""] + ([""] * 5 if a.kills else [])
        t.add_row(*row, style="bold")
        per_round = [f"{statistics.median(rr[k]):.2f}x ({min(rr[k]):.2f}-{max(rr[k]):.2f})" for k in rr]
        t.add_row("kvtier / fs, per round: median (range)", *per_round, "", "", "", *([""] * 5 if a.kills else []))
    console(min_width=200).print(t)
    print("CPU-s/GB: the process's CPU per GB moved, less the baseline's (same calls, same copies, no tier I/O).")


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0].split("\t", 1)[1],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--dir", default="/var/tmp/kvtier-vllm-tier-vs-fs", help="work directory (wiped per side)")
    ap.add_argument("--chunk-mib", type=int, default=2, help="bytes per chunk (2 MiB: 16 tokens of llama3.1-8b fp16)")
    ap.add_argument("--total-gb", type=float, default=1.0, help="data stored and loaded per side and round")
    ap.add_argument("--batch", type=int, default=16, help="chunks per request")
    ap.add_argument("--threads", type=int, default=8, help="I/O threads per direction, both tiers")
    ap.add_argument(
        "--inflight", type=int, default=1, help="requests whose stores (and loads) run in the same steps [1]"
    )
    ap.add_argument("--rounds", type=int, default=3, help="repeat every side, alternating the order; medians")
    ap.add_argument("--kills", type=int, default=5, help="SIGKILLed writers per side (0: no durability part)")
    ap.add_argument("--corrupt", type=int, default=4, help="entry files given a flipped byte before each restart")
    ap.add_argument("--no-drop-caches", dest="drop_caches", action="store_false", help="warm loads (no root needed)")
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args()
    for name in ("chunk_mib", "batch", "threads", "rounds", "inflight"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if a.total_gb <= 0 or a.kills < 0 or a.corrupt < 0:
        ap.error("--total-gb must be > 0, --kills and --corrupt >= 0")
    if a.drop_caches and os.geteuid() != 0:
        print(
            "vllm_tier_vs_fs: cold loads need root (drop_caches); run as root or pass --no-drop-caches", file=sys.stderr
        )
        return 2
    try:
        import vllm.v1.kv_offload.tiering.spec  # noqa: F401
    except ImportError as exc:
        print(f"vllm_tier_vs_fs: vLLM with tiered offloading is not importable ({exc})", file=sys.stderr)
        return 2
    from vllm.logger import init_logger

    init_logger("vllm").setLevel(logging.WARNING)  # the out-of-tree tier's banner, once per manager
    from kvconnector.vllm.driver import chunk_key

    nbytes = a.chunk_mib << 20
    a.n = max(a.batch, int(a.total_gb * 1e9 // nbytes))
    base = Path(a.dir)
    base.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()
    keys = [chunk_key(i, b"bench") for i in range(a.n)]
    data = [payload(i, nbytes) for i in range(a.n)]
    rounds: dict[str, list[dict]] = {s: [] for s in SIDES}
    for rnd in range(a.rounds):
        for side in SIDES if rnd % 2 == 0 else SIDES[::-1]:
            r = bench_side(side, base / side, a, keys, data)
            rounds[side].append(r)
            print(
                f"round {rnd + 1}/{a.rounds} {side}: store {r['store_gbps']:.2f} GB/s, load {r['load_gbps']:.2f} GB/s, "
                f"bad {r['bad_chunks']}",
                file=sys.stderr,
                flush=True,
            )
    kills = {s: kill_loop(s, base, a, seed=i) for i, s in enumerate(("kvtier", "fs"))} if a.kills else {}
    load1 = os.getloadavg()
    med = summarize(rounds, kills)
    print_table(med, a)
    print(f"load average before {load0[0]:.1f}, after {load1[0]:.1f} ({os.cpu_count()} cores); dir {base}")
    doc = {
        "args": {k: v for k, v in vars(a).items()},
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "loadavg_before": load0,
        "loadavg_after": load1,
        "rounds": rounds,
        "durability": kills,
        "summary": med,
    }
    if a.json:
        write_run_json(a.json, doc, indent=1)
    wrong = sum(med[s]["bad_chunks"] for s in ("kvtier", "fs"))
    if wrong:
        print(f"vllm_tier_vs_fs: {wrong} chunks missing or different after a load", file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
