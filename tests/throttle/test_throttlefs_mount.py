"""A real throttlefs mount: passthrough semantics, O_DIRECT through it, control while mounted, stopping, refusals."""

from __future__ import annotations

import mmap
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from helpers import wait_for
from throttle_helpers import needs_fuse, shm_dir

from deploy.throttle.control import ControlError
from deploy.throttle.runner import Mount

pytestmark = [pytest.mark.slow, needs_fuse]


@pytest.fixture
def dirs(tmp_path, tmp_path_factory):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    back = shm_dir(tmp_path_factory, tmp_path.name)
    yield str(mnt), back
    shutil.rmtree(back, ignore_errors=True)


def _aligned(n: int, fill: bytes = b"") -> mmap.mmap:
    buf = mmap.mmap(-1, n)
    if fill:
        buf[:] = (fill * (n // len(fill) + 1))[:n]
    return buf


def test_passthrough_with_o_direct_and_metadata(dirs):
    mnt, back = dirs
    with Mount(mnt, back) as m:
        os.mkdir(f"{mnt}/d")
        data = _aligned(1 << 20, b"kvtier-throttlefs")
        fd = os.open(f"{mnt}/d/entry.tmp", os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
        assert os.pwritev(fd, [data], 0) == 1 << 20
        os.fsync(fd)
        os.close(fd)
        os.rename(f"{mnt}/d/entry.tmp", f"{mnt}/d/entry")
        assert os.listdir(f"{mnt}/d") == ["entry"] == os.listdir(f"{back}/d")
        back_read = _aligned(1 << 20)
        fd = os.open(f"{mnt}/d/entry", os.O_RDONLY | os.O_DIRECT)
        assert os.preadv(fd, [back_read], 0) == 1 << 20
        os.close(fd)
        assert back_read[:] == data[:]
        with open(f"{back}/d/entry", "rb") as f:  # what the mount wrote is in the backing directory
            assert f.read() == data[:]
        assert os.stat(f"{mnt}/d/entry").st_ino == os.stat(f"{back}/d/entry").st_ino
        os.unlink(f"{mnt}/d/entry")
        os.rmdir(f"{mnt}/d")
        assert os.listdir(back) == []
        st = m.client.stats()
        assert st["ops"]["write"]["bytes"] == 1 << 20 and st["ops"]["read"]["bytes"] == 1 << 20
        assert st["ops"]["fsync"]["ops"] >= 1 and st["ops"]["open"]["ops"] >= 2
        # libfuse's buffers are not page-aligned, so the O_DIRECT transfers were bounced (and counted).
        assert st["direct_bounces"] >= 2
        metrics = m.client.metrics_text()
        assert 'throttlefs_bytes_total{op="read"} 1.048576e+06' in metrics
        assert 'throttlefs_setting{name="read_lat_ms"} 0.0' in metrics


def test_misaligned_o_direct_fails_as_on_a_disk(tmp_path):
    """O_DIRECT reaches the backing file: ext4 refuses a misaligned offset, so the client sees EINVAL through FUSE."""
    mnt, back = tmp_path / "mnt", tmp_path / "back"  # on the disk: tmpfs accepts any alignment
    mnt.mkdir()
    back.mkdir()
    with Mount(str(mnt), str(back)):
        with open(f"{mnt}/f", "wb") as f:
            f.write(b"x" * 8192)
        fd = os.open(f"{mnt}/f", os.O_RDONLY | os.O_DIRECT)
        try:
            with pytest.raises(OSError) as err:
                os.pread(fd, 4096, 100)  # offset not a multiple of the block size
            assert err.value.errno == 22
        finally:
            os.close(fd)


def _timed_read_ms(path: str) -> float:
    buf = _aligned(4096)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        t = time.perf_counter_ns()
        os.preadv(fd, [buf], 0)
        return (time.perf_counter_ns() - t) / 1e6
    finally:
        os.close(fd)


def test_settings_change_while_mounted(dirs):
    mnt, back = dirs
    with open(f"{back}/f", "wb") as f:
        f.write(b"y" * 4096)
    with Mount(mnt, back, ["--read-lat-ms", "0"]) as m:
        assert min(_timed_read_ms(f"{mnt}/f") for _ in range(5)) < 40
        # 100 ms asked, 60 ms checked: the throttle shortens a sleep by how late recent sleeps woke (a loaded machine)
        assert m.client.set(read_lat_ms=100)["read_lat_ms"] == 100
        assert min(_timed_read_ms(f"{mnt}/f") for _ in range(3)) >= 60
        # A bad change is refused whole with one line; what was in force stays.
        with pytest.raises(ControlError, match="not a rate"):
            m.client.set(read_lat_ms=0, read_bw="quick")
        assert m.client.settings()["read_lat_ms"] == 100
        with pytest.raises(ControlError, match="unknown setting"):
            m.client.set(latency=1)
        m.client.set(lat_ms=0, bw="2GB/s")
        s = m.client.settings()
        assert s["read_lat_ms"] == 0 and s["read_bw_bytes_s"] == 2e9 == s["write_bw_bytes_s"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_unmounts_and_reports(dirs, sig):
    mnt, back = dirs
    m = Mount(mnt, back, ["--lat-ms", "1"]).start()
    with open(f"{mnt}/f", "wb") as f:
        f.write(b"z" * 10000)
    assert os.path.ismount(mnt)
    assert m.stop(sig) == 128 + sig
    assert not os.path.ismount(mnt)
    assert f"unmounted {os.path.realpath(mnt)} on {signal.Signals(sig).name}" in m.stderr
    write_row = next(line for line in m.stderr.splitlines() if line.startswith("write"))
    assert write_row.split()[1:3] == ["1", "10000"]  # one write of 10000 bytes, counted on the way out
    assert os.path.getsize(f"{back}/f") == 10000


def test_fusermount_u_ends_it_with_exit_0(dirs):
    mnt, back = dirs
    m = Mount(mnt, back).start()
    subprocess.run(["fusermount3", "-u", mnt], check=True)
    assert m.proc.wait(30) == 0
    assert m.stop() == 0 and "unmounted" in m.stderr
    # Only kvtier's own lines: libfuse 3.14.0's "Ignoring invalid max threads value" is not printed.
    assert all(
        line.startswith(("kvtier throttlefs:", "op ", "read", "write", "fsync", "open", "mounted"))
        for line in m.stderr.splitlines()
    ), m.stderr


def test_refuses_a_mountpoint_in_use_and_a_backing_inside_it(dirs, tmp_path):
    mnt, back = dirs
    with Mount(mnt, back):
        again = subprocess.run(
            [sys.executable, "-m", "deploy.throttle", mnt, "--backing", back], capture_output=True, text=True
        )
        assert again.returncode == 2
        assert again.stderr.count("\n") == 1 and "already a mount point" in again.stderr
    inner = tmp_path / "mnt2"
    inner.mkdir()
    res = subprocess.run(
        [sys.executable, "-m", "deploy.throttle", str(inner), "--backing", str(inner)], capture_output=True, text=True
    )
    assert res.returncode == 2 and "inside the mountpoint" in res.stderr and res.stderr.count("\n") == 1


def test_concurrent_readers_all_progress(dirs):
    """Multi-threaded FUSE: 8 readers each held 200 ms are held at the same time, as the mount's own count of
    operations in flight shows (a single-threaded server would never hold more than one)."""
    mnt, back = dirs
    for i in range(8):  # a file each: readers of one page would wait on one read in the page cache
        with open(f"{back}/f{i}", "wb") as f:
            f.write(b"q" * 4096)
    with Mount(mnt, back, ["--read-lat-ms", "200"]) as m:
        script = (
            "import os,sys,threading\n"
            "def r(i):\n  fd=os.open(f'{sys.argv[1]}/f{i}',os.O_RDONLY); os.pread(fd,4096,0); os.close(fd)\n"
            "ts=[threading.Thread(target=r, args=(i,)) for i in range(8)]\n"
            "[x.start() for x in ts]; [x.join() for x in ts]\n"
        )
        subprocess.run([sys.executable, "-c", script, mnt], capture_output=True, text=True, check=True)
        stats = m.client.stats()
        assert stats["ops"]["read"]["ops"] >= 8, stats
        assert stats["peak_in_flight"] >= 2, stats


def test_deploy_script_mounts_relative_paths_of_the_caller(tmp_path):
    """deploy/throttlefs.sh (what people start) runs the same server; relative paths are the caller's."""
    (tmp_path / "m").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "seen").write_text("through the mount")
    script = os.path.join(os.path.dirname(__file__), "..", "..", "deploy", "throttlefs.sh")
    with Mount("m", "b", ["--lat-ms", "0"], launcher=[script], cwd=str(tmp_path)) as m:
        assert (tmp_path / "m" / "seen").read_text() == "through the mount"
        assert m.client.settings()["read_lat_ms"] == 0
    assert m.returncode == 143 and not (tmp_path / "m").is_mount()


def test_a_write_held_at_sigterm_is_in_the_final_stats(dirs):
    """SIGTERM while a write is held for its added latency: the server waits for it before its summary, so the table
    counts every operation the mount served (it was missing the write in flight)."""
    mnt, back = dirs
    m = Mount(mnt, back, ["--write-lat-ms", "1500"]).start()
    writer = subprocess.Popen(
        [sys.executable, "-c", f"open({f'{mnt}/f'!r}, 'wb', buffering=0).write(b'z' * 8192)"],
        stderr=subprocess.PIPE,
    )
    wait_for(lambda: m.client.stats()["in_flight"] == 1, 30, what="the write held by the mount")
    assert m.stop(signal.SIGTERM) == 128 + signal.SIGTERM
    writer.wait(30)
    write_row = next(line for line in m.stderr.splitlines() if line.startswith("write"))
    assert write_row.split()[1:3] == ["1", "8192"], m.stderr
