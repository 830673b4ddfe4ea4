"""What the throttlefs tests that mount need: skip conditions and a mount on fresh directories."""

from __future__ import annotations

import os
import shutil

import pytest


def fuse_missing() -> str | None:
    from deploy.throttle.cli import check_fuse

    return check_fuse()


needs_fuse = pytest.mark.skipif(fuse_missing() is not None, reason=f"FUSE unavailable: {fuse_missing()}")
needs_fio = pytest.mark.skipif(shutil.which("fio") is None, reason="fio not installed")


def shm_dir(tmp_path_factory, name: str) -> str:
    """A backing directory on tmpfs where there is one: the disk's own swings (2x here) stay out of the figures."""
    base = (
        "/dev/shm"
        if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK)
        else str(tmp_path_factory.getbasetemp())
    )
    path = os.path.join(base, f"kvtier-throttlefs-{os.getpid()}-{name}")
    os.makedirs(path)
    return path
