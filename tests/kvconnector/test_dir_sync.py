"""An acknowledged entry's name is durable: write_entry fsyncs the directory after the rename that publishes the entry
(a new file or a spare overwritten in place), before it returns, and concurrent writers share those fsyncs. Observed
on the real system calls with strace."""

import re
import shutil
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest

from kvconnector.files import DirSyncer

needs_strace = pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")

# Writes `n` entries from `threads` threads into a DiskTier, then deletes and rewrites one so a spare is overwritten;
# after each write returns, stats a marker name so strace shows where the acknowledgement falls.
SCRIPT = textwrap.dedent(
    """
    import os, sys
    from concurrent.futures import ThreadPoolExecutor
    from kvconnector.tiers import DiskTier
    from kvconnector.timed_io import aligned_buffer

    directory, n, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    tier = DiskTier(directory, capacity_bytes=1 << 30, io_mode="buffered", spare_ratio=0.5)
    buf = aligned_buffer(64 << 10)

    def put(i):
        tier.write(f"k{i}", [buf], len(buf))
        os.path.exists(f"/nonexistent-ack-k{i}")

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(put, range(n)))
    tier.delete("k0")  # kept as a spare
    tier.write("again", [buf], len(buf))  # overwrites that spare, then renames it into place
    os.path.exists("/nonexistent-ack-again")
    """
)


def _trace(tmp_path, n, threads):
    """The script's renames into the cache directory, fsyncs of that directory and acknowledgements, in order."""
    out = tmp_path / "strace.txt"
    cache = str(tmp_path / "cache")
    subprocess.run(
        # -y: every fd printed with the path it refers to, so a directory fsync names the directory.
        ["strace", "-f", "-qq", "-y", "-o", str(out), "-e", "trace=rename,fsync,newfstatat,stat"]
        + [sys.executable, "-c", SCRIPT, cache, str(n), str(threads)],
        check=True,
        timeout=120,
    )
    events = []
    for line in out.read_text().splitlines():
        # Calls by where they start (with several threads a call's line may end "<unfinished ...>"); the script fails
        # on any failed call.
        if re.search(r'rename\("[^"]*", "' + re.escape(cache) + r'/[^"]*\.kv"', line):
            events.append(("rename", line))
        elif re.search(r"fsync\(\d+<" + re.escape(cache) + r">", line):
            events.append(("fsync", line))
        elif m := re.search(r'"/nonexistent-ack-(\w+)"', line):
            events.append(("ack", m.group(1)))
    return events


@needs_strace
def test_each_write_fsyncs_its_directory_after_the_rename_and_before_it_returns(tmp_path):
    pending: list[str] = []  # renames that publish an entry, not yet covered by a directory fsync
    acked = []
    for kind, what in _trace(tmp_path, n=3, threads=1):
        if kind == "rename":
            pending.append(what)
        elif kind == "fsync":
            pending.clear()
        else:
            assert not pending, f"the write of {what} returned before its rename was made durable: {pending}"
            acked.append(what)
    assert acked == ["k0", "k1", "k2", "again"]


@needs_strace
def test_concurrent_writers_share_directory_fsyncs(tmp_path):
    n = 64
    kinds = [kind for kind, _ in _trace(tmp_path, n=n, threads=8)]
    renames, fsyncs = kinds.count("rename"), kinds.count("fsync")
    assert renames == n + 1 and kinds[-1] == "ack" and kinds[-2] == "fsync"
    # Every write waits for a directory fsync, yet fewer ran than writes: writers that renamed while one was running
    # share the next.
    assert 0 < fsyncs < renames, (fsyncs, renames)


def test_a_failed_directory_fsync_reaches_every_writer_it_covered_and_the_next_sync_runs_again(tmp_path):
    gone = tmp_path / "gone"
    gone.mkdir()
    syncer = DirSyncer(str(gone))
    syncer.sync()
    gone.rmdir()  # the next fsync cannot even open the directory
    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(lambda _: _outcome(syncer.sync), range(32)))
    assert outcomes == ["FileNotFoundError"] * 32
    gone.mkdir()  # a later call leads a fresh fsync: no writer is left waiting on the failed one
    syncer.sync()


def _outcome(call):
    try:
        call()
    except OSError as exc:
        return type(exc).__name__
    return "ok"
