"""What every merge of kvtier results does the same way, whoever ran the parts (`kvtier merge`, `kvtier bench
--num-clients` and MPI ranks: replay/synthetic/merge.py; `mpirun kvtier replay`: replay/openai/merge.py):
- latency percentiles come from the parts' merged HDR histograms (`merged_histogram`), never from their percentiles;
- rates are over the union of the parts' wall-clock windows (`union_s`): overlapping time counted once.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvconnector.histogram import LatencyHistogram


def union_s(intervals: Sequence[tuple[float, float]]) -> float:
    """The length of the union of the intervals: overlapping time counted once."""
    total, end = 0.0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def merged_histogram(encoded: Iterable[str | None]) -> LatencyHistogram:
    """One histogram from the parts' encoded ones (`LatencyHistogram.encode`): their samples pooled; a part without
    the histogram adds nothing."""
    hist = LatencyHistogram()
    for text in encoded:
        hist.merge(LatencyHistogram.decode(text or ""))
    return hist
