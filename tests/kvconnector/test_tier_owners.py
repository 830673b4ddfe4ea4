"""Several processes on one tier directory: a private tier has one owner at a time (the second opener gets one clear
error naming the holder, and the directory is free again once the holder dies, however it dies); a shared tier's
rescan leaves a live writer's temp file alone whatever its age and removes a dead writer's; capacity holds, and a
rescan reports every file it removed, evictions included. Every other process here is a real one, killed for real."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from kvconnector.backend import KvtierBackend
from kvconnector.backend_config import BackendConfig
from kvconnector.entry_format import ENTRY_NAME, TEMP_NAME, file_nbytes
from kvconnector.errors import ConfigError

N = 64 << 10  # payload bytes of each entry
MB = 1 << 20

# A process that opens a backend on a directory, says so on stdout, then puts entries until it is killed.
OWNER = textwrap.dedent(
    """
    import sys, json
    from kvconnector.backend import KvtierBackend
    from kvconnector.backend_config import BackendConfig
    from kvconnector.errors import ConfigError
    kind, d, cap_gb, n, nbytes = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    cfg = {"disk_dir" if kind == "private" else "shared_dir": d, "snapshot_path": "", "io_workers": 1}
    cfg["disk_capacity_gb" if kind == "private" else "shared_capacity_gb"] = cap_gb
    cfg["io_mode" if kind == "private" else "shared_io_mode"] = "buffered"
    try:
        b = KvtierBackend(BackendConfig(**cfg))
    except ConfigError as exc:
        print("refused:", exc, flush=True)
        sys.exit(2)
    print("open", flush=True)
    i = 0
    while n < 0 or i < n:
        b.put(f"{kind}-{i}", [memoryview(bytes([i % 251]) * nbytes)])
        i += 1
    print("put", i, json.dumps(b.events_snapshot()), flush=True)
    sys.stdin.read()  # hold the directory until told (stdin closed) or killed
    b.close()
    """
)


class Owner:
    """A real process holding a backend on `d` (see OWNER)."""

    def __init__(self, kind: str, d, cap_gb: float = 0.05, puts: int = 0, nbytes: int = N) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", OWNER, kind, str(d), str(cap_gb), str(puts), str(nbytes)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.first = self.proc.stdout.readline().strip()

    @property
    def opened(self) -> bool:
        return self.first == "open"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            f.close()


@pytest.fixture
def owners():
    started: list[Owner] = []

    def start(*args, **kw) -> Owner:
        o = Owner(*args, **kw)
        started.append(o)
        return o

    yield start
    for o in started:
        o.kill()


def backend(kind: str, d, cap_gb: float = 0.05, **kw) -> KvtierBackend:
    cfg = {"disk_dir" if kind == "private" else "shared_dir": str(d), "snapshot_path": "", "io_workers": 1, **kw}
    cfg["disk_capacity_gb" if kind == "private" else "shared_capacity_gb"] = cap_gb
    cfg["io_mode" if kind == "private" else "shared_io_mode"] = "buffered"
    return KvtierBackend(BackendConfig(**cfg))


def entries(d) -> list[str]:
    return [n for n in os.listdir(d) if ENTRY_NAME.fullmatch(n)]


@pytest.mark.slow  # real processes: seconds each
@pytest.mark.parametrize(
    "first,second",
    [("private", "private"), ("private", "shared"), ("shared", "private")],
)
@pytest.mark.parametrize("death", [signal.SIGKILL, signal.SIGTERM, None], ids=["SIGKILL", "SIGTERM", "close"])
def test_a_private_tier_has_one_owner_at_a_time(tmp_path, owners, first, second, death):
    """The second opener gets one line naming the holder's pid; once the holder is gone (killed, terminated or
    closed) the directory opens again and its entries are served."""
    d = tmp_path / "tier"
    holder = owners(first, d, puts=5)
    assert holder.opened, holder.proc.stderr.read()
    assert holder.proc.stdout.readline().startswith("put 5")
    with pytest.raises(ConfigError) as err:
        backend(second, d)
    msg = str(err.value)
    assert f"in use by pid {holder.proc.pid}" in msg and "\n" not in msg
    # A third process is refused the same way (and the holder stays the one named).
    third = owners(second, d)
    assert not third.opened and f"pid {holder.proc.pid}" in third.first
    if death is None:
        holder.proc.stdin.close()  # the holder closes its backend and exits
        assert holder.proc.wait(30) == 0
    else:
        holder.proc.send_signal(death)
        holder.proc.wait(30)
    b = backend(first, d)
    try:
        assert b.rescan_reports[0]["adopted"] == 5 and b.lookup(f"{first}-4")
    finally:
        b.close()


@pytest.mark.slow  # real processes: seconds each
@pytest.mark.parametrize("processes", [2, 3, 5])
def test_processes_opening_one_new_private_tier_at_once_leave_one_owner_within_capacity(tmp_path, owners, processes):
    """Several processes open one new directory at the same moment and put until they are killed: exactly one
    owns it, the others are refused with one line, no put of the owner fails, and the directory stays within the
    capacity (before, each process accounted for its own entries and the others' start-up rescans removed writes in
    flight)."""
    d = tmp_path / "tier"
    cap_gb = 2 * MB / (1 << 30)
    procs = [owners("private", d, cap_gb=cap_gb, puts=200) for _ in range(processes)]
    opened = [p for p in procs if p.opened]
    assert len(opened) == 1, [p.first for p in procs]
    (owner,) = opened
    for p in procs:
        if p is not owner:
            assert p.first.startswith("refused: cache dir") and f"pid {owner.proc.pid}" in p.first
    line = owner.proc.stdout.readline()
    assert line.startswith("put 200"), owner.proc.stderr.read()
    assert '"store_errors"' not in line and '"store_ok": 200' in line
    owner.kill()
    on_disk = sum(os.path.getsize(d / n) for n in entries(d))
    assert 0 < on_disk <= cap_gb * (1 << 30) * file_nbytes(N) / N


@pytest.mark.slow  # real processes: seconds each
@pytest.mark.parametrize("old_cap_mb,new_cap_mb", [(4, 1), (4, 2), (2, 0.5), (3, 3)])
def test_a_rescan_reports_every_file_it_removed(tmp_path, owners, old_cap_mb, new_cap_mb):
    """A tier filled by a process that is then killed is reopened with the same or less room: the files removed are
    the ones the report counts (evictions made while adopting included), and the directory is within capacity."""
    d = tmp_path / "tier"
    o = owners("private", d, cap_gb=old_cap_mb / 1024, puts=80)
    assert o.opened and o.proc.stdout.readline().startswith("put 80")
    o.kill()
    before = len(entries(d))
    b = backend("private", d, cap_gb=new_cap_mb / 1024)
    try:
        rep = b.rescan_reports[0]
        after = len(entries(d))
        removed = rep["corrupt_removed"] + rep["no_room_removed"] + rep["duplicate_removed"] + rep["evicted"]
        assert before - after == removed, rep
        assert after == len(b.store) and rep["adopted"] - rep["evicted"] == after, rep
        assert after * N <= new_cap_mb * MB
        if new_cap_mb < old_cap_mb:
            assert rep["evicted"] + rep["no_room_removed"] > 0
    finally:
        b.close()


def _wait_stopped(pid: int) -> None:
    """Until every thread of `pid` is stopped (an I/O thread in a system call stops when the call returns)."""
    while True:
        states = set()
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                states.add(f.read().rsplit(")", 1)[1].split()[0])
        if states == {"T"}:
            return
        time.sleep(0.001)


def _temp_of_a_stopped_writer(d, owners, deadline_s: float = 60) -> tuple[Owner, str]:
    """A writer process stopped (SIGSTOP) in the middle of a put into the shared tier: its temp file is there, and
    it holds it. Large entries make the window wide; a stop that missed it is retried."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        w = owners("shared", d, cap_gb=0.5, puts=-1, nbytes=24 * MB)
        assert w.opened
        while time.monotonic() < end:
            temps = [n for n in os.listdir(d) if TEMP_NAME.fullmatch(n)]
            if temps:
                w.proc.send_signal(signal.SIGSTOP)
                _wait_stopped(w.proc.pid)  # a signal is delivered when the process next runs, not at kill()
                # Past its first bytes (so past the lock, taken right after the create): a write in flight.
                if os.path.exists(d / temps[0]) and os.path.getsize(d / temps[0]) > 0:
                    return w, temps[0]
                w.proc.send_signal(signal.SIGCONT)
    pytest.fail("no write in flight was caught")


@pytest.mark.slow  # real processes: seconds each
@pytest.mark.parametrize("age_s", [5, 3600, 30 * 86400])
def test_a_shared_rescan_leaves_a_live_writers_temp_and_removes_a_dead_ones(tmp_path, owners, age_s):
    d = tmp_path / "shared"
    d.mkdir()
    writer, temp = _temp_of_a_stopped_writer(d, owners)
    old = time.time() - age_s
    os.utime(d / temp, (old, old))  # a write slower than the stale age (a stalled network filesystem)
    b = backend("shared", d, shared_stale_tmp_s=1.0)
    try:
        rep = b.rescan_reports[0]
        assert (d / temp).exists() and rep["live_tmp_left"] == 1 and rep["stale_tmp_removed"] == 0, rep
    finally:
        b.close()
    writer.kill()  # SIGKILL of a stopped process: its locks go with it
    b = backend("shared", d, shared_stale_tmp_s=1.0)
    try:
        rep = b.rescan_reports[0]
        assert not (d / temp).exists() and rep["stale_tmp_removed"] == 1 and rep["live_tmp_left"] == 0, rep
    finally:
        b.close()


@pytest.mark.parametrize("key", ["disk_dir", "shared_dir"])
@pytest.mark.parametrize("value", ["", " ", "\t"])
def test_an_empty_tier_directory_is_an_error_not_the_current_directory(tmp_path, monkeypatch, key, value):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        BackendConfig.validated({key: value, "snapshot_path": ""})
    assert key in str(err.value) and "empty" in str(err.value)
    assert os.listdir(tmp_path) == []


FORKER = """
import os, sys, time
from kvconnector.backend import KvtierBackend
from kvconnector.backend_config import BackendConfig
b = KvtierBackend(BackendConfig(disk_dir=sys.argv[1], disk_capacity_gb=0.01, snapshot_path="", io_mode="buffered"))
if os.fork() == 0:  # the child inherits the descriptor holding the lock
    time.sleep(600)
    os._exit(0)
print("forked", flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_a_lock_inherited_by_a_forked_child_names_the_ended_owner(tmp_path):
    d = tmp_path / "tier"
    p = subprocess.Popen([sys.executable, "-c", FORKER, str(d)], stdout=subprocess.PIPE, text=True)
    child = None
    try:
        assert p.stdout.readline().strip() == "forked"
        (child,) = [int(c) for c in open(f"/proc/{p.pid}/task/{p.pid}/children").read().split()]
        p.kill()
        p.wait(30)
        with pytest.raises(ConfigError, match=rf"in use by pid {p.pid} \(ended; a process it forked\)"):
            backend("private", d)
    finally:
        p.kill()
        p.wait(30)
        p.stdout.close()
        if child is not None:
            os.kill(child, signal.SIGKILL)
    end = time.monotonic() + 30
    while True:
        try:
            backend("private", d).close()
            break
        except ConfigError:
            assert time.monotonic() < end
            time.sleep(0.1)
