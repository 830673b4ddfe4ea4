"""benchmarks/reload_vs_recompute.py without a stack: the break-even arithmetic and the usage errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import reload_vs_recompute

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "reload_vs_recompute.py"


@pytest.fixture(scope="module")
def rvr():
    return reload_vs_recompute


def test_interpolated_break_even_is_the_first_crossing(rvr):
    # reload 100 ms unthrottled, 300 at +10, 900 at +30; recompute 500: crosses at 10 + 200/600 * 20
    pts = [(30.0, 900.0), (0.0, 100.0), (10.0, 300.0)]
    lat, how = rvr.interp_break_even(pts, 500.0)
    assert how == "interp" and lat == pytest.approx(10 + 20 / 3)
    # a noisy dip after the first crossing does not move it
    lat2, _ = rvr.interp_break_even([*pts, (40.0, 450.0)], 500.0)
    assert lat2 == pytest.approx(lat)


def test_interpolated_break_even_outside_the_grid(rvr):
    assert rvr.interp_break_even([(0.0, 100.0), (10.0, 200.0)], 500.0) == (10.0, "above")
    assert rvr.interp_break_even([(0.0, 600.0), (10.0, 700.0)], 500.0) == (0.0, "below")
    assert rvr.interp_break_even([], 500.0) == (None, "none")


def test_least_squares_break_even(rvr):
    # exactly TTFT = 100 + 20 * L: slope 20 ms per ms (20 operations one after another), meets 500 at L = 20
    slope, lat = rvr.fit_break_even([(0.0, 100.0), (10.0, 300.0), (30.0, 700.0)], 500.0)
    assert slope == pytest.approx(20.0) and lat == pytest.approx(20.0)
    # a line that does not rise never crosses
    assert rvr.fit_break_even([(0.0, 100.0), (10.0, 90.0)], 500.0)[1] is None
    assert rvr.fit_break_even([(0.0, 100.0)], 500.0) == (None, None)


@pytest.mark.parametrize(
    "args, says",
    [
        (["--lengths", "5000"], "--lengths between 256 and 4095"),
        (["--lengths", "1k"], "comma-separated numbers"),
        (["--models", "huge"], "--models from tiny,big"),
        (["--lat-ms", "0,2"], "--lat-ms positive"),
        (["--big-hidden", "100", "--big-heads", "3"], "--big-hidden 100 is not a multiple of --big-heads 3"),
    ],
)
def test_usage_errors(args, says):
    p = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert p.stderr.startswith("reload_vs_recompute: ") and says in p.stderr and p.stderr.count("\n") == 1, p.stderr


@pytest.mark.slow
def test_from_json_table_and_plot(tmp_path):
    """An earlier run's JSON gives the table (both break-evens) and the PNG again, without a stack."""
    med = {"uncached": 500.0, "l1": 50.0, "disk": 100.0, "disk+10": 300.0, "disk+30": 900.0}
    d = {"median_ms": med, "reload_over_recompute": {k: v / 500 for k, v in med.items() if k != "uncached"},
         "ops_per_disk_hit": 30, "break_even_lat_ms": 17.1, "break_even_interp_ms": 16.67,
         "break_even_interp": "interp", "failed": []}  # fmt: skip
    doc = {"results": [{"model": "tiny", "lengths": {"4000": d}}], "date": "x", "wall_s": 1,
           "loadavg_start": [1, 1, 1], "loadavg_end": [2, 2, 2]}  # fmt: skip
    (tmp_path / "r.json").write_text(json.dumps(doc))
    png = tmp_path / "r.png"
    p = subprocess.run([sys.executable, str(SCRIPT), "--from-json", str(tmp_path / "r.json"), "--plot", str(png)],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert p.returncode == 0, p.stderr
    row = next(line for line in p.stdout.splitlines() if line.startswith("tiny"))
    assert row.split()[-2:] == ["16.67", "17.10"] and "+30ms" in p.stdout
    assert png.stat().st_size > 10_000
    (tmp_path / "bad.json").write_text("{")
    p = subprocess.run([sys.executable, str(SCRIPT), "--from-json", str(tmp_path / "bad.json")],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert p.returncode == 2 and p.stderr.startswith("reload_vs_recompute: --from-json") and "Traceback" not in p.stderr


def test_a_foreign_work_dir_is_left_alone(tmp_path):
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "notes.txt").write_text("mine")
    p = subprocess.run([sys.executable, str(SCRIPT), "--models", "tiny", "--dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert p.returncode == 2 and "did not make" in p.stderr and p.stderr.count("\n") == 1, p.stderr
    assert (tmp_path / "tiny" / "notes.txt").read_text() == "mine"
