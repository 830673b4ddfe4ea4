"""throttlefs: a FUSE passthrough of a directory that caps bandwidth and adds latency per operation, independently.

Why: to vary the storage under a live stack one property at a time (the sensitivity testbed of the JGU Mainz
storage-tiering case study, "Wo der KV-Cache liegt", 2026): the disk tier's directory is mounted through it, and a
sweep changes the caps and latencies while the stack stays up.

Start it (foreground; Ctrl-C / SIGTERM or `fusermount3 -u MOUNTPOINT` end it and print what it did):

    kvtier throttlefs /mnt/kv --backing /var/tmp/kv --read-bw 250MB/s --lat-ms 1 --control-port 9123
    # the same as: python -m deploy.throttle ... with the same flags

It prints one line on stdout once mounted, ending `control http://127.0.0.1:PORT` (any free port unless
--control-port). The model it emulates, per direction: a pipe of the cap's bandwidth shared by all operations in
flight (a token bucket, depth --burst, default 0), then the added latency per operation (overlapping between
concurrent operations), on top of whatever the backing I/O itself took. At QD1 a read of n bytes therefore takes
max(backing time, n / cap) + latency; at any depth the throughput stays under the cap.

Control while mounted (for `kvtier sweep` and people; only 127.0.0.1 is bound):

    GET  /settings  -> {"read_bw_bytes_s": 2.5e8, "write_bw_bytes_s": 0.0, "read_lat_ms": 1.0, "write_lat_ms": 1.0,
                        "fsync_lat_ms": 1.0, "open_lat_ms": 1.0, "jitter_ms": 0.0, "burst_bytes": 0.0}
    PUT  /settings  body: a JSON object with the flag names, any subset, e.g. {"bw": "1GB/s", "lat_ms": 0.5} or
                    {"read_bw": 0, "read_lat_ms": 2}; rates take units ("250MB/s", "1GiB/s", bytes/s as a number,
                    0 = no cap). General keys (bw, lat_ms) apply first, specific ones override them. The whole change
                    applies atomically from the next operation on; a bad one answers 400 {"error": "..."} and changes
                    nothing. Answers the settings now in force.
    GET  /stats     -> {"uptime_s", "settings", "direct_bounces",
                        "ops": {"read"|"write"|"fsync"|"open": {"ops", "bytes", "bw_wait_ns", "lat_ns", "hold_error_ns",
                        "errors"}}}
                    counters are cumulative since the mount: a sweep reads them before and after a point and
                    subtracts (bw_wait_ns: time held for the cap; lat_ns: latency added; hold_error_ns: the timer's
                    error, signed: held longer (+) or shorter (-) than asked; sleeps learn the scheduler's lateness).
    GET  /metrics   the same counters for Prometheus: throttlefs_ops_total{op}, throttlefs_bytes_total{op},
                    throttlefs_bandwidth_wait_seconds_total{op}, throttlefs_added_latency_seconds_total{op},
                    throttlefs_errors_total{op}, throttlefs_hold_error_seconds{op},
                    throttlefs_direct_bounces_total, throttlefs_setting{name}.

From Python (what the tests and the accuracy benchmark use):

    from deploy.throttle import Mount
    with Mount("/mnt/kv", "/var/tmp/kv", ["--bw", "4GB/s"]) as m:   # starts the same command, waits for the mount
        m.client.set(bw="250MB/s", lat_ms=1)                         # deploy.throttle.control.Client
        before = m.client.stats(); ...; after = m.client.stats()
    # leaving the block sends SIGTERM: unmounted, m.returncode == 143, m.stderr holds the summary table

Limits: every file is opened with direct_io, so shared writable mmap of files on the mount is refused (libfuse 3.14
here predates FUSE_DIRECT_IO_ALLOW_MMAP); metadata operations (stat, readdir, rename, unlink) are passed through
untimed. The FUSE path has a ceiling of its own (Python callbacks): benchmarks/throttlefs_accuracy.py measures it,
and caps above it cannot be emulated.
"""

from __future__ import annotations

from .control import Client, ControlError
from .fs import Passthrough, Pipe, Throttle
from .runner import Mount, MountError
from .settings import OPS, SettingError, Settings, apply_changes, parse_rate

__all__ = [
    "OPS",
    "Client",
    "ControlError",
    "Mount",
    "MountError",
    "Passthrough",
    "Pipe",
    "SettingError",
    "Settings",
    "Throttle",
    "apply_changes",
    "parse_rate",
]
