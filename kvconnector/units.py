"""Sizes as kvtier counts and shows them: decimal units, as disks and the `*_gb` flags and keys do (1 GB = 10**9 B)."""

from __future__ import annotations

GB = 1_000_000_000


def human_bytes(n: float) -> str:
    """1.5 GB, 20.0 MB, 512 KB: decimal units, as the size flags use."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"
