"""Crash consistency as a figure: a writer SIGKILLed 50 times in the middle of its puts, every restart verified.

The loop itself is benchmarks/crash_loop.py (real TieredStore, DiskTier with spares, SharedDirTier, O_DIRECT and
buffered, a real child process killed for real); these tests run it and assert its figures, and prove that the
figures would show a rescan that adopted a torn entry, or a tier whose files and accounting disagree.
"""

import os
import shutil

import pytest

from benchmarks import crash_loop
from kvconnector import uring
from kvconnector.entry_format import ENTRY_NAME
from kvconnector.timed_io import probe_direct


@pytest.mark.slow
def test_fifty_kills_serve_nothing_torn_and_lose_nothing_acknowledged(tmp_path):
    f = crash_loop.run_loop(str(tmp_path / "loop"), kills=50, seed=0, corrupt_every=10)
    print("\n" + crash_loop.table(f))
    assert f.kills == 50 and f.stores >= 500 and f.spare_writes > 0
    assert f.corrupt_injected >= 15 and f.corrupt_dropped >= f.corrupt_injected
    assert f.corrupt_served == 0 and f.adopted_unreadable == 0 and f.verified == f.adopted
    assert f.acked_lost == 0 and f.temp_survived == 0 and f.accounting_mismatch == 0
    if probe_direct(str(tmp_path)):
        assert f.o_direct_fallbacks == 0  # O_DIRECT really was used in one tier each round
    assert f.ok


@pytest.mark.slow
def test_kills_during_large_entries_serve_nothing_torn(tmp_path):
    """Entries of 2 MiB to 80 MiB: the checksum written beside the payload, pieced reads, spare overwrites of 32 MiB
    files; kills land inside those puts (they take tens of ms), so some temp files are left for the rescan."""
    f = crash_loop.run_loop(str(tmp_path / "loop"), kills=8, seed=2, corrupt_every=3, p=crash_loop.LARGE)
    print("\n" + crash_loop.table(f))
    assert f.kills == 8 and f.stores > 0 and f.temp_removed > 0
    assert f.corrupt_dropped >= f.corrupt_injected > 0
    assert f.corrupt_served == 0 and f.adopted_unreadable == 0 and f.verified == f.adopted > 0
    assert f.acked_lost == 0 and f.temp_survived == 0 and f.accounting_mismatch == 0 and f.ok
    if uring.registry.ring() is not None:  # the puts and reads went through io_uring's registered buffers
        assert f.uring_writes > 0 and f.uring_reads > 0


@pytest.mark.slow
def test_the_figures_catch_a_rescan_that_adopts_torn_entries(tmp_path):
    # Header-only rescans adopt entries whose payload was damaged by hand: the read-back must count them.
    f = crash_loop.run_loop(str(tmp_path / "loop"), kills=3, seed=1, corrupt_every=1, max_acks=20, verify_payload=False)
    print("\n" + crash_loop.table(f))
    assert f.corrupt_injected > 0 and f.adopted_unreadable > 0 and not f.ok
    assert f.corrupt_served == 0  # even then the load's own checksum refuses them


def test_a_move_between_tiers_cut_short_leaves_no_second_copy(tmp_path):
    # A kill between a demotion's write into the lower tier and the removal from the upper one leaves the entry in
    # both directories. The restart must serve one copy and remove the other (it is kvtier's own file), or the
    # upper directory keeps a file nobody accounts for, for good.
    d = str(tmp_path / "loop")
    store, _ = crash_loop.open_store(d, 0)
    key = "r0-0-65536"
    assert store.put(key, [memoryview(crash_loop.payload(key))]).stored
    src = store.tiers[0].path_for(key)
    shutil.copy2(src, store.tiers[1].path_for(key))  # the demotion's write, the removal never happened
    store.close()
    f = crash_loop.Figures()
    crash_loop.check_restart(d, 1, f, key)
    assert f.verified == 1 and f.accounting_mismatch == 0 and f.corrupt_served == 0
    assert [n for n in os.listdir(os.path.join(d, "disk")) if ENTRY_NAME.fullmatch(n)] == []


@pytest.mark.slow
@pytest.mark.parametrize("p", [crash_loop.SMALL, crash_loop.LARGE], ids=["small", "large"])
def test_kills_under_sync_none_serve_nothing_torn_and_lose_nothing_acknowledged(tmp_path, p):
    """With no fdatasync or directory fsync a kill still loses nothing acknowledged: the page cache outlives the
    process (what it does not outlive, a power cut, is another test's). Nothing torn is served either way."""
    kills = 20 if p is crash_loop.SMALL else 5
    f = crash_loop.run_loop(str(tmp_path / "loop"), kills=kills, seed=3, corrupt_every=4, p=p, sync="none")
    print("\n" + crash_loop.table(f))
    assert f.kills == kills and f.stores > 0 and f.corrupt_dropped >= f.corrupt_injected > 0
    assert f.corrupt_served == 0 and f.adopted_unreadable == 0 and f.verified == f.adopted > 0
    assert f.acked_lost == 0 and f.temp_survived == 0 and f.accounting_mismatch == 0 and f.ok
