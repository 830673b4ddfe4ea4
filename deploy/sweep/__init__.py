"""`kvtier sweep`: storage sensitivity of the drivers, one throttle setting at a time.

The testbed of the JGU Mainz storage-tiering case study ("Wo der KV-Cache liegt: Storage-Tiering für LLM-Inferenz
unter realem Traffic", 2026): bandwidth and per-operation latency varied independently under a live stack.

    kvtier sweep --bw 4GB/s,1GB/s,250MB/s --lat-ms 0,0.5,1,2 [--repeat K] --driver bench|replay \\
        --output sweep.json [--plots DIR] -- <driver args>
    # the same as: python -m deploy.sweep with the same arguments

kvtier's disk tier sits on a throttlefs mount (deploy/throttle) for the whole sweep; between points only the mount's
settings change, through its control endpoint, never a remount. Each point runs the driver once per pass as its own
process (`kvtier bench` with --cache-dir on the mount, or `kvtier replay` against a deploy/run-stack.sh stack whose
--kv-dir is the mount, LMCache's L1 cleared before each point so what is measured is the kvtier tier; one
unmeasured warm-up run first, so every point finds the same prefixes stored).

Order (grid.schedule): each pass walks the grid serpentine, every second pass backwards (ABBA), with the unthrottled
reference first in every pass and once more at the end, so machine drift spreads over the grid instead of lining up
with an axis. Output: the sweep JSON (every run with its figures, exit code, load average, and what the throttle
counted during it: ops, added latency per op, time held for the cap; then per point the median over its runs and the
ratio to the reference's median), one table on stdout, and heat maps (heatmap_<figure>.png, latency x bandwidth,
cells relative to the reference). Figures: bench: storage service latency p50/p95 (end to end minus simulated
generation), disk-tier read p50, generation p50 (simulated decode: it must not move), requests/s, L2 hit share;
replay: TTFT p50/p95, TPOT p50, output tokens/s, L2 (external prefix cache) hit share.
"""

from __future__ import annotations

from .grid import REFERENCE, Point, grid, parse_bw_list, parse_lat_list, schedule
from .metrics import HEADLINE, METRICS, extract

__all__ = [
    "HEADLINE",
    "METRICS",
    "REFERENCE",
    "Point",
    "extract",
    "grid",
    "parse_bw_list",
    "parse_lat_list",
    "schedule",
]
