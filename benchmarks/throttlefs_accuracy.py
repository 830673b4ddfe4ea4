#!/usr/bin/env python3
"""How closely `kvtier throttlefs` does what it is told, how fast its FUSE path can go, and a kernel cross-check.

Three parts, all with real fio, in one run:
  ceiling      fio through an unthrottled mount vs fio on the backing directory itself (alternating), with the
               backing on the disk (--dir) and on tmpfs (the FUSE path alone): the highest bandwidth and lowest
               latency throttlefs can emulate on this machine. Caps above it cannot be emulated.
  accuracy     sequential 1 MiB reads and writes at QD 4 under each --caps value (measured / cap); QD1 4 KiB random
               reads with each --lat-ms value, base and throttled runs alternating, 3 pairs (median rise vs L); a cap
               and a latency together (QD1: n / (n / cap + L + up to the path's own time); QD 8: the cap).
               Backing on tmpfs by default, so the throttle is judged, not the shared disk's 2x swings
               (--accuracy-backing disk).
  cross-check  the same fio workloads capped at the same bandwidths two ways: by throttlefs, and by the kernel's
               blkio cgroup throttle (cgroup v1 blkio.throttle.{read,write}_bps_device) on a loop device holding
               an ext4 (--direct-io=on). throttlefs's backing directory is on that same ext4, so only the throttle
               differs. Reported: both throughputs per point and whether the orderings agree (over bandwidths per
               workload, over workloads per bandwidth, Kendall's tau over all points). The JGU Mainz storage-tiering
               case study ("Wo der KV-Cache liegt", 2026) checked its FUSE shim against dm-delay: this kernel has no
               device-mapper, the blkio throttle is its kernel-level stand-in.

Needs root (FUSE, losetup, cgroups), fio, fuse3 and mfusepy; without a blkio cgroup the cross-check is skipped and
says so. The disk is shared and swings up to 2x: each figure is a ratio within this run, and the load average is
printed with it.

examples:
  python benchmarks/throttlefs_accuracy.py --dir /var/tmp/kvtier-throttlefs-bench --json tfs.json --plots plots/
  python benchmarks/throttlefs_accuracy.py --dir /var/tmp/tfs --caps 25MB/s,100MB/s --lat-ms 1,2 --skip cross-check
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import statistics
import sys
import tempfile
import time

from deploy.throttle.cli import check_fuse
from deploy.throttle.fio_probe import FioResult, run_fio
from deploy.throttle.runner import Mount
from deploy.throttle.settings import SettingError, human_rate, parse_rate
from deploy.throttle.xcheck import TIE_REL, XCHECK, cross_check
from deploy.throttle.xcheck import missing as xcheck_missing
from replay.common.cli import stop_signals_raise
from replay.outputs.provenance import write_run_json

PROG = "throttlefs_accuracy"
REPEATS = 3  # base/throttled pairs per latency; the median rise is reported


class Progress:
    def __init__(self, total: int) -> None:
        self.done, self.total, self.t0 = 0, total, time.monotonic()

    def step(self, what: str, r: FioResult | None = None) -> None:
        self.done += 1
        fig = f"{r.bw_bytes_s / 1e6:8.1f} MB/s {r.mean_lat_ms:7.3f} ms" if r else ""
        print(f"[{self.done:>3}/{self.total}] {time.monotonic() - self.t0:6.0f} s  {what:<52}{fig}", flush=True)


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def ceiling(mnt: str, back: str, m: Mount, rt: float, prog: Progress, backing_kind: str) -> list[dict]:
    m.client.set(bw=0, lat_ms=0)
    rows = []
    for name, rw, bs, qd in (
        ("seq read 1M QD1", "read", "1M", 1),
        ("seq read 1M QD4", "read", "1M", 4),
        ("seq write 1M QD1", "write", "1M", 1),
        ("seq write 1M QD4", "write", "1M", 4),
        ("rand read 4K QD1", "randread", "4k", 1),
    ):
        got = {}
        for where in ("backing", "mount") if len(rows) % 2 == 0 else ("mount", "backing"):
            got[where] = run_fio(mnt if where == "mount" else back, rw, bs, rt, qd, size="256M")
            prog.step(f"ceiling ({backing_kind}) {name} on the {where}", got[where])
        rows.append(
            {
                "backing": backing_kind,
                "workload": name,
                "backing_mb_s": got["backing"].bw_bytes_s / 1e6,
                "mount_mb_s": got["mount"].bw_bytes_s / 1e6,
                "bw_ratio": got["mount"].bw_bytes_s / got["backing"].bw_bytes_s,
                "backing_lat_ms": got["backing"].mean_lat_ms,
                "mount_lat_ms": got["mount"].mean_lat_ms,
            }
        )
    return rows


def accuracy(mnt: str, m: Mount, caps: list[float], lats: list[float], rt: float, prog: Progress) -> dict:
    out: dict = {"caps": [], "latency": [], "combined": []}
    for cap, direction in itertools.product(caps, ("read", "write")):
        m.client.set(bw=0, lat_ms=0, **{f"{direction}_bw": cap})
        r = run_fio(mnt, direction, "1M", rt, 4, size="256M")
        prog.step(f"cap {direction} {human_rate(cap)} QD4", r)
        out["caps"].append({"direction": direction, "cap_mb_s": cap / 1e6, "measured_mb_s": r.bw_bytes_s / 1e6})
    for lat in lats:
        pairs = []
        for _ in range(REPEATS):
            m.client.set(bw=0, lat_ms=0)
            base = run_fio(mnt, "randread", "4k", rt, size="256M")
            prog.step("QD1 4K random read, no added latency", base)
            m.client.set(read_lat_ms=lat)
            slow = run_fio(mnt, "randread", "4k", rt, size="256M")
            prog.step(f"QD1 4K random read, read +{lat:g} ms", slow)
            pairs.append((base.mean_lat_ms, slow.mean_lat_ms))
        out["latency"].append(
            {
                "lat_ms": lat,
                "base_ms": statistics.median(b for b, _ in pairs),
                "rise_ms": statistics.median(s - b for b, s in pairs),
                "rises_ms": [s - b for b, s in pairs],
                "allowed_ms": 0.1 * lat + 0.2,
            }
        )
    cap, lat, bs = 50e6, 10.0, 512 * 1024
    m.client.set(bw=0, lat_ms=0)
    base = run_fio(mnt, "read", "512k", rt, size="256M")
    prog.step("read 512K QD1, unthrottled (the path's own time)", base)
    m.client.set(bw=0, lat_ms=0, read_bw=cap, read_lat_ms=lat)
    for qd in (1, 8):
        r = run_fio(mnt, "read", "512k", rt, qd, size="256M")
        prog.step(f"read {human_rate(cap)} + {lat:g} ms, 512K QD{qd}", r)
        # QD1: n / cap + L, plus up to the path's own time per op (its backing I/O overlaps the pipe time, its FUSE
        # round trip does not): a band. QD 8: latencies overlap and the cap binds.
        lo = bs / (base.mean_lat_ms / 1e3 + bs / cap + lat / 1e3) if qd == 1 else cap
        hi = bs / (bs / cap + lat / 1e3) if qd == 1 else cap
        out["combined"].append(
            {
                "qd": qd,
                "cap_mb_s": cap / 1e6,
                "lat_ms": lat,
                "path_ms": base.mean_lat_ms,
                "expected_low_mb_s": lo / 1e6,
                "expected_high_mb_s": hi / 1e6,
                "measured_mb_s": r.bw_bytes_s / 1e6,
            }
        )
    m.client.set(bw=0, lat_ms=0)
    return out


def plot(doc: dict, directory: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(directory, exist_ok=True)
    paths = []
    acc = doc.get("accuracy")
    if acc:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
        for direction, marker in (("read", "o"), ("write", "s")):
            rows = [r for r in acc["caps"] if r["direction"] == direction]
            a1.plot(
                [r["cap_mb_s"] for r in rows], [r["measured_mb_s"] for r in rows], marker, label=f"{direction}, QD4"
            )
        top = max(r["cap_mb_s"] for r in acc["caps"]) * 1.15
        a1.plot([0, top], [0, top], "k-", lw=0.8, label="= cap")
        a1.fill_between([0, top], [0, top * 0.9], [0, top * 1.1], color="0.85", label="cap +-10%")
        a1.set(xlabel="cap (MB/s)", ylabel="fio through the mount (MB/s)", title="bandwidth caps, 1 MiB sequential")
        a1.legend()
        lat = acc["latency"]
        xs = [r["lat_ms"] for r in lat]
        a2.plot(xs, [r["rise_ms"] for r in lat], "o", label="measured rise of mean latency")
        a2.plot([0, max(xs) * 1.1], [0, max(xs) * 1.1], "k-", lw=0.8, label="= L")
        a2.fill_between(
            [0, max(xs) * 1.1],
            [-0.2, max(xs) * 1.1 * 0.9 - 0.2],
            [0.2, max(xs) * 1.1 * 1.1 + 0.2],
            color="0.85",
            label="L +-(10% + 0.2 ms)",
        )
        a2.set(xlabel="added latency L (ms)", ylabel="rise (ms)", title="QD1 4 KiB random reads")
        a2.legend()
        fig.suptitle(f"throttlefs accuracy ({doc['date']}, load {doc['load_start']})", fontsize=9)
        fig.tight_layout()
        paths.append(os.path.join(directory, "throttlefs_accuracy.png"))
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    xc = doc.get("cross_check")
    if xc and xc.get("points"):
        fig, ax = plt.subplots(figsize=(6.2, 5))
        for (name, *_), marker in zip(XCHECK, "os^Dv"):
            pts = [p for p in xc["points"] if p["workload"] == name]
            ax.plot([p["cgroup_mb_s"] for p in pts], [p["throttlefs_mb_s"] for p in pts], marker, label=name)
        top = max(max(p["cgroup_mb_s"], p["throttlefs_mb_s"]) for p in xc["points"]) * 1.1
        ax.plot([0, top], [0, top], "k-", lw=0.8)
        ax.set(
            xlabel="blkio cgroup throttle on a loop device (MB/s)",
            ylabel="throttlefs (MB/s)",
            title=f"same workload, same cap, two throttles\norderings over bandwidth agree: "
            f"{'yes' if xc['orderings_agree'] else 'NO'}; Kendall tau {xc['kendall_tau']:.2f}",
        )
        ax.legend(fontsize=8)
        fig.text(0.01, 0.005, f"{doc['date']}, load {doc['load_start']}", fontsize=7, color="0.4")
        fig.tight_layout(rect=(0, 0.02, 1, 1))
        paths.append(os.path.join(directory, "throttlefs_vs_cgroup.png"))
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths


def print_tables(doc: dict) -> None:
    if doc.get("ceiling"):
        print("\nceiling: fio through an unthrottled mount vs on the backing directory (same run, alternating)")
        print(
            f"{'backing':<8}{'workload':<20}{'backing MB/s':>14}{'mount MB/s':>12}{'ratio':>7}{'backing ms':>12}"
            f"{'mount ms':>10}"
        )
        for r in doc["ceiling"]:
            print(
                f"{r['backing']:<8}{r['workload']:<20}{r['backing_mb_s']:>14.1f}{r['mount_mb_s']:>12.1f}{r['bw_ratio']:>7.2f}"
                f"{r['backing_lat_ms']:>12.3f}{r['mount_lat_ms']:>10.3f}"
            )
    acc = doc.get("accuracy")
    if acc:
        print(f"\ncaps (1 MiB sequential, QD4; backing on {acc['backing']})")
        for r in acc["caps"]:
            print(
                f"  {r['direction']:<6} cap {r['cap_mb_s']:7.1f} MB/s  measured {r['measured_mb_s']:7.1f}  "
                f"({r['measured_mb_s'] / r['cap_mb_s']:.3f}x)"
            )
        print("added latency (QD1 4 KiB random reads, mean; base and throttled alternating)")
        for r in acc["latency"]:
            ok = abs(r["rise_ms"] - r["lat_ms"]) <= r["allowed_ms"]
            print(
                f"  L {r['lat_ms']:5.2f} ms  base {r['base_ms']:.3f} ms  rise {r['rise_ms']:.3f} ms  "
                f"{'within' if ok else 'OUTSIDE'} +-{r['allowed_ms']:.2f} ms"
            )
        print("cap + latency together (512 KiB sequential reads)")
        for r in acc["combined"]:
            lo, hi = r["expected_low_mb_s"], r["expected_high_mb_s"]
            inside = 0.9 * lo <= r["measured_mb_s"] <= 1.1 * hi
            print(
                f"  QD{r['qd']} (path's own {r['path_ms']:.2f} ms/op): expected {lo:.1f}-{hi:.1f} MB/s, "
                f"measured {r['measured_mb_s']:.1f} ({'within' if inside else 'OUTSIDE'} 10%)"
            )
    xc = doc.get("cross_check")
    if xc and xc.get("points"):
        print("\ncross-check: same workload and cap, blkio cgroup throttle (loop device) vs throttlefs")
        print(f"{'workload':<20}{'cap MB/s':>9}{'cgroup':>9}{'throttlefs':>11}{'cg/cap':>8}{'tfs/cap':>8}")
        for p in xc["points"]:
            print(
                f"{p['workload']:<20}{p['cap_mb_s']:>9.0f}{p['cgroup_mb_s']:>9.1f}{p['throttlefs_mb_s']:>11.1f}"
                f"{p['cgroup_mb_s'] / p['cap_mb_s']:>8.2f}{p['throttlefs_mb_s'] / p['cap_mb_s']:>8.2f}"
            )
        for name, c in xc["over_bandwidth"].items():
            print(
                f"  order over bandwidths, {name}: {c['concordant']} pairs agree, {c['discordant']} disagree, "
                f"{c['tied']} within {TIE_REL:.0%} (ties)"
            )
        c = xc["all_points"]
        print(
            f"orderings agree: {'yes' if xc['orderings_agree'] else 'NO'}; all points: Kendall tau "
            f"{xc['kendall_tau']:.2f} ({c['concordant']} agree, {c['discordant']} disagree, {c['tied']} ties)"
        )
    elif xc:
        print(f"\ncross-check skipped: {xc['skipped']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True, help="work directory on the disk to measure (created; removed after)")
    ap.add_argument("--caps", default="25MB/s,50MB/s,100MB/s", help="bandwidth caps to check (comma-separated)")
    ap.add_argument("--lat-ms", default="0.5,1,2,5", help="added latencies to check (comma-separated ms)")
    ap.add_argument("--xcheck-bw", default="100MB/s,50MB/s,25MB/s", help="caps for the cgroup cross-check")
    ap.add_argument("--runtime-s", type=float, default=2.5, help="seconds per fio run (default 2.5)")
    ap.add_argument(
        "--accuracy-backing",
        choices=["tmpfs", "disk"],
        default="tmpfs",
        help="backing of the accuracy runs (default tmpfs: the throttle judged, not the shared disk's swings)",
    )
    ap.add_argument("--skip", action="append", default=[], choices=["ceiling", "accuracy", "cross-check"])
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--plots", help="write PNGs into this directory")
    a = ap.parse_args(argv)
    try:
        caps = [parse_rate(x) for x in a.caps.split(",")]
        xbw = [parse_rate(x) for x in a.xcheck_bw.split(",")]
        lats = [float(x) for x in a.lat_ms.split(",")]
    except (SettingError, ValueError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    missing = check_fuse() or (None if shutil.which("fio") else "fio not installed")
    if missing:
        print(f"{PROG}: {missing}", file=sys.stderr)
        return 2
    if os.path.exists(a.dir) and os.listdir(a.dir):
        print(
            f"{PROG}: --dir {a.dir} is not empty (it is removed afterwards: give a new or empty one)", file=sys.stderr
        )
        return 2
    os.makedirs(a.dir, exist_ok=True)
    doc: dict = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_start": load(), "argv": sys.argv}
    xskip = None
    if "cross-check" in a.skip:
        xskip = "--skip cross-check"
    else:
        xskip = xcheck_missing()
    n = (0 if "ceiling" in a.skip else 20) + (
        0 if "accuracy" in a.skip else 2 * len(caps) + 2 * REPEATS * len(lats) + 3
    )
    n += 0 if xskip else 2 * len(XCHECK) * len(xbw)
    prog = Progress(n)
    print(f"{PROG}: {n} fio runs of {a.runtime_s:g} s; load average {doc['load_start']}", flush=True)
    shm = tempfile.mkdtemp(dir="/dev/shm", prefix="kvtier-throttlefs-") if os.path.isdir("/dev/shm") else None
    try:
        for kind, backing_root in (("disk", a.dir), ("tmpfs", shm)):
            if backing_root is None:
                continue
            mnt = tempfile.mkdtemp(dir=a.dir, prefix=f"mnt-{kind}-")
            back = tempfile.mkdtemp(dir=backing_root, prefix="back-")
            with Mount(mnt, back) as m:
                if "ceiling" not in a.skip:
                    doc.setdefault("ceiling", []).extend(ceiling(mnt, back, m, a.runtime_s, prog, kind))
                if "accuracy" not in a.skip and kind == a.accuracy_backing:
                    doc["accuracy"] = accuracy(mnt, m, caps, lats, a.runtime_s, prog)
                    doc["accuracy"]["backing"] = kind
            shutil.rmtree(back, ignore_errors=True)
        doc["cross_check"] = (
            {"skipped": xskip}
            if xskip
            else cross_check(tempfile.mkdtemp(dir=a.dir, prefix="xcheck-"), xbw, a.runtime_s, prog.step)
        )
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; figures so far follow", file=sys.stderr)
        doc["interrupted"] = True
    finally:
        if shm:
            shutil.rmtree(shm, ignore_errors=True)
        # Never recurse into a mount that is somehow still up: that would delete through it.
        if not any(os.path.ismount(os.path.join(r, d)) for r, ds, _ in os.walk(a.dir) for d in ds):
            shutil.rmtree(a.dir, ignore_errors=True)
        else:
            print(f"{PROG}: a mount under {a.dir} is still up; left {a.dir} in place", file=sys.stderr)
    doc["load_end"] = load()
    if a.json:  # first: the figures are kept even if a table or plot below fails
        write_run_json(a.json, doc, argv=argv, indent=1)
        print(f"wrote {a.json}")
    print_tables(doc)
    print(f"load average: start {doc['load_start']}, end {doc['load_end']} (2 vCPUs)")
    if a.plots:
        for p in plot(doc, a.plots):
            print(f"wrote {p}")
    return 130 if doc.get("interrupted") else 0


if __name__ == "__main__":
    with stop_signals_raise():  # SIGTERM unwinds like Ctrl-C: mounts stopped, loop device and cgroup removed
        sys.exit(main())
