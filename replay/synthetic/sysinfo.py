"""What the run ran on: CPU, memory, the filesystem and block device under the cache dir, and that device's own
counters (/proc/diskstats), so anyone can check that the reads kvtier reports really reached the device; and what this
process itself spent and moved (getrusage, /proc/self/io), the CPU cost of the storage work."""

from __future__ import annotations

import os
import platform
import resource
from dataclasses import dataclass

from ..common.object_gateway import gateway_of

SECTOR = 512


def block_device_of(path: str) -> str | None:
    """The whole-disk name (e.g. 'vda', 'nvme0n1') holding `path`, resolving a partition to its disk."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    sys_path = f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    if not os.path.exists(sys_path):
        return None  # tmpfs, overlay and other filesystems with no block device
    real = os.path.realpath(sys_path)
    if os.path.exists(os.path.join(real, "partition")):
        real = os.path.dirname(real)
    return os.path.basename(real)


def filesystem_of(path: str) -> dict:
    """Mount point and type from /proc/mounts: the longest mount point that prefixes the path."""
    path = os.path.realpath(path)
    best = {"mount_point": "/", "fs_type": "unknown", "source": ""}
    try:
        with open("/proc/mounts") as f:
            for line in f:
                src, mnt, fstype = line.split()[:3]
                mnt = mnt.replace("\\040", " ")
                if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best["mount_point"]):
                    best = {"mount_point": mnt, "fs_type": fstype, "source": src}
    except OSError:
        pass
    return best


@dataclass(frozen=True, slots=True)
class DiskCounters:
    reads: int
    read_bytes: int
    writes: int
    written_bytes: int
    busy_ms: int

    def minus(self, start: DiskCounters) -> dict:
        return {
            "reads": self.reads - start.reads,
            "read_bytes": self.read_bytes - start.read_bytes,
            "writes": self.writes - start.writes,
            "written_bytes": self.written_bytes - start.written_bytes,
            "busy_ms": self.busy_ms - start.busy_ms,
        }


def disk_counters(device: str | None) -> DiskCounters | None:
    if not device:
        return None
    try:
        with open("/proc/diskstats") as f:
            for line in f:
                p = line.split()
                if len(p) >= 14 and p[2] == device:
                    return DiskCounters(int(p[3]), int(p[5]) * SECTOR, int(p[7]), int(p[9]) * SECTOR, int(p[12]))
    except OSError:
        pass
    return None


@dataclass(frozen=True, slots=True)
class ProcessCounters:
    """This process's CPU time (all its threads) and the bytes it sent to or fetched from the block layer
    (/proc/self/io: O_DIRECT and io_uring transfers count, page-cache hits do not)."""

    user_s: float
    system_s: float
    read_bytes: int
    written_bytes: int

    def minus(self, start: ProcessCounters) -> dict:
        return process_figures(
            self.user_s - start.user_s,
            self.system_s - start.system_s,
            self.read_bytes - start.read_bytes,
            self.written_bytes - start.written_bytes,
        )


def process_figures(user_s: float, system_s: float, read_bytes: int, written_bytes: int) -> dict:
    """The results' `process` section: CPU, block-layer bytes, and the CPU seconds per GiB those bytes make."""
    moved = read_bytes + written_bytes
    return {
        "cpu_user_s": round(user_s, 3),
        "cpu_system_s": round(system_s, 3),
        "read_bytes": read_bytes,
        "written_bytes": written_bytes,
        "cpu_s_per_gib_moved": round((user_s + system_s) / (moved / 2**30), 4) if moved else None,
    }


def process_counters() -> ProcessCounters:
    r = resource.getrusage(resource.RUSAGE_SELF)
    io = {}
    try:
        with open("/proc/self/io") as f:
            io = {k: int(v) for k, v in (line.split(":") for line in f if ":" in line)}
    except OSError:  # not Linux, or no task I/O accounting: CPU only
        pass
    return ProcessCounters(r.ru_utime, r.ru_stime, io.get("read_bytes", 0), io.get("write_bytes", 0))


def environment(cache_dir: str) -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_total = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem_total = int(line.split()[1]) * 1024
    except OSError:
        pass
    dev = block_device_of(cache_dir)
    env = {
        "hostname": platform.node(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "cpu_model": cpu,
        "cpu_count": os.cpu_count(),
        "memory_bytes": mem_total,
        "cache_dir": cache_dir,
        "filesystem": filesystem_of(cache_dir),
        "object_gateway": gateway_of(cache_dir),
        "block_device": dev,
    }
    if dev:
        for attr in ("queue/scheduler", "queue/rotational", "queue/max_sectors_kb", "queue/logical_block_size"):
            try:
                with open(f"/sys/block/{dev}/{attr}") as f:
                    env[attr.replace("queue/", "")] = f.read().strip()
            except OSError:
                pass
        env["drive"] = drive_info(dev)
    return env


def _read_attr(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip() or None
    except OSError:
        return None


def drive_info(dev: str) -> dict:
    """The drive's identity from sysfs, as a submission documents it: model, firmware, vendor, serial, size.
    NVMe and SCSI/SATA disks expose model and firmware under device/ (NVMe: firmware_rev; SCSI: rev); a virtual
    disk (virtio) has neither, and then says so in `note` instead of guessing."""
    base = f"/sys/block/{dev}"
    sectors = _read_attr(f"{base}/size")
    info = {
        "name": dev,
        "model": _read_attr(f"{base}/device/model"),
        "firmware": _read_attr(f"{base}/device/firmware_rev") or _read_attr(f"{base}/device/rev"),
        "vendor": _read_attr(f"{base}/device/vendor"),
        "serial": _read_attr(f"{base}/device/serial"),
        "transport": os.path.basename(os.path.realpath(f"{base}/device/subsystem"))
        if os.path.exists(f"{base}/device/subsystem")
        else None,
        "size_bytes": int(sectors) * SECTOR if sectors and sectors.isdigit() else None,
    }
    if not info["model"] or not info["firmware"]:
        info["note"] = f"sysfs has no model/firmware for {dev} (transport {info['transport']})"
    return info


def mem_available_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
