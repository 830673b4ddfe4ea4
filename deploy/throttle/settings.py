"""What the throttle does, as one frozen value: rates in bytes/s, latencies in ms (0 = off).

Units for rates: `250MB/s`, `1GiB/s`, `500M`, a bare number is bytes/s; decimal prefixes are powers of 1000 and binary
ones (KiB, MiB, GiB) of 1024, as disks and `kvconnector.units` count. A value of 0 (or `off`) means no cap.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from kvconnector.errors import UserError
from kvconnector.units import parse_size

OPS = ("read", "write", "fsync", "open")

_PER_SECOND = re.compile(r"\s*(/\s*s|ps)\s*$", re.IGNORECASE)


class SettingError(UserError, ValueError):
    """A setting the throttle cannot take (bad unit, negative value, unknown key): the message is one line."""


def parse_rate(text: str | float | int) -> float:
    """`250MB/s` -> 250e6, `1GiB/s` -> 2**30, `0` or `off` -> 0 (no cap). Numbers are bytes/s."""
    if isinstance(text, bool):
        raise SettingError(f"'{text}' is not a rate")
    if isinstance(text, int | float):
        value = float(text)
    else:
        if text.strip().lower() in ("off", "none", "0"):
            return 0.0
        try:
            value = parse_size(_PER_SECOND.sub("", text), allow_zero=True)
        except ValueError:
            raise SettingError(f"'{text}' is not a rate (examples: 250MB/s, 1GiB/s, 0 for no cap)") from None
    if value < 0 or value != value or value == float("inf"):
        raise SettingError(f"'{text}' is not a rate (it must be 0 or more)")
    return value


def parse_ms(text: str | float | int) -> float:
    if isinstance(text, bool):
        raise SettingError(f"'{text}' is not a number of milliseconds")
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise SettingError(f"'{text}' is not a number of milliseconds") from None
    if value < 0 or value != value or value == float("inf"):
        raise SettingError(f"'{text}' is not a latency (it must be 0 ms or more)")
    return value


def human_rate(bytes_s: float) -> str:
    if not bytes_s:
        return "no cap"
    for unit, size in (("GB/s", 1e9), ("MB/s", 1e6), ("KB/s", 1e3)):
        if bytes_s >= size:
            return f"{bytes_s / size:.4g} {unit}"
    return f"{bytes_s:.0f} B/s"


@dataclasses.dataclass(frozen=True)
class Settings:
    """One consistent set of knobs; the filesystem swaps the whole value, so an operation never sees half a change."""

    read_bw_bytes_s: float = 0.0
    write_bw_bytes_s: float = 0.0
    read_lat_ms: float = 0.0
    write_lat_ms: float = 0.0
    fsync_lat_ms: float = 0.0
    open_lat_ms: float = 0.0
    jitter_ms: float = 0.0
    # Token-bucket depth per direction: bytes an idle direction may pass without waiting. 0 = strict pacing, which is
    # what a device's transfer rate does; a deeper bucket lets a QD1 reader after a pause go faster than the cap.
    burst_bytes: float = 0.0

    def latency_ms(self, op: str) -> float:
        return getattr(self, f"{op}_lat_ms")

    def to_json(self) -> dict[str, float]:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        lat = ", ".join(f"{op} +{self.latency_ms(op):g} ms" for op in OPS if self.latency_ms(op))
        parts = [f"read {human_rate(self.read_bw_bytes_s)}", f"write {human_rate(self.write_bw_bytes_s)}"]
        parts.append(lat or "no added latency")
        if self.jitter_ms:
            parts.append(f"jitter +-{self.jitter_ms:g} ms")
        if self.burst_bytes:
            parts.append(f"burst {self.burst_bytes:.0f} B")
        return "; ".join(parts)


# What a change may name, as the CLI flags do (with _ for -): `bw`/`lat_ms` set both directions / all four operations
# first, the specific keys then override them, whatever order they come in.
CHANGE_KEYS = (
    "bw",
    "read_bw",
    "write_bw",
    "lat_ms",
    "read_lat_ms",
    "write_lat_ms",
    "fsync_lat_ms",
    "open_lat_ms",
    "jitter_ms",
    "burst",
)


def apply_changes(base: Settings, changes: dict[str, Any]) -> Settings:
    """A new Settings from `base` and a partial change using the flag names; unknown keys are an error."""
    unknown = sorted(set(changes) - set(CHANGE_KEYS))
    if unknown:
        raise SettingError(f"unknown setting {', '.join(unknown)} (known: {', '.join(CHANGE_KEYS)})")
    new: dict[str, float] = {}
    if changes.get("bw") is not None:
        new["read_bw_bytes_s"] = new["write_bw_bytes_s"] = parse_rate(changes["bw"])
    if changes.get("lat_ms") is not None:
        for op in OPS:
            new[f"{op}_lat_ms"] = parse_ms(changes["lat_ms"])
    for direction in ("read", "write"):
        if changes.get(f"{direction}_bw") is not None:
            new[f"{direction}_bw_bytes_s"] = parse_rate(changes[f"{direction}_bw"])
    for op in OPS:
        if changes.get(f"{op}_lat_ms") is not None:
            new[f"{op}_lat_ms"] = parse_ms(changes[f"{op}_lat_ms"])
    if changes.get("jitter_ms") is not None:
        new["jitter_ms"] = parse_ms(changes["jitter_ms"])
    if changes.get("burst") is not None:
        new["burst_bytes"] = parse_rate(changes["burst"])
    return dataclasses.replace(base, **new)
