"""Cross-check of throttlefs against the kernel's own throttle: the blkio cgroup (v1) on a loop device.

The JGU Mainz storage-tiering case study ("Wo der KV-Cache liegt", 2026) checked its FUSE shim's orderings against
dm-delay; this kernel has no device-mapper, and the blkio cgroup throttle (`blkio.throttle.{read,write}_bps_device`) on
a loop device is its kernel-level stand-in (kvtier's own finding on its development VM: /dev/mapper/control absent; the
loop device's throttle caps accurately). The same fio workload runs capped at the same bandwidth both ways: fio inside a
cgroup whose limit applies to the loop device under an ext4, and fio through a throttlefs mount whose backing directory
is on that same ext4 (its I/O is not in the cgroup). Only the throttle differs.

Orderings: for each workload, the points over the bandwidth grid are ranked by throughput both ways; a pair of points
counts as concordant or discordant only where both throttles separate them by more than `TIE_REL` (closer than that
is a tie: noise, not an ordering). The orderings agree when no pair is discordant. Kendall's tau over all points too.
Needs root, losetup, mkfs.ext4 and a cgroup v1 blkio hierarchy.
"""

from __future__ import annotations

import itertools
import os
import subprocess
from collections.abc import Callable

from .fio_probe import FioResult, run_fio
from .runner import Mount

CGROUP_ROOT = "/sys/fs/cgroup/blkio"
TIE_REL = 0.05
# (name, rw, bs, iodepth): KV-cache chunk sizes (128 KiB-1 MiB) read and written as the disk tier does, at QD1 and
# with a few in flight.
XCHECK = (
    ("seq-read-1M-qd1", "read", "1M", 1),
    ("seq-read-1M-qd4", "read", "1M", 4),
    ("rand-read-128K-qd8", "randread", "128k", 8),
    ("seq-write-1M-qd4", "write", "1M", 4),
)


def missing() -> str | None:
    """What this machine lacks for the cross-check, or None."""
    if os.geteuid() != 0:
        return "needs root (losetup, mount, cgroups)"
    if not os.path.isfile(os.path.join(CGROUP_ROOT, "blkio.throttle.read_bps_device")):
        return f"no cgroup v1 blkio throttle at {CGROUP_ROOT}"
    return None


class LoopExt4:
    """An ext4 image on a loop device (direct I/O to its file), mounted; a blkio cgroup to throttle it."""

    def __init__(self, workdir: str, size_gib: int = 2) -> None:
        self.img = os.path.join(workdir, "xcheck.img")
        self.mnt = os.path.join(workdir, "xcheck-ext4")
        self.cg = os.path.join(CGROUP_ROOT, f"kvtier-throttlefs-{os.getpid()}")
        self.loop = ""
        try:
            subprocess.run(["truncate", "-s", f"{size_gib}G", self.img], check=True)
            subprocess.run(["mkfs.ext4", "-q", "-F", self.img], check=True)
            self.loop = subprocess.run(
                ["losetup", "--direct-io=on", "-f", "--show", self.img], check=True, capture_output=True, text=True
            ).stdout.strip()
            os.makedirs(self.mnt, exist_ok=True)
            subprocess.run(["mount", self.loop, self.mnt], check=True)
            st = os.stat(self.loop)
            self.majmin = f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
            os.mkdir(self.cg)
        except BaseException:
            self.close()
            raise

    def limit(self, direction: str, bytes_s: float) -> None:
        for d in ("read", "write"):
            with open(os.path.join(self.cg, f"blkio.throttle.{d}_bps_device"), "w") as f:
                f.write(f"{self.majmin} {int(bytes_s) if d == direction else 0}\n")

    def prefix(self) -> tuple[str, ...]:
        # fio joins the cgroup before it starts: every bio it submits to the loop device is throttled there.
        return ("sh", "-c", f'echo $$ > {self.cg}/cgroup.procs && exec "$@"', "sh")

    def close(self) -> None:
        subprocess.run(["umount", self.mnt], check=False, capture_output=True)
        if self.loop:
            subprocess.run(["losetup", "-d", self.loop], check=False, capture_output=True)
        if os.path.isdir(self.cg):
            os.rmdir(self.cg)
        if os.path.exists(self.img):
            os.unlink(self.img)
        if os.path.isdir(self.mnt) and not os.path.ismount(self.mnt):
            os.rmdir(self.mnt)


def pair_counts(a: list[float], b: list[float], tie_rel: float = TIE_REL) -> dict[str, int]:
    """Concordant, discordant and tied pairs between two measurements of the same points."""
    out = {"concordant": 0, "discordant": 0, "tied": 0}
    for i, j in itertools.combinations(range(len(a)), 2):
        if abs(a[i] - a[j]) <= tie_rel * max(a[i], a[j]) or abs(b[i] - b[j]) <= tie_rel * max(b[i], b[j]):
            out["tied"] += 1
        elif (a[i] - a[j]) * (b[i] - b[j]) > 0:
            out["concordant"] += 1
        else:
            out["discordant"] += 1
    return out


def kendall_tau(c: dict[str, int]) -> float:
    n = c["concordant"] + c["discordant"] + c["tied"]
    return (c["concordant"] - c["discordant"]) / n if n else 1.0


def cross_check(
    workdir: str,
    bws: list[float],
    rt: float,
    step: Callable[[str, FioResult], None] | None = None,
    workloads: tuple[tuple[str, str, str, int], ...] = XCHECK,
) -> dict:
    """Every workload at every bandwidth, both ways (alternating which goes first); `workdir` must be empty."""
    le = LoopExt4(workdir)
    tmnt = os.path.join(workdir, "xcheck-mnt")
    os.makedirs(tmnt, exist_ok=True)
    back = os.path.join(le.mnt, "backing")
    os.mkdir(back)
    points = []
    try:
        with Mount(tmnt, back) as m:
            for name, *_ in workloads:  # lay each file out once, unthrottled, so neither side pays for it
                run_fio(tmnt, "write", "1M", 0.3, 1, size="256M", filename=f"x-{name}")
            for (k, (name, rw, bs, qd)), bw in itertools.product(enumerate(workloads), bws):
                direction = "write" if "write" in rw else "read"
                got = {}
                ways = ("cgroup", "throttlefs") if (k + len(points)) % 2 == 0 else ("throttlefs", "cgroup")
                for way in ways:
                    if way == "cgroup":
                        le.limit(direction, bw)
                        got[way] = run_fio(back, rw, bs, rt, qd, size="256M", filename=f"x-{name}", prefix=le.prefix())
                    else:
                        m.client.set(bw=0, lat_ms=0, **{f"{direction}_bw": bw})
                        got[way] = run_fio(tmnt, rw, bs, rt, qd, size="256M", filename=f"x-{name}")
                    if step:
                        step(f"x-check {way:<10} {name} at {bw / 1e6:g} MB/s", got[way])
                points.append(
                    {
                        "workload": name,
                        "cap_mb_s": bw / 1e6,
                        "cgroup_mb_s": got["cgroup"].bw_bytes_s / 1e6,
                        "throttlefs_mb_s": got["throttlefs"].bw_bytes_s / 1e6,
                    }
                )
    finally:
        le.close()
        if os.path.isdir(tmnt) and not os.path.ismount(tmnt):
            os.rmdir(tmnt)
    per_workload = {}
    for name, *_ in workloads:
        pts = [p for p in points if p["workload"] == name]
        per_workload[name] = pair_counts([p["cgroup_mb_s"] for p in pts], [p["throttlefs_mb_s"] for p in pts])
    overall = pair_counts([p["cgroup_mb_s"] for p in points], [p["throttlefs_mb_s"] for p in points])
    return {
        "points": points,
        "over_bandwidth": per_workload,
        "orderings_agree": all(c["discordant"] == 0 for c in per_workload.values()),
        "all_points": overall,
        "kendall_tau": kendall_tau(overall),
    }
