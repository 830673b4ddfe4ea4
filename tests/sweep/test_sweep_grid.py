"""kvtier sweep without running a driver: the grid, its drift-spreading order, and what a user's mistake gets."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest

from deploy.sweep import REFERENCE, grid, parse_bw_list, parse_lat_list, schedule
from deploy.sweep.cli import summarize


def _pts(bw="4GB/s,1GB/s,250MB/s", lat="0,0.5,1,2"):
    return grid(parse_bw_list(bw), parse_lat_list(lat))


def test_grid_has_every_pair_and_leaves_the_reference_to_the_schedule():
    pts = _pts("none,1GB/s", "0,1")
    assert [(p.bw_text, p.lat_ms) for p in pts] == [("none", 1.0), ("1GB/s", 0.0), ("1GB/s", 1.0)]
    assert parse_bw_list("4GB/s,250MB/s") == [(4e9, "4GB/s"), (250e6, "250MB/s")]


def test_one_pass_is_serpentine_between_two_references():
    order = schedule(_pts(), 1)
    assert order[0][1] == REFERENCE and order[-1][1] == REFERENCE
    inner = [(p.bw_bytes_s, p.lat_ms) for _, p in order[1:-1]]
    assert len(inner) == 12 and len(set(inner)) == 12
    # neighbouring runs differ in one setting only (serpentine), so no jump undoes the previous change
    for a, b in itertools.pairwise(inner):
        assert (a[0] == b[0]) != (a[1] == b[1])
    assert inner[:4] == [(4e9, 0), (4e9, 0.5), (4e9, 1), (4e9, 2)] and inner[4] == (1e9, 2)


def test_passes_alternate_direction_so_mean_positions_even_out():
    pts = _pts()
    order = schedule(pts, 2)
    assert sum(p == REFERENCE for _, p in order) == 3
    pos: dict = {}
    for i, (_, p) in enumerate(order):
        if p != REFERENCE:
            pos.setdefault(p, []).append(i)
    means = {sum(v) / len(v) for v in pos.values()}
    assert all(len(v) == 2 for v in pos.values())
    # ABBA: every point's mean position is the same (the middle), whatever its place in the grid
    assert max(means) - min(means) < 1e-9


def test_summary_is_median_per_point_relative_to_the_reference_median():
    def run(bw, lat, v, code=0):
        return {"bw": bw, "bw_bytes_s": 0.0 if bw == "none" else 1e9, "lat_ms": lat, "exit_code": code,
                "metrics": {"service_p50_ms": v, "service_p95_ms": None, "disk_read_p50_ms": v,
                            "generation_p50_ms": 1.0, "requests_per_s": 2.0, "l2_hit_share": 0.5}}  # fmt: skip

    runs = [run("none", 0, 10), run("1GB/s", 1, 30), run("1GB/s", 1, 50), run("1GB/s", 1, 999, code=1)]
    runs.append(run("none", 0, 20))
    s = summarize("bench", runs)
    assert s["reference"]["service_p50_ms"] == 15 and s["reference_runs"] == 2
    p = next(p for p in s["points"] if p["lat_ms"] == 1)
    assert p["runs"] == 2 and p["metrics"]["service_p50_ms"] == 40  # the failed run is left out
    assert p["relative"]["service_p50_ms"] == pytest.approx(40 / 15)
    assert p["relative"]["service_p95_ms"] is None and p["relative"]["generation_p50_ms"] == 1.0


@pytest.mark.parametrize(
    "args, says",
    [
        (["--bw", "1GB/s", "--lat-ms", "0,x", "--driver", "bench"], "'x' is not a number of milliseconds"),
        (["--bw", "fast", "--lat-ms", "0", "--driver", "bench"], "'fast' is not a rate"),
        (["--bw", "0", "--lat-ms", "0", "--driver", "bench"], "no throttled point"),
        (["--bw", "1GB/s,1GB/s", "--lat-ms", "0", "--driver", "bench"], "repeated"),
        (["--bw", "1GB/s", "--lat-ms", "0", "--driver", "bench", "--repeat", "0"], "--repeat 0"),
        (["--bw", "1GB/s", "--lat-ms", "0", "--driver", "replay"], "needs --stack"),
        (["--bw", "1GB/s", "--lat-ms", "0", "--driver", "bench", "--", "--cache-dir", "/x"], "--cache-dir after --"),
        (["--bw", "1GB/s", "--lat-ms", "0", "--driver", "bench", "--mount", "/nonexistent-mount"], "not a directory"),
        (["--bw", "1GB/s", "--lat-ms", "0", "--driver", "nope"], "invalid choice"),
    ],
)
@pytest.mark.slow
def test_a_mistake_is_one_line_and_exit_2(args, says):
    r = subprocess.run([sys.executable, "-m", "deploy.sweep", *args], capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvtier sweep: ") and says in lines[0], r.stderr


@pytest.mark.slow
def test_a_non_empty_mountpoint_is_refused_and_left_alone(tmp_path):
    (tmp_path / "mine.txt").write_text("keep")
    r = subprocess.run(
        [sys.executable, "-m", "deploy.sweep", "--bw", "1GB/s", "--lat-ms", "0", "--driver", "bench",
         "--mount", str(tmp_path)], capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode == 2 and "not empty" in r.stderr
    assert (tmp_path / "mine.txt").read_text() == "keep"


def test_help_has_examples():
    r = subprocess.run([sys.executable, "-m", "deploy.sweep", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "examples:" in r.stdout and "--driver replay" in r.stdout
