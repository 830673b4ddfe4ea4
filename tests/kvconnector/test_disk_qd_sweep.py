"""benchmarks/disk_qd_sweep.py --quick end to end, with real fio and a real DiskTier: every cell of the grid is
measured on both sides with the same bytes, and the table reports it."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed")


@pytest.mark.slow
def test_quick_sweep_measures_every_cell_on_both_sides(tmp_path):
    out = tmp_path / "sweep.json"
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.disk_qd_sweep",
        "--quick",
        "--dir",
        str(tmp_path / "d"),
        "--json",
        str(out),
    ]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr
    got = json.loads(out.read_text())
    assert got["provenance"]["kvtier_version"]
    cells = got["cells"]
    assert [(c["entry_bytes"], c["in_flight"]) for c in cells] == [
        (128 << 10, 1),
        (128 << 10, 4),
        (2 << 20, 1),
        (2 << 20, 4),
    ]
    for c in cells:
        for op in ("write", "read"):
            x = c[op]
            # Both sides moved exactly the cell's entries, and each figure is a real measurement.
            assert x["kvtier_bytes"] == x["fio_bytes"] == [c["entries"] * c["entry_bytes"]]
            assert x["ratio"] > 0 and x["kvtier_cpu_s_per_gib"] > 0 and 0 < x["kvtier_host_share"] < 1
    rows = [line.split() for line in run.stdout.splitlines() if line.strip().startswith(("128 KiB", "2 MiB"))]
    assert [(r[2], r[3]) for r in rows] == [(qd, op) for qd in ("1", "4") for op in ("w", "r")] * 2, run.stdout
    assert list((tmp_path / "d").iterdir()) == []


def test_a_bad_size_is_one_clear_line(tmp_path):
    cmd = [sys.executable, "-m", "benchmarks.disk_qd_sweep", "--sizes", "12x", "--dir", str(tmp_path)]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "--sizes: expected a size" in run.stderr and "'12x'" in run.stderr
    assert "Traceback" not in run.stderr
