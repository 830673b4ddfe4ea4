"""`kvtier bench` end to end in-process and as a subprocess: results schema, honest accounting, user errors."""

import errno
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import wait_for

from kvconnector.histogram import LatencyHistogram
from replay.synthetic.cli import main
from replay.synthetic.sysinfo import block_device_of

KVTIER = [sys.executable, "-m", "replay.cli", "bench"]


@pytest.fixture
def small_model(tmp_path):
    # 4 layers x 2 x 2 heads x 64 x 2 bytes = 2 KiB per token: entries of 1-50 MiB, quick on any disk.
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps({"num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 2, "hidden_size": 128})
    )
    return str(path)


def run_bench(tmp_path, *extra):
    out = tmp_path / "r.json"
    rc = main(["--no-progress", "--output", str(out), "--cache-dir", str(tmp_path / "cache"), *extra])
    return rc, (json.loads(out.read_text()) if out.exists() else None)


@pytest.mark.slow
def test_short_run_results_schema_and_accounting(tmp_path, small_model, capsys):
    rc, doc = run_bench(
        tmp_path,
        "--model",
        small_model,
        "--duration",
        "3",
        "--num-users",
        "6",
        "--cpu-mem-gb",
        "0.02",
        "--storage-capacity-gb",
        "0.3",
        "--seed",
        "3",
        "--gpu-mem-gb",
        "0",
    )
    assert rc == 0, capsys.readouterr().err
    s = doc["summary"]
    assert doc["status"] == "completed" and s["total_requests"] > 0
    # the window is honoured: the duration ended it and in-flight operations only finish (the margin is for a loaded
    # machine; how late a run ends is a figure for benchmarks, not a test)
    assert s["window"]["ended_by"] == "duration" and 3.0 <= s["elapsed_time"] < 3.0 + 10.0
    for key in ("end_to_end_latency_ms", "storage_io_latency_ms"):
        assert set(s[key]) >= {"mean", "p50", "p95", "p99", "p999"}
        assert s[key]["p50"] <= s[key]["p99"]
    cs = s["cache_stats"]
    assert cs["cpu_entries"] + cs["storage_entries"] > 0
    assert cs["tier_storage_kv_bytes_written_gb"] > 0 and cs["tier_storage_kv_bytes_read_gb"] > 0
    disk = doc["tiers"]["disk"]
    # host and device split, and the histograms decode to the reported counts
    assert disk["read"]["device_ms"]["p50"] > 0 and disk["write"]["host_ms"]["count"] == disk["write"]["ops"]
    assert LatencyHistogram.decode(disk["read"]["histograms"]["total"]).count == disk["read"]["ops"]
    # bandwidth is bytes over elapsed time
    assert cs["tier_storage_read_bandwidth_gbps"] == pytest.approx(
        disk["read"]["bytes"] / 1e9 / s["elapsed_time"], rel=0.01
    )
    # waterfall: the small CPU tier overflowed into the disk tier, which never exceeded its capacity
    assert doc["tiers"]["cpu"]["events"].get("demotions_out", 0) > 0
    assert disk["used_bytes"] <= disk["capacity_bytes"]
    # the device's own counters saw the reads (O_DIRECT reached the block device); no device (tmpfs): no counters
    dev = block_device_of(str(tmp_path))  # the cache directory's filesystem (the run removed the directory it made)
    if dev is None:
        assert doc["block_device"] is None
    else:
        assert doc["block_device"]["device"] == dev
        assert doc["block_device"]["read_bytes"] >= 0.9 * disk["read"]["bytes"] > 0
        # this process's own block I/O is the disk tier's (O_DIRECT: every byte goes to the device), and its CPU per
        # GiB is that CPU over those bytes
        proc = doc["process"]
        assert proc["read_bytes"] >= 0.9 * disk["read"]["bytes"] and proc["written_bytes"] >= disk["write"]["bytes"]
        cpu = proc["cpu_user_s"] + proc["cpu_system_s"]
        moved = (proc["read_bytes"] + proc["written_bytes"]) / 2**30
        assert cpu > 0 and proc["cpu_s_per_gib_moved"] == pytest.approx(cpu / moved, rel=0.01)
    assert doc["config"]["seed"] == 3 and doc["environment"]["filesystem"]["fs_type"]
    assert doc["timeline"] and doc["timeline"][-1]["requests"] == s["total_requests"]
    assert not (tmp_path / "cache").exists()  # the run's entries are removed, and the directory it made for them
    out = capsys.readouterr().out
    assert "request latency" in out and "tier operations" in out and "this process: CPU, block I/O" in out


@pytest.mark.slow
def test_max_requests_stops_the_run(tmp_path, small_model):
    rc, doc = run_bench(
        tmp_path,
        "--model",
        small_model,
        "--duration",
        "60",
        "--num-users",
        "4",
        "--max-requests",
        "5",
        "--gpu-mem-gb",
        "0",
    )
    assert rc == 0 and 5 <= doc["summary"]["total_requests"] <= 8 and doc["summary"]["elapsed_time"] < 30


@pytest.mark.slow
def test_generation_mode_adds_generation_time(tmp_path, small_model):
    rc, doc = run_bench(
        tmp_path,
        "--model",
        small_model,
        "--duration",
        "6",  # a document-profile request simulates up to 1.6 s of generation: room for several to finish
        "--num-users",
        "4",
        "--seed",
        "3",
        "--generation-mode",
        "fast",
        "--gpu-mem-gb",
        "0",
        # kvtier's request model: every request decodes (the reference's leaves >= 10k-token requests prefill only,
        # with no generation time, which would put the median at 0)
        "--request-model",
        "kvtier",
    )
    assert rc == 0
    gen = doc["summary"]["generation_latency_ms"]
    # fast = 2 ms per generated token; profiles generate at least 50 tokens
    assert gen["count"] > 0 and gen["p50"] >= 50 * 2 * 0.9


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--model", "gpt-9"], "unknown model"),
        (["--num-users", "-3"], "--num-users"),
        (["--cpu-mem-gb", "99999"], "--cpu-mem-gb"),
        (["--storage-capacity-gb", "9999999"], "--storage-capacity-gb"),
        (["--gpu-mem-gb", "4"], "CUDA"),
        (["--cache-dir", "/proc/kvtier"], "cache-dir"),
    ],
)
@pytest.mark.slow
def test_user_errors_are_one_line_and_exit_2(args, needle, tmp_path):
    if "CUDA" == needle:
        from kvconnector.tiers import cuda_torch

        if cuda_torch() is not None:
            pytest.skip("a CUDA device is present")
    base = ["--duration", "1", "--no-progress", "--output", str(tmp_path / "x.json")]
    if "--cache-dir" not in args:
        base += ["--cache-dir", str(tmp_path / "c")]
    p = subprocess.run(KVTIER + base + args, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    assert needle in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.json").exists()


def wait_for_entries(cache: "os.PathLike", timeout_s: float = 60) -> None:
    """Until the run's disk tier holds an entry: the run window has begun (set-up writes none in this config)."""
    wait_for(
        lambda: any(f.endswith(".kv") for _, _, files in os.walk(cache) for f in files),
        timeout_s=timeout_s,
        interval_s=0.2,
        what="the run's first entry",
    )


def start_bench(model: str, cache, out, *extra: str) -> subprocess.Popen:
    """`kvtier bench` as a real process: 4 users, a 60 s window, no GPU tier, a disk tier under `cache`."""
    args = ["--model", model, "--duration", "60", "--num-users", "4", "--no-progress", "--gpu-mem-gb", "0"]
    args += ["--cache-dir", str(cache), "--output", str(out), *extra]
    return subprocess.Popen(KVTIER + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_writes_partial_results_and_cleans_up(tmp_path, small_model, sig):
    out, cache = tmp_path / "r.json", tmp_path / "c"
    p = start_bench(small_model, cache, out, "--cpu-mem-gb", "0")
    wait_for_entries(cache)
    p.send_signal(sig)
    _, stderr = p.communicate(timeout=60)
    assert p.returncode == 128 + sig, stderr
    doc = json.loads(out.read_text())
    assert doc["status"] == "interrupted" and doc["stop_signal"] == sig.name and doc["summary"]["elapsed_time"] < 50
    assert "Traceback" not in stderr and "partial results" in stderr
    assert not cache.exists()  # the run's directory is gone, and the cache directory the run made


@pytest.mark.slow
@pytest.mark.root(reason="mounting a small tmpfs")
def test_filesystem_full_mid_run_fails_cleanly_with_partial_results(tmp_path, small_model):
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96m", "tmpfs", str(mnt)], check=True)
    try:
        out = tmp_path / "r.json"
        p = start_bench(small_model, mnt, out, "--cpu-mem-gb", "0")
        wait_for_entries(mnt)  # the run has begun (not still setting up)
        # Someone else fills the filesystem under the running benchmark. Written until ENOSPC, not one fallocate of
        # the free space: the run writes between statvfs and fallocate, and a fallocate that does not fit takes nothing.
        with open(mnt / "filler", "wb", buffering=0) as f:
            for chunk in (b"\0" * 2**20, b"\0" * 4096):
                try:
                    while True:
                        f.write(chunk)
                except OSError as e:
                    assert e.errno == errno.ENOSPC, e
        _, stderr = p.communicate(timeout=60)
        assert p.returncode == 1, stderr
        assert "filesystem full" in stderr and "Traceback" not in stderr
        doc = json.loads(out.read_text())
        assert doc["status"] == "failed" and doc["tiers"]["disk"]["events"].get("enospc", 0) >= 1
    finally:
        subprocess.run(["umount", "-l", str(mnt)])


@pytest.mark.slow  # a real process through imports and set-up, and a 10 s bound on its stop
def test_sigterm_during_precondition_stops_promptly_and_removes_its_files(tmp_path, small_model):
    """Set-up I/O (here 20 GB of preconditioning by one writer) stops within one write when SIGTERM comes."""
    out, cache = tmp_path / "r.json", tmp_path / "c"
    precondition = ["--precondition", "--precondition-size-gb", "20", "--precondition-threads", "1"]
    p = start_bench(small_model, cache, out, "--io-mode", "buffered", *precondition)

    def preconditioning() -> bool:
        assert p.poll() is None, p.stderr.read()
        return any(f.startswith("precondition-") for _, _, fs in os.walk(cache) for f in fs)

    wait_for(preconditioning, timeout_s=60, interval_s=0.1, what="the first precondition file")
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    _, stderr = p.communicate(timeout=120)
    assert time.monotonic() - t0 < 10, "set-up went on after SIGTERM"
    assert p.returncode == 143 and "interrupted during set-up (SIGTERM)" in stderr, stderr
    assert "Traceback" not in stderr and not out.exists()
    assert not cache.exists()
