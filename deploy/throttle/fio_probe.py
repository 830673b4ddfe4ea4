"""One fio job, run for real, reduced to the figures the throttle is judged by (bandwidth, mean completion latency).

Shared by the accuracy tests and benchmarks/throttlefs_accuracy.py so both measure the same way.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess


@dataclasses.dataclass(frozen=True)
class FioResult:
    rw: str
    bs: str
    iodepth: int
    bw_bytes_s: float
    mean_lat_ms: float  # completion latency (clat): submission to completion of one I/O, as fio reports it
    iops: float
    io_bytes: int


def run_fio(
    directory: str,
    rw: str,
    bs: str,
    runtime_s: float = 3.0,
    iodepth: int = 1,
    size: str = "64M",
    filename: str = "fio-probe",
    direct: bool = True,
    extra: tuple[str, ...] = (),
    prefix: tuple[str, ...] = (),
) -> FioResult:
    """fio on `directory/filename`; `prefix` runs it under another command (e.g. a cgroup placer)."""
    engine = "psync" if iodepth == 1 else "libaio"
    argv = [
        *prefix,
        "fio",
        "--name=probe",
        f"--directory={directory}",
        f"--filename={filename}",
        f"--size={size}",
        f"--rw={rw}",
        f"--bs={bs}",
        f"--ioengine={engine}",
        f"--iodepth={iodepth}",
        f"--direct={int(direct)}",
        f"--runtime={runtime_s}",
        "--time_based",
        # The file is laid out before the timed part; ramp-up excluded so the mean is steady state.
        "--ramp_time=0.3",
        "--output-format=json",
        *extra,
    ]
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    # fio may print notices before the JSON document.
    job = json.loads(out[out.index("{") :])["jobs"][0]
    side = job["read"] if job["read"]["io_bytes"] else job["write"]
    return FioResult(
        rw=rw,
        bs=bs,
        iodepth=iodepth,
        bw_bytes_s=float(side["bw_bytes"]),
        mean_lat_ms=side["clat_ns"]["mean"] / 1e6,
        iops=float(side["iops"]),
        io_bytes=int(side["io_bytes"]),
    )
