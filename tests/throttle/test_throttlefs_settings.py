"""throttlefs without FUSE: units, changes, the token bucket, the summary (fast tier)."""

from __future__ import annotations

import random
import time

import pytest

from deploy.throttle.cli import check_paths
from deploy.throttle.fs import Pipe, Throttle
from deploy.throttle.settings import SettingError, Settings, apply_changes, parse_rate
from replay.cli import main as kvtier  # a refusal is answered by the dispatcher (exit 2, one line)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("250MB/s", 250e6),
        ("1GiB/s", 2**30),
        ("1.5 GB/s", 1.5e9),
        ("500M", 500e6),
        ("4KiB", 4096),
        ("1000", 1000),
        ("0", 0),
        ("off", 0),
        (2e9, 2e9),
    ],
)
def test_rates_with_units(text, value):
    assert parse_rate(text) == value


@pytest.mark.parametrize("text", ["fast", "-1MB/s", "1XB/s", "MB/s", "1e999", True])
def test_bad_rates_are_one_line_errors(text):
    with pytest.raises(SettingError) as err:
        parse_rate(text)
    assert "\n" not in str(err.value)


def test_specific_settings_override_general_ones_whatever_the_order():
    s = apply_changes(Settings(), {"read_lat_ms": 3, "lat_ms": 1, "write_bw": "1MB/s", "bw": "1GB/s"})
    assert (s.read_lat_ms, s.write_lat_ms, s.fsync_lat_ms, s.open_lat_ms) == (3, 1, 1, 1)
    assert (s.read_bw_bytes_s, s.write_bw_bytes_s) == (1e9, 1e6)
    # A change keeps what it does not name.
    t = apply_changes(s, {"jitter_ms": 0.5})
    assert t.read_lat_ms == 3 and t.write_bw_bytes_s == 1e6 and t.jitter_ms == 0.5


def test_unknown_setting_is_refused():
    with pytest.raises(SettingError, match="unknown setting read_bandwidth"):
        apply_changes(Settings(), {"read_bandwidth": "1GB/s"})


def test_pipe_paces_concurrent_bookings_at_the_rate():
    pipe = Pipe()
    now = 1_000_000_000
    # 10 ops of 1 MB booked at the same instant at 100 MB/s: the last may complete 100 ms later, not before.
    slots = [pipe.book(1_000_000, now, 100e6, 0) for _ in range(10)]
    assert slots[0] - now == pytest.approx(10e6, rel=1e-6)
    assert slots[-1] - now == pytest.approx(100e6, rel=1e-6)


def test_pipe_burst_lets_an_idle_direction_pass_that_many_bytes_at_once():
    pipe = Pipe()
    now = 5_000_000_000
    assert pipe.book(1_000_000, now, 100e6, burst=2_000_000) <= now
    assert pipe.book(1_000_000, now, 100e6, burst=2_000_000) <= now
    assert pipe.book(1_000_000, now, 100e6, burst=2_000_000) - now == pytest.approx(10e6, rel=1e-6)


def test_no_cap_books_nothing():
    assert Pipe().book(1 << 30, 7, 0, 0) == 7


def test_finish_counts_what_was_held_and_added():
    t = Throttle(Settings(read_lat_ms=2.0))
    slot, s = t.begin("read", 4096)
    t.finish("read", 4096, slot, s)
    c = t.snapshot()["ops"]["read"]
    assert (c["ops"], c["bytes"], c["lat_ns"]) == (1, 4096, 2_000_000)


def test_paths_refused_with_one_line(tmp_path):
    mnt, back = tmp_path / "mnt", tmp_path / "back"
    back.mkdir()
    with pytest.raises(SettingError, match="does not exist"):
        check_paths(str(mnt), str(back))
    mnt.mkdir()
    (mnt / "keep").write_text("mine")
    with pytest.raises(SettingError, match="not empty"):
        check_paths(str(mnt), str(back))
    (mnt / "keep").unlink()
    inner = mnt / "inner"
    with pytest.raises(SettingError, match="inside the mountpoint"):
        check_paths(str(mnt), str(mnt))
    inner.mkdir()
    with pytest.raises(SettingError, match="not empty"):
        check_paths(str(mnt), str(inner))
    inner.rmdir()
    sub = back / "mnt"
    sub.mkdir()
    with pytest.raises(SettingError, match="inside --backing"):
        check_paths(str(sub), str(back))
    afile = back / "afile"
    afile.write_text("x")
    with pytest.raises(SettingError, match="not a directory"):
        check_paths(str(mnt), str(afile))


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--read-bw", "fast"], "'fast' is not a rate"),
        (["--lat-ms", "-1"], "not a latency"),
        (["--max-request", "3MiB"], "--max-request"),
    ],
)
def test_cli_mistakes_exit_2_with_one_line(tmp_path, capsys, argv, needle):
    (tmp_path / "m").mkdir()
    (tmp_path / "b").mkdir()
    assert kvtier(["throttlefs", str(tmp_path / "m"), "--backing", str(tmp_path / "b"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvtier throttlefs: ") and needle in err and err.count("\n") == 1
    assert not (tmp_path / "m").is_mount()


@pytest.mark.parametrize("op", ["read", "write", "fsync", "open"])
def test_each_operations_latency_holds_that_operation_only(op):
    # What the throttle added is its own count (a loaded machine may stall an unheld operation by any amount, so no
    # wall-clock line tells held from unheld); that the held one really waited is a lower bound no load breaks.
    t = Throttle(apply_changes(Settings(), {f"{op}_lat_ms": 200}))
    for other in ("read", "write", "fsync", "open"):
        slot, s = t.begin(other, 4096)
        t0 = time.monotonic_ns()
        t.finish(other, 4096, slot, s)
        if other == op:
            assert (time.monotonic_ns() - t0) / 1e6 >= 200
    added_ms = {o: c["lat_ns"] / 1e6 for o, c in t.snapshot()["ops"].items() if o in ("read", "write", "fsync", "open")}
    assert added_ms == {o: 200.0 if o == op else 0.0 for o in added_ms}


def test_jitter_spreads_the_added_latency_around_its_value():
    t = Throttle(Settings(read_lat_ms=5.0, jitter_ms=4.0), rng=random.Random(7))
    for _ in range(40):
        slot, s = t.begin("read", 1)
        t.finish("read", 1, slot, s)
    c = t.snapshot()["ops"]["read"]
    # 40 draws within 5 +- 4 ms average near 5 ms; without jitter lat_ns would be exactly 40 x 5 ms.
    assert c["lat_ns"] != 40 * 5_000_000
    assert 40 * 3.5e6 < c["lat_ns"] < 40 * 6.5e6


def test_a_write_cap_does_not_hold_reads():
    t = Throttle(Settings(write_bw_bytes_s=1e6))
    assert t.begin("read", 1 << 20)[0] <= time.monotonic_ns()
    # 1 MiB at 1 MB/s: a slot about 1.05 s ahead; half of that is left whatever a loaded machine delays here
    assert t.begin("write", 1 << 20)[0] - time.monotonic_ns() > 0.5e9
