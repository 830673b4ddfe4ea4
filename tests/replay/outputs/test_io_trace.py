"""The I/O trace log: rows from many threads all arrive and parse, .zst and .gz round-trip (other compressed
suffixes are refused, a job's per-process names keep the suffix), a killed process leaves a
readable file up to its last flush, and it works as the store's real op_listener."""

import csv
import gzip
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kvconnector.store import TieredStore
from kvconnector.tiers import CPUTier, DiskTier
from kvconnector.timed_io import OpTiming
from replay.outputs import IOTraceLog, read_trace, request_phase, set_request_phase
from replay.outputs.io_trace import COLUMNS, compression, get_request_phase, tagged

REPO = Path(__file__).resolve().parents[3]


def _hammer(log, threads=4, per_thread=2000):
    def work(i):
        set_request_phase(f"phase{i}")
        timing = OpTiming(host_ns=1_500_000, device_ns=250_000 * (i + 1), nbytes=4096)
        for n in range(per_thread):
            log("read" if n % 2 else "write", "disk", f"t{i}/k{n},x", 4096 + n, timing, "get")

    ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


@pytest.mark.parametrize("suffix", [".csv", ".csv.zst", ".csv.gz", ".CSV.GZ"])
def test_rows_from_several_threads_complete_and_parse(tmp_path, suffix):
    path = tmp_path / f"trace{suffix}"
    log = IOTraceLog(path, start_ns=time.perf_counter_ns(), flush_interval_s=0.05)
    _hammer(log)
    log(op="evict", tier="disk", key="gone", nbytes=10, timing=None, phase="evict")
    log.close()
    log.close()  # twice is fine
    rows = read_trace(path)
    assert len(rows) == 4 * 2000 + 1 and log.rows_written == len(rows)
    assert list(rows[0]) == list(COLUMNS)
    for i in range(4):
        mine = [r for r in rows if r["request_phase"] == f"phase{i}"]
        assert len(mine) == 2000
        # each thread's rows are all there, in its order, with their own timings
        assert [r["key"] for r in mine] == [f"t{i}/k{n},x" for n in range(2000)]  # a comma in a key is quoted
        assert {r["device_ms"] for r in mine} == {f"{0.25 * (i + 1):.4f}"} and mine[0]["host_ms"] == "1.5000"
        assert [int(r["bytes"]) for r in mine] == [4096 + n for n in range(2000)]
    t = [float(r["t_s"]) for r in rows]
    assert all(0 <= x < 60 for x in t)
    evict = rows[-1]
    assert (
        evict["op"] == "evict" and evict["host_ms"] == "" and evict["device_ms"] == "" and evict["request_phase"] == ""
    )
    if suffix == ".csv.zst":
        import zstandard

        with open(path, "rb") as fh:  # a complete, standard zstd stream
            assert zstandard.ZstdDecompressor().stream_reader(fh).read().startswith(b"t_s,op,bytes,")
    if suffix.lower().endswith(".gz"):  # a complete gzip file, as gzip and zcat read it (not plain CSV under .gz)
        assert path.read_bytes()[:2] == b"\x1f\x8b"
        assert gzip.decompress(path.read_bytes()).decode().splitlines()[1:] == [
            ",".join(f'"{v}"' if "," in v else v for v in r.values()) for r in rows
        ]
    log("read", "disk", "late", 1, None, "get")
    assert log.rows_dropped_after_close == 1


def test_request_phase_context_manager():
    assert get_request_phase() is None
    with request_phase("prefill"):
        assert get_request_phase() == "prefill"
        with request_phase("decode"):
            assert get_request_phase() == "decode"
        assert get_request_phase() == "prefill"
    assert get_request_phase() is None


_KILLED = """
import os, signal, sys, time
from replay.outputs import IOTraceLog
log = IOTraceLog(sys.argv[1], flush_interval_s=0.05)
for n in range(500):
    log("write", "disk", f"k{n}", n, None, "put")
deadline = time.monotonic() + 20
while log.rows_written < 500:  # the background flusher took them (no explicit flush)
    if time.monotonic() > deadline:
        sys.exit("the flusher did not write 500 rows in 20 s")
    time.sleep(0.01)
with log._write_lock:  # the flush that counted them has written them too
    pass
for n in range(500, 600):
    log("write", "disk", f"k{n}", n, None, "put")
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("suffix", [".csv", ".csv.zst", ".csv.gz"])
def test_killed_process_leaves_rows_up_to_the_last_flush(tmp_path, suffix):
    path = tmp_path / f"killed{suffix}"
    proc = subprocess.run([sys.executable, "-c", _KILLED, str(path)], cwd=REPO, timeout=30)
    assert proc.returncode == -9
    rows = read_trace(path)
    assert len(rows) >= 500  # everything before the last flush; the rest may or may not have made it
    assert [r["key"] for r in rows[:500]] == [f"k{n}" for n in range(500)]


def test_as_the_store_op_listener(tmp_path):
    store = TieredStore(
        [CPUTier(3 * 4096), DiskTier(str(tmp_path / "d"), 1 << 20, "buffered", name="disk")], target_usage_ratio=0.7
    )
    with IOTraceLog(tmp_path / "t.csv") as log:
        store.op_listener = log
        payload = memoryview(bytes(4096))
        with request_phase("prefill"):
            for n in range(4):
                store.put(f"k{n}", [payload])
        with request_phase("decode"):
            store.get("k0")
        store.close()
    with open(tmp_path / "t.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    phases = {(r["op"], r["tier"], r["phase"], r["request_phase"]) for r in rows}
    assert ("write", "cpu", "put", "prefill") in phases
    assert ("write", "disk", "demote", "prefill") in phases  # a demotion inside a put carries the request's phase
    assert any(r["op"] == "read" and r["request_phase"] == "decode" for r in rows)
    assert all(int(r["bytes"]) == 4096 for r in rows)


@pytest.mark.parametrize(
    "name", ["t.csv.xz", "t.csv.bz2", "t.csv.lz4", "t.csv.zstd", "t.csv.gzip", "t.tgz", "t.csv.zip", "t.CSV.XZ", "t.Z"]
)
def test_a_compressed_suffix_not_written_is_refused_before_anything_is_made(tmp_path, name):
    path = tmp_path / name
    with pytest.raises(ValueError, match=r"is not written here; name it \.csv \(plain\), \.csv\.zst or \.csv\.gz"):
        compression(path)
    with pytest.raises(ValueError):
        IOTraceLog(path)
    assert not path.exists()


@pytest.mark.parametrize(
    "path, tag, expect",
    [
        ("run.csv", "client-0", "run.csv.client-0"),
        ("run.csv.zst", "client-1", "run.csv.client-1.zst"),
        ("d/run.csv.gz", "rank-2", "d/run.csv.rank-2.gz"),
        ("run", "rank-0", "run.rank-0"),
    ],
)
def test_a_jobs_per_process_trace_keeps_its_compressed_suffix(path, tag, expect):
    assert tagged(path, tag) == expect and compression(expect) == compression(path)
