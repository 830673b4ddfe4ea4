"""`kvtier throttlefs`: mount a throttling FUSE passthrough of a directory and stay in the foreground."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import threading

from replay.common.cli import Interrupted, OneLineParser, command, fail, stop_signals_raise

from .settings import OPS, SettingError, Settings, apply_changes, human_rate

PROG = "kvtier throttlefs"

EPILOG = """\
examples:
  # a disk tier that reads at a quarter of 1 GB/s and pays 1 ms per operation
  kvtier throttlefs /mnt/slow --backing /var/tmp/kv --read-bw 250MB/s --lat-ms 1
  # both directions capped, random +-0.2 ms on top of 0.5 ms reads; control endpoint on a fixed port
  kvtier throttlefs /mnt/slow --backing /var/tmp/kv --bw 1GiB/s --read-lat-ms 0.5 --jitter-ms 0.2 --control-port 9123
  # change it while mounted (a sweep does not remount), read its counters
  curl -X PUT -d '{"bw": "4GB/s", "lat_ms": 2}' http://127.0.0.1:9123/settings
  curl http://127.0.0.1:9123/stats ; curl http://127.0.0.1:9123/metrics

Rates take units (250MB/s, 1GiB/s, 500M; 0 = no cap); latencies are added per operation (read, write, fsync, open),
whatever its size. Every open uses direct_io, so the kernel's page cache cannot hide the throttle; O_DIRECT opens are
passed to the backing files. Stops on SIGINT/SIGTERM (unmounts; exit 130/143) or `fusermount3 -u MOUNTPOINT` (exit 0),
then prints what it did: ops, bytes, time held for the caps and for added latency, per operation.
"""


def build_parser() -> OneLineParser:
    ap = OneLineParser(
        prog=PROG,
        description="Mount a passthrough of --backing at MOUNTPOINT: bandwidth caps, added latency per operation.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("mountpoint", help="an empty directory to mount on")
    ap.add_argument("--backing", required=True, help="the directory whose files the mount shows")
    ap.add_argument("--bw", help="cap for reads and writes each (e.g. 1GB/s)")
    ap.add_argument("--read-bw", help="cap for reads (overrides --bw)")
    ap.add_argument("--write-bw", help="cap for writes (overrides --bw)")
    ap.add_argument("--lat-ms", help="ms added to every read, write, fsync and open")
    for op in OPS:
        ap.add_argument(f"--{op}-lat-ms", help=f"ms added to each {op} (overrides --lat-ms)")
    ap.add_argument("--jitter-ms", help="each added latency is drawn uniformly within +-J ms of its value (>= 0)")
    ap.add_argument(
        "--burst", help="token-bucket depth per direction in bytes (e.g. 1MiB); default 0: strict pacing, as a device"
    )
    ap.add_argument(
        "--control-port", type=int, default=0, help="control endpoint port on 127.0.0.1 (default: any free)"
    )
    ap.add_argument(
        "--max-request", default="1MiB", help="largest FUSE read/write request (default 1MiB; the kernel splits larger)"
    )
    return ap


def _inside(child: str, parent: str) -> bool:
    return child == parent or child.startswith(parent.rstrip("/") + "/")


def check_paths(mountpoint: str, backing: str) -> tuple[str, str]:
    """Real paths of both, or SettingError with one line saying what is wrong."""
    if not os.path.isdir(backing):
        raise SettingError(f"--backing {backing}: {'not a directory' if os.path.exists(backing) else 'does not exist'}")
    if not os.path.isdir(mountpoint):
        what = "not a directory" if os.path.exists(mountpoint) else "does not exist (create an empty directory)"
        raise SettingError(f"mountpoint {mountpoint}: {what}")
    mnt, back = os.path.realpath(mountpoint), os.path.realpath(backing)
    if os.path.ismount(mnt):
        raise SettingError(f"mountpoint {mountpoint}: already a mount point (unmount it first: fusermount3 -u {mnt})")
    if os.listdir(mnt):
        raise SettingError(f"mountpoint {mountpoint}: not empty (mounting would hide its files)")
    if _inside(back, mnt):
        raise SettingError(f"--backing {backing} is inside the mountpoint {mountpoint}")
    if _inside(mnt, back):
        raise SettingError(f"mountpoint {mountpoint} is inside --backing {backing} (the mount would see itself)")
    if not os.access(back, os.R_OK | os.W_OK | os.X_OK):
        raise SettingError(f"--backing {backing}: not readable and writable by this user")
    return mnt, back


def check_fuse() -> str | None:
    """What is missing to mount FUSE here, or None."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse on this machine (FUSE is not available)"
    if shutil.which("fusermount3") is None:
        return "fusermount3 not found (install the Debian package fuse3)"
    # mfusepy looks for libfuse 2 first; this passthrough is written for libfuse 3 (its init and config structs).
    os.environ.setdefault("FUSE_LIBRARY_NAME", "fuse3")
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as exc:
        return f"cannot load libfuse3 through mfusepy ({exc}; install fuse3 and `pip install mfusepy`)"
    return None


def settings_from_args(a) -> Settings:
    changes = {
        "bw": a.bw,
        "read_bw": a.read_bw,
        "write_bw": a.write_bw,
        "lat_ms": a.lat_ms,
        "jitter_ms": a.jitter_ms,
        "burst": a.burst,
    }
    changes.update({f"{op}_lat_ms": getattr(a, f"{op}_lat_ms") for op in OPS})
    return apply_changes(Settings(), changes)


def summary_table(snap: dict) -> str:
    """Plain-text table of what the throttle did (also fine in a log file)."""
    lines = [
        f"{'op':<6}{'ops':>10}{'bytes':>14}{'avg B/s':>12}{'held for cap s':>16}{'added lat s':>13}"
        f"{'timer err ms/op':>17}{'errors':>8}"
    ]
    up = max(snap["uptime_s"], 1e-9)
    for op, c in snap["ops"].items():
        rate = human_rate(c["bytes"] / up) if c["bytes"] else "-"
        lines.append(
            f"{op:<6}{c['ops']:>10}{c['bytes']:>14}{rate:>12}{c['bw_wait_ns'] / 1e9:>16.3f}"
            f"{c['lat_ns'] / 1e9:>13.3f}{c['hold_error_ns'] / 1e6 / max(c['ops'], 1):>17.3f}{c['errors']:>8}"
        )
    lines.append(
        f"mounted {snap['uptime_s']:.1f} s; O_DIRECT transfers via an aligned buffer: {snap['direct_bounces']}"
    )
    return "\n".join(lines)


def _unmount(mnt: str) -> None:
    # Lazy: a process with a file open in the mount does not keep the server up; the mount goes when it closes.
    subprocess.run(["fusermount3", "-u", "-z", mnt], check=False, capture_output=True)


@command("throttlefs")
def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    # A refusal raises a SettingError: replay/cli.py says it in one line, exit 2.
    settings = settings_from_args(a)
    from .settings import parse_rate

    max_request = int(parse_rate(a.max_request))
    if not 4096 <= max_request <= 1 << 20 or max_request % 4096:
        raise SettingError(f"--max-request {a.max_request}: a multiple of 4 KiB from 4KiB to 1MiB")
    if not 0 <= a.control_port <= 65535:
        raise SettingError(f"--control-port {a.control_port}: 0 to 65535")
    mnt, back = check_paths(a.mountpoint, a.backing)
    missing = check_fuse()
    if missing:
        return fail(PROG, missing)

    from .control import make_server
    from .fs import Passthrough, Throttle, make_fuse_class

    throttle = Throttle(settings)
    try:
        server = make_server(throttle, a.control_port)
    except OSError as exc:
        return fail(PROG, f"--control-port {a.control_port}: cannot listen on 127.0.0.1 ({exc.strerror})")
    url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, name="throttlefs-control", daemon=True).start()

    mounted = threading.Event()
    ops = Passthrough(back, throttle, max_request, on_mounted=mounted.set)
    failure: list[BaseException] = []

    def run_fuse() -> None:
        try:
            make_fuse_class()(
                ops,
                mnt,
                foreground=True,
                direct_io=True,  # every open bypasses the kernel's page cache: the throttle sees every byte
                use_ino=True,
                # Worker threads: libfuse's multi-threaded loop (up to 10). Idle threads kept: named, because libfuse
                # 3.14.0 takes its own default for them (unset, UINT_MAX) for a bad value and prints "Ignoring invalid
                # max threads value 4294967295" on every mount (3.14.1 stopped printing it).
                max_idle_threads=10,
                fsname=f"throttlefs:{back}",
                subtype="kvtier-throttlefs",
            )
        except BaseException as exc:  # reported by the main thread as one line
            failure.append(exc)

    # FUSE runs in a thread so this one keeps Python's SIGINT/SIGTERM handlers (libfuse leaves handlers it did not
    # install alone); a signal unmounts, which ends libfuse's loop like `fusermount3 -u` does.
    fuse_thread = threading.Thread(target=run_fuse, name="throttlefs-fuse", daemon=True)
    signum = 0
    with stop_signals_raise():
        try:
            fuse_thread.start()
            while not mounted.wait(0.2):
                if not fuse_thread.is_alive():
                    break
            if mounted.is_set():
                print(f"{PROG}: mounted {mnt} (backing {back}); {settings.describe()}; control {url}", flush=True)
            while fuse_thread.is_alive():
                fuse_thread.join(0.5)
        except Interrupted as exc:
            signum = exc.signum
            _unmount(mnt)
            fuse_thread.join(30)
    server.shutdown()
    if not mounted.is_set():
        why = f": {failure[0]}" if failure else ""
        return fail(PROG, f"mounting {mnt} failed{why} (fusermount3's message above, if any)", 1)
    print(f"{PROG}: unmounted {mnt}" + (f" on {signal.Signals(signum).name}" if signum else ""), file=sys.stderr)
    # An operation held for its cap or latency when the mount went is still counted: it finishes, then the table
    # (waiting at most its longest added latency, plus 10 s of bandwidth holds).
    s = throttle.settings
    left = throttle.wait_idle(max(s.latency_ms(op) for op in OPS) / 1e3 + s.jitter_ms / 1e3 + 10)
    if left:
        print(f"{PROG}: {left} operation(s) still in flight, not in the table below", file=sys.stderr)
    print(summary_table(throttle.snapshot()), file=sys.stderr)
    return 128 + signum if signum else 0


if __name__ == "__main__":  # as `kvtier ...`: logging and signals set up by the dispatcher (replay/cli.py)
    from replay.cli import main as kvtier

    sys.exit(kvtier(["throttlefs", *sys.argv[1:]]))
