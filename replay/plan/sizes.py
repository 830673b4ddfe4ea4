"""Sizes as people write them on a command line: `88.1KB`, `50GiB`, `46.09TB`, or plain bytes.

Decimal units (KB, MB, GB, TB, PB: powers of 1000, as kvconnector.units shows sizes) and binary ones (KiB ... PiB:
powers of 1024), case-insensitive, an optional space before the unit. A bare number is bytes.
"""

from __future__ import annotations

import math
import re

__all__ = ["parse_size"]

_UNITS = {"": 1, "b": 1}
for _i, _p in enumerate("kmgtp", start=1):
    _UNITS[f"{_p}b"] = 1000**_i
    _UNITS[f"{_p}ib"] = 1024**_i
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_size(value: str | float | int) -> float:
    """Bytes in `value`; ValueError (a message for the user) when it is not a positive size."""
    if isinstance(value, bool):
        raise ValueError(f"expected a size like 88.1KB or 50GiB, got {value!r}")
    if isinstance(value, (int, float)):
        n = float(value)
    else:
        m = _SIZE.match(str(value))
        unit = m.group(2).lower() if m else None
        if not m or unit not in _UNITS:
            raise ValueError(f"expected a size like 88.1KB, 50GiB or 46.09TB, got {value!r}")
        n = float(m.group(1)) * _UNITS[unit]
    if not math.isfinite(n) or n <= 0:
        raise ValueError(f"a size must be more than 0 bytes, got {value!r}")
    return n
