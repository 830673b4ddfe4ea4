"""Serving a tier's directory again after a restart.

`rescan_dir` walks a tier directory: every `*.kv` file's header is validated (magic, version, header checksum, file
length; the name must be the hash of the key it holds; with `verify_payload` the payload checksum too). Valid entries
are adopted by the store oldest first (so the LRU order survives the restart); corrupt, truncated or misnamed files
are removed and counted, and so are temp files a crash left behind (in a shared directory only those older than
`stale_tmp_s`, because younger ones may be another instance's write in flight). Nothing but `*.kv` files and our temp
files is ever touched.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass

from .entry_format import file_name_for
from .errors import CorruptEntryError
from .timed_io import IOMode, read_entry, read_header

_TMP_MARK = ".kv.tmp"


@dataclass(slots=True)
class RescanReport:
    tier: str
    adopted: int = 0
    adopted_bytes: int = 0
    corrupt_removed: int = 0
    stale_tmp_removed: int = 0
    no_room_removed: int = 0
    duration_ms: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def rescan_dir(store, t: int, *, verify_payload: bool = False, stale_tmp_s: float | None = None,
               shared: bool = False) -> RescanReport:
    """Adopt the valid entries of store.tiers[t] (a DiskTier) into the store; remove the rest (see module doc).
    In a shared directory (`shared`) entries that do not fit are left for the other instances."""
    t0 = time.perf_counter_ns()
    tier = store.tiers[t]
    report = RescanReport(tier.name)
    now = time.time()
    found = []
    with os.scandir(tier.directory) as it:
        for de in it:
            name = de.name
            if _TMP_MARK in name:
                try:
                    age_s = now - de.stat(follow_symlinks=False).st_mtime
                except FileNotFoundError:
                    continue
                if stale_tmp_s is None or age_s > stale_tmp_s:
                    _unlink(de.path)
                    report.stale_tmp_removed += 1
                continue
            if not name.endswith(".kv") or not de.is_file(follow_symlinks=False):
                continue
            try:
                hdr = read_header(de.path)
                if file_name_for(hdr.key) != name:
                    raise CorruptEntryError(f"{de.path}: name does not match the key it holds")
                if verify_payload:
                    read_entry(de.path, hdr.key, hdr.payload_nbytes, IOMode.BUFFERED, None)
                found.append((de.stat().st_mtime_ns, hdr))
            except FileNotFoundError:
                continue  # removed by another instance while we looked
            except (CorruptEntryError, OSError):
                _unlink(de.path)
                report.corrupt_removed += 1
    found.sort(key=lambda x: x[0])
    for _, hdr in found:
        if store.adopt(t, hdr.key, hdr.payload_nbytes, hdr.shape, hdr.dtype):
            report.adopted += 1
            report.adopted_bytes += hdr.payload_nbytes
        elif not shared and store.contains(hdr.key) is None:
            # No room (the tier shrank since the last run): the oldest entries were adopted first and may have
            # been demoted to make room; what is left over is removed so the directory stays within capacity.
            tier.delete(hdr.key)
            report.no_room_removed += 1
    for event in ("corrupt_removed", "stale_tmp_removed", "no_room_removed"):
        if getattr(report, event):
            store.stats[t].count("rescan_" + event, getattr(report, event))
    report.duration_ms = (time.perf_counter_ns() - t0) / 1e6
    return report


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
