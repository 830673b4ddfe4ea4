"""Sizes as kvtier counts, shows and reads them: decimal units, as disks and the `*_gb` flags and keys do
(1 GB = 10**9 B), and binary ones (GiB) where a user writes them."""

from __future__ import annotations

import math
import re

GB = 1_000_000_000


def human_bytes(n: float) -> str:
    """1.5 GB, 20.0 MB, 512 KB: decimal units, as the size flags use."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


_UNIT = {"": 1}
for _i, _p in enumerate("kmgtp", start=1):
    _UNIT[_p] = 1000**_i
    _UNIT[f"{_p}i"] = 1024**_i
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmgtp]i?)?\s*(b|bytes?)?\s*$", re.IGNORECASE)


def parse_size(value: str | float | int, *, allow_zero: bool = False) -> float:
    """Bytes in a size as people write it: `88.1KB`, `50GiB`, `46.09TB`, `500M`, or a bare number of bytes.
    Decimal prefixes are powers of 1000 (as kvtier shows sizes), binary ones (KiB ... PiB) of 1024; case-insensitive.
    ValueError, with a one-line message for the user, for anything else or for a size that is not more than 0 (or,
    with `allow_zero`, less than 0)."""
    if isinstance(value, bool):
        raise ValueError(f"expected a size like 88.1KB or 50GiB, got {value!r}")
    if isinstance(value, (int, float)):
        n = float(value)
    else:
        m = _SIZE.match(str(value))
        if not m:
            raise ValueError(f"expected a size like 88.1KB, 50GiB or 46.09TB, got {value!r}")
        n = float(m.group(1)) * _UNIT[(m.group(2) or "").lower()]
    if not math.isfinite(n) or n < 0 or (n == 0 and not allow_zero):
        raise ValueError(f"a size must be more than 0 bytes, got {value!r}")
    return n
