"""kvtier sweep --driver bench over a real throttlefs mount (FUSE), a small grid at a few seconds per point.

What could fail: the throttle not applied between points (the mount's own counters per run say what it added), the
order, the figures read from the driver's results, the relative figures, the heat maps.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.throttle.cli import check_fuse

pytestmark = [
    pytest.mark.slow,
    pytest.mark.serial,
    pytest.mark.skipif(check_fuse() is not None, reason=f"FUSE: {check_fuse()}"),
]

# the system-prompt entry of tiny-1b is about 6.3 MB; a read of it goes through the mount in ~1 MiB requests
ENTRY_BYTES = 6.29e6
CAP_BYTES_S = 25e6
LAT_MS = 20.0


def test_small_grid_with_the_bench_driver(tmp_path):
    out, plots = tmp_path / "sweep.json", tmp_path / "plots"
    cmd = [sys.executable, "-m", "deploy.sweep", "--bw", "none,25MB/s", "--lat-ms", f"0,{LAT_MS:g}"]
    cmd += ["--driver", "bench", "--output", str(out), "--plots", str(plots), "--"]
    cmd += ["--num-users", "4", "--duration", "2", "--cpu-mem-gb", "0", "--gpu-mem-gb", "0"]
    cmd += ["--storage-capacity-gb", "0.5", "--max-context-tokens", "256", "--seed", "1"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(out.read_text())
    runs = doc["runs"]
    # reference, then the grid serpentine, then the reference again; every run completed
    assert [(x["bw"], x["lat_ms"]) for x in runs] == [
        ("none", 0),
        ("none", LAT_MS),
        ("25MB/s", LAT_MS),
        ("25MB/s", 0),
        ("none", 0),
    ]
    assert all(x["exit_code"] == 0 for x in runs)
    for x in runs:
        rd = x["throttle"]["read"]
        assert rd["ops"] > 0, x  # the disk tier really was on the mount
        # the setting in force during the run is what the mount added to each read, and nothing was left over
        assert rd["added_lat_ms_per_op"] == pytest.approx(x["lat_ms"], abs=0.01)
        assert (rd["bw_wait_ns"] > 0) == (x["bw"] != "none"), x
    by = {(x["bw"], x["lat_ms"]): x["metrics"] for x in runs[1:-1]}
    # floors that hold on a loaded machine: a read of one entry pays the latency at least once, and the cap in full
    assert by[("none", LAT_MS)]["disk_read_p50_ms"] >= LAT_MS
    assert by[("25MB/s", 0)]["disk_read_p50_ms"] >= 0.9 * ENTRY_BYTES / CAP_BYTES_S * 1e3
    # the throttled points are slower than the unthrottled reference (the effect a sweep exists to show)
    ref = doc["reference"]["disk_read_p50_ms"]
    assert doc["reference_runs"] == 2 and ref is not None
    pts = {(p["bw"], p["lat_ms"]): p for p in doc["points"]}
    cap = pts[("25MB/s", 0)]
    assert cap["relative"]["disk_read_p50_ms"] == pytest.approx(cap["metrics"]["disk_read_p50_ms"] / ref)
    assert cap["relative"]["disk_read_p50_ms"] > 1.5
    # one table on stdout, heat maps on disk
    assert "kvtier sweep (bench)" in r.stdout and "25MB/s" in r.stdout
    assert (plots / "heatmap_disk_read_p50_ms.png").stat().st_size > 5000
    assert {Path(p).name for p in doc["plots"]} >= {"heatmap_service_p50_ms.png", "heatmap_disk_read_p50_ms.png"}
    # one results file per run, kept; the temporary mount and backing are gone
    assert len(list(Path(doc["runs_dir"]).glob("run-*.json"))) == 5
    assert not Path(doc["mount"]).exists() and not Path(doc["backing"]).exists()
