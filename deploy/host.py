"""The testbed host as benchmarks need it: a cold page cache before a read that must come from the device, and this
process's CPU time (the cost side of a comparison)."""

from __future__ import annotations

import resource
import subprocess

__all__ = ["cpu_s", "drop_caches"]


def drop_caches() -> bool:
    """Write back dirty pages (sync), then drop the clean page cache (`echo 1 > /proc/sys/vm/drop_caches`), so the
    next buffered read goes to the device. False when the kernel refuses (not root): the caller decides if that matters.
    """
    subprocess.run(["sync"], check=False)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as fh:
            fh.write("1\n")
        return True
    except OSError:
        return False


def cpu_s() -> float:
    """User + system CPU seconds of this process so far."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
