"""Heat maps of a sweep: one PNG per figure, added latency down, bandwidth cap across, each cell / the reference."""

from __future__ import annotations

import os
from pathlib import Path

from replay.outputs.paths import atomic_path
from replay.outputs.plots import literal_texts

from .metrics import METRICS

_DPI = 120


def write_heatmaps(doc: dict, directory: str | os.PathLike) -> list[str]:
    """heatmap_<metric>.png for every figure that has values; returns the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = doc["points"]  # the reference included: its cell (x1.00) anchors the scale where a person looks
    bws: list[tuple[float, str]] = []
    for p in sorted(points, key=lambda p: (p["bw_bytes_s"] != 0, -p["bw_bytes_s"])):
        if (p["bw_bytes_s"], p["bw"]) not in bws:
            bws.append((p["bw_bytes_s"], p["bw"]))
    lats = sorted({p["lat_ms"] for p in points})
    cell = {(p["bw_bytes_s"], p["lat_ms"]): p for p in points}
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for key, head, _, lower_better in METRICS[doc["driver"]]:
        grid = [[(cell.get((bw, lat)) or {}).get("relative", {}).get(key) for bw, _ in bws] for lat in lats]
        if all(v is None for row in grid for v in row):
            continue
        vals = [v for row in grid for v in row if v is not None]
        with plt.style.context("default"):
            fig, ax = plt.subplots(figsize=(1.6 + 1.3 * len(bws), 1.4 + 0.7 * len(lats)))
            import numpy as np

            arr = np.array([[np.nan if v is None else v for v in row] for row in grid], dtype=float)
            # centred on 1 (= the unthrottled point), log so x2 and x0.5 look as far from it
            pos = [v for v in vals if v > 0] + [1.0]
            span = max(abs(np.log(min(pos))), abs(np.log(max(pos))), 0.05)
            arr = np.where(arr <= 0, np.exp(-span), arr)  # x0 (nothing completed) in the scale's worst colour
            cmap = "RdYlGn_r" if lower_better else "RdYlGn"
            from matplotlib.colors import LogNorm

            im = ax.imshow(arr, cmap=cmap, norm=LogNorm(vmin=np.exp(-span), vmax=np.exp(span)), aspect="auto")
            ax.set_xticks(range(len(bws)), [t for _, t in bws])
            ax.set_yticks(range(len(lats)), [f"{lat:g}" for lat in lats])
            ax.set_xlabel("bandwidth cap (both directions)")
            ax.set_ylabel("added latency per op (ms)")
            ref = doc["reference"].get(key)
            ax.set_title(f"{head} / unthrottled ({'-' if ref is None else f'{ref:.3g}'})", fontsize=10)
            for y, row in enumerate(grid):
                for x, v in enumerate(row):
                    ax.text(x, y, "-" if v is None else f"x{v:.2f}", ha="center", va="center", fontsize=9)
            fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
            fig.text(
                0.995,
                0.005,
                f"kvtier sweep --driver {doc['driver']}",
                ha="right",
                va="bottom",
                fontsize=7,
                color="0.45",
            )
            literal_texts(fig)
            fig.tight_layout()
            path = out / f"heatmap_{key}.png"
            with atomic_path(path, suffix=".png") as tmp:  # written whole: a temp file, then a rename
                fig.savefig(tmp, dpi=_DPI)
            plt.close(fig)
            written.append(str(path))
    return written
