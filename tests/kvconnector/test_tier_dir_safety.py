"""A tier directory: kvtier deletes only what it wrote, and refuses a non-empty directory it did not make."""

import os
import threading

import numpy as np
import pytest

from kvconnector.backend import KvtierBackend
from kvconnector.backend_config import BackendConfig
from kvconnector.entry_format import MARKER_NAME, MARKER_TEXT, file_name_for
from kvconnector.errors import ConfigError
from kvconnector.shared_tier import SharedDirTier
from kvconnector.tiers import DiskTier
from kvconnector.timed_io import IOMode

N = 10_000


def data(i):
    return memoryview(np.random.default_rng(i).integers(0, 256, N, dtype=np.uint8).tobytes())


def cfg(d, **kw):
    return BackendConfig(disk_dir=str(d), snapshot_path="", disk_capacity_gb=1e-3, io_mode="buffered", **kw)


def snapshot(d):
    """Every name under d with what it is (and a file's bytes, a link's target): what must not change."""
    out = {}
    for root, dirs, files in os.walk(d):
        for n in dirs + files:
            p = os.path.join(root, n)
            rel = os.path.relpath(p, d)
            if os.path.islink(p):
                out[rel] = ("link", os.readlink(p))
            elif os.path.isdir(p):
                out[rel] = ("dir",)
            elif os.path.isfile(p):
                out[rel] = ("file", open(p, "rb").read())
            else:
                out[rel] = ("other", os.lstat(p).st_mode)
    return out


def user_things(d, outside):
    """What a user may keep in a directory, some of it under names that look like kvtier's."""
    d.mkdir(exist_ok=True)
    (d / "notes.kv").write_text("my notes")
    (d / "report.kv.tmp.txt").write_text("my report")
    (d / "x.kv.tmp999-1").write_text("not one of our temp names")
    (d / ("A" * 32 + ".kv")).write_text("upper-case hex is not a name kvtier gives")
    (d / ("a" * 31 + ".kv")).write_text("31 digits")
    os.mkfifo(d / "pipe")
    os.mkfifo(d / file_name_for("fifo-under-our-name"))
    os.symlink(outside, d / "link-out")
    os.symlink(outside, d / file_name_for("link-under-our-name"))
    (d / "sub").mkdir()
    (d / "sub" / "keep.kv").write_text("in a subdirectory")
    (d / file_name_for("dir-under-our-name")).mkdir()
    (d / "spare-7.kv.tmp.d").mkdir()


@pytest.fixture
def outside(tmp_path):
    p = tmp_path / "outside.kv"
    p.write_text("a file outside the tier, reached through a symlink")
    return p


def test_a_non_empty_directory_without_the_marker_is_refused_and_left_as_it_was(tmp_path, outside):
    d = tmp_path / "mine"
    user_things(d, outside)
    before = snapshot(d)
    with pytest.raises(ConfigError) as exc:
        DiskTier(str(d), 1 << 20, IOMode.BUFFERED)
    msg = str(exc.value)
    assert "\n" not in msg and str(d) in msg and "not empty" in msg
    with pytest.raises(ConfigError):
        SharedDirTier(str(d), 1 << 20)
    with pytest.raises(ConfigError):  # the LMCache backend builds the same tier
        KvtierBackend(cfg(d))
    assert snapshot(d) == before and outside.read_text().startswith("a file outside")
    # One plain file is enough to refuse.
    one = tmp_path / "one"
    one.mkdir()
    (one / "notes.txt").write_text("x")
    with pytest.raises(ConfigError):
        DiskTier(str(one), 1 << 20, IOMode.BUFFERED)
    assert os.listdir(one) == ["notes.txt"]


def test_rescan_removes_only_kvtier_names_in_a_claimed_directory(tmp_path, outside):
    d = tmp_path / "tier"
    b = KvtierBackend(cfg(d))
    for i in range(3):
        assert b.put(f"k{i}", [data(i)])
    b.close()
    # Things of kvtier's a crash could leave: a torn entry, a write in flight, a spare, a probe file.
    torn = d / file_name_for("torn")
    torn.write_bytes(b"KVTR" + bytes(100))
    ours = [d / (file_name_for("w") + ".tmp123-456"), d / "spare-3.kv.tmp", d / ".kvtier-odirect-probe-1-2", torn]
    for p in ours[:3]:
        p.write_bytes(b"x")
    # ... and the user's things, dropped into the tier directory afterwards.
    user_things(d, outside)
    theirs = {k: v for k, v in snapshot(d).items() if k not in {p.name for p in ours}}
    done = threading.Event()
    result = {}

    def restart():  # a FIFO opened for reading would block forever: run it where a hang shows as a failure
        result["b"] = KvtierBackend(cfg(d))
        done.set()

    threading.Thread(target=restart, daemon=True).start()
    assert done.wait(30), "the rescan hung (it opened a FIFO?)"
    b2 = result["b"]
    try:
        rep = b2.rescan_reports[0]
        assert rep["adopted"] == 3 and rep["corrupt_removed"] == 1 and rep["stale_tmp_removed"] == 3
        assert rep["left_alone"] == 12
        assert all(not p.exists() for p in ours)
        assert snapshot(d) == theirs  # every one of the user's things, byte for byte
        assert outside.read_text().startswith("a file outside")
        assert (d / MARKER_NAME).read_text() == MARKER_TEXT
        out = memoryview(bytearray(N))
        assert b2.get_into("k1", out) and out == data(1)
    finally:
        b2.close()


def test_shared_probe_neither_follows_nor_removes_what_is_not_a_file(tmp_path, outside):
    s = tmp_path / "shared"
    t = SharedDirTier(str(s), 1 << 20)
    os.mkfifo(s / file_name_for("fifo"))
    os.symlink(outside, s / file_name_for("link"))
    (s / file_name_for("dir")).mkdir()
    done = threading.Event()
    got = {}

    def probe():
        got["r"] = [t.probe(k) for k in ("fifo", "link", "dir")]
        done.set()

    threading.Thread(target=probe, daemon=True).start()
    assert done.wait(10), "probe hung on a FIFO"
    assert got["r"] == [None, None, None]
    assert (s / file_name_for("fifo")).exists() and os.path.islink(s / file_name_for("link"))
    assert (s / file_name_for("dir")).is_dir() and outside.exists()


def test_marker_of_another_format_or_not_ours_is_refused(tmp_path):
    d = tmp_path / "t"
    DiskTier(str(d), 1 << 20, IOMode.BUFFERED).close()
    DiskTier(str(d), 1 << 20, IOMode.BUFFERED).close()  # its own directory again: fine
    (d / MARKER_NAME).write_text("kvtier tier\nentry format KVTR 99\n")
    with pytest.raises(ConfigError, match="another format"):
        DiskTier(str(d), 1 << 20, IOMode.BUFFERED)
    (d / MARKER_NAME).write_text("hello")
    with pytest.raises(ConfigError, match="not a kvtier marker"):
        DiskTier(str(d), 1 << 20, IOMode.BUFFERED)
    os.unlink(d / MARKER_NAME)
    os.symlink(tmp_path / "elsewhere", d / MARKER_NAME)
    with pytest.raises(ConfigError, match="not a regular file"):
        DiskTier(str(d), 1 << 20, IOMode.BUFFERED)


@pytest.mark.slow
def test_a_marker_cut_short_by_a_crash_is_completed(tmp_path):
    d = tmp_path / "t"
    d.mkdir()
    (d / MARKER_NAME).write_text(MARKER_TEXT[:5])  # the claiming process died mid-write
    DiskTier(str(d), 1 << 20, IOMode.BUFFERED).close()
    assert (d / MARKER_NAME).read_text() == MARKER_TEXT


def test_a_file_as_the_directory_is_one_clear_line(tmp_path):
    f = tmp_path / "f"
    f.write_text("mine")
    with pytest.raises(ConfigError, match="exists and is not a directory"):
        DiskTier(str(f), 1 << 20, IOMode.BUFFERED)
    assert f.read_text() == "mine"


def test_concurrent_instances_claim_one_shared_directory(tmp_path):
    s = tmp_path / "shared"
    s.mkdir()
    errors = []

    def start():
        try:
            SharedDirTier(str(s), 1 << 20).close()
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors and (s / MARKER_NAME).read_text() == MARKER_TEXT
