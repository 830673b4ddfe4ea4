"""Which POSIX gateway to object storage, if any, holds a directory: s3fs, rclone or Mountpoint for Amazon S3 (the
gateways the MLPerf Storage v3.0 rules name for a KV cache on object storage, whose name, version and mount options a
result must record), read from /proc/self/mountinfo, the gateway's own version command and its daemon's command line.
Used by `kvtier bench` (each run's `environment.object_gateway`) and `kvtier mlperf run` (its record's
`filesystems.cache_gateway`)."""

from __future__ import annotations

import os
import subprocess

__all__ = ["GATEWAYS", "gateway_of"]

# POSIX gateways to object storage (the MLPerf Storage v3.0 rules name s3fs, rclone and Mountpoint for Amazon S3 for a
# KV cache on object storage): the FUSE type /proc/self/mountinfo shows for each, its daemon, the version command.
GATEWAYS = {
    "fuse.s3fs": ("s3fs", ["s3fs", "--version"]),
    "fuse.rclone": ("rclone", ["rclone", "version"]),
    "fuse.mountpoint-s3": ("mount-s3", ["mount-s3", "--version"]),
}
# Mount options whose values are secrets (rclone takes keys on its command line): recorded as "***".
_SECRET_WORDS = ("secret", "pass", "key", "token", "credential")


def gateway_of(path: str) -> dict | None:
    """The object-storage gateway whose FUSE mount holds `path` (s3fs, rclone, Mountpoint for S3), or None: its name,
    version (its own --version's first line), the mount's options as the kernel shows them and the options its
    daemon was started with (each secret's value hidden), so a result says what backed the cache dir."""
    mount = _mountinfo_of(path)
    if mount is None:
        return None
    fs_type, source, mount_point, options = mount
    name, version_cmd = GATEWAYS.get(fs_type) or (
        GATEWAYS["fuse.mountpoint-s3"] if fs_type == "fuse" and source == "mountpoint-s3" else (None, None)
    )
    if name is None:
        return None
    try:
        out = subprocess.run(version_cmd, capture_output=True, text=True, timeout=10)
        version = (out.stdout or out.stderr).strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        version = None
    return {
        "name": name,
        "version": version,
        "fs_type": fs_type,
        "source": source,
        "mount_point": mount_point,
        "mount_options": options,
        "daemon_args": _daemon_args(name, mount_point),
    }


def _mountinfo_of(path: str) -> tuple[str, str, str, str] | None:
    """(fs type, source, mount point, mount options + super options) of the mount holding `path`."""
    path = os.path.realpath(path)
    best = None
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                head, _, tail = line.partition(" - ")
                fields, rest = head.split(), tail.split()
                mnt = fields[4].encode().decode("unicode_escape")
                if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and (
                    best is None or len(mnt) >= len(best[2])
                ):
                    best = (rest[0], rest[1], mnt, ",".join(o for o in (fields[5], rest[2]) if o))
    except (OSError, IndexError):
        return None
    return best


def _daemon_args(name: str, mount_point: str) -> list[str] | None:
    """The command line of the gateway's daemon serving `mount_point` (secret values hidden); None if not found."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().decode(errors="replace").rstrip("\0").split("\0")
        except OSError:
            continue
        if (
            args
            and os.path.basename(args[0]) == name
            and any(os.path.realpath(a) == mount_point for a in args[1:] if a.startswith("/"))
        ):
            shown = []
            for a in args[1:]:  # a flag naming a secret hides the value after it too (`--s3-secret-access-key V`)
                after_secret = bool(shown) and shown[-1].startswith("-") and "=" not in shown[-1] and _secret(shown[-1])
                shown.append("***" if after_secret else _hide_secrets(a))
            return shown
    return None


def _secret(option: str) -> bool:
    return any(w in option.lower() for w in _SECRET_WORDS)


def _hide_secrets(arg: str) -> str:
    """`-o` style lists (a=b,c=d) and `--flag=value`: a value whose option names a secret becomes ***."""
    parts = []
    for part in arg.split(","):
        opt, eq, _ = part.partition("=")
        secret = eq and _secret(opt)
        parts.append(f"{opt}=***" if secret else part)
    return ",".join(parts)
