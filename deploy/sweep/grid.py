"""The grid of a sweep: bandwidth caps x added latencies, plus the unthrottled reference, in a drift-spreading order."""

from __future__ import annotations

from dataclasses import dataclass

from deploy.throttle.settings import SettingError, parse_ms, parse_rate


@dataclass(frozen=True)
class Point:
    """One throttle setting: a cap on both directions (bytes/s, 0 = none) and latency added per operation (ms)."""

    bw_bytes_s: float
    lat_ms: float
    bw_text: str

    @property
    def is_reference(self) -> bool:
        return self.bw_bytes_s == 0 and self.lat_ms == 0

    @property
    def label(self) -> str:
        return f"{self.bw_text} {self.lat_ms:g}ms"

    def changes(self) -> dict:
        """The body of throttlefs's PUT /settings for this point: both directions, every operation."""
        return {"bw": self.bw_bytes_s, "lat_ms": self.lat_ms}


REFERENCE = Point(0.0, 0.0, "none")


def parse_bw_list(text: str) -> list[tuple[float, str]]:
    """'4GB/s,1GB/s,250MB/s' -> [(4e9, '4GB/s'), ...]; 0 / none / off = no cap. SettingError on a bad entry."""
    out = []
    for item in _items(text, "--bw"):
        out.append((parse_rate(item), "none" if parse_rate(item) == 0 else item))
    return out


def parse_lat_list(text: str) -> list[float]:
    return [parse_ms(item) for item in _items(text, "--lat-ms")]


def _items(text: str, flag: str) -> list[str]:
    items = [t.strip() for t in text.split(",")]
    if not items or any(not t for t in items):
        raise SettingError(f"{flag} '{text}': give a comma-separated list without empty entries")
    if len(set(items)) != len(items):
        raise SettingError(f"{flag} '{text}': an entry is repeated")
    return items


def grid(bws: list[tuple[float, str]], lats: list[float]) -> list[Point]:
    """Every (bandwidth, latency) pair, bandwidth-major, without the reference (it is added by `schedule`)."""
    return [Point(bw, lat, text) for bw, text in bws for lat in lats if not (bw == 0 and lat == 0)]


def schedule(points: list[Point], repeat: int) -> list[tuple[int, Point]]:
    """The order the driver runs: (repeat index, point) pairs.

    Why this order: slow drift of the machine (other load, the disk warming, a filling cache directory) would show up
    as a gradient along whatever order the grid is walked. Each pass walks the grid serpentine (latency ascending for
    the first bandwidth, descending for the next, ...) so neighbouring runs differ in one setting, and every second
    pass walks it backwards (an ABBA design: over two passes each point's mean position is the middle). The
    unthrottled reference runs at the start of every pass and once at the very end, so every throttled run has a
    reference run on each side of its pass to be compared with.
    """
    lats = sorted({p.lat_ms for p in points})
    bws = []
    for p in points:
        if (p.bw_bytes_s, p.bw_text) not in bws:
            bws.append((p.bw_bytes_s, p.bw_text))
    by_key = {(p.bw_bytes_s, p.lat_ms): p for p in points}
    serp: list[Point] = []
    for i, (bw, _) in enumerate(bws):
        for lat in lats if i % 2 == 0 else reversed(lats):
            if (bw, lat) in by_key:
                serp.append(by_key[(bw, lat)])
    order: list[tuple[int, Point]] = []
    for r in range(repeat):
        order.append((r, REFERENCE))
        order += [(r, p) for p in (serp if r % 2 == 0 else serp[::-1])]
    order.append((repeat - 1, REFERENCE))
    return order


__all__ = ["REFERENCE", "Point", "SettingError", "grid", "parse_bw_list", "parse_lat_list", "schedule"]
