"""The one atomic writer and the one quiet unlink (kvconnector.files), on real files."""

import os

import pytest

from kvconnector.files import atomic_path, unlink_quietly


def leftovers(d):
    return sorted(n for n in os.listdir(d) if n.startswith(".kvtier-"))


def test_a_file_is_replaced_whole_or_left_as_it_was(tmp_path):
    path = tmp_path / "out.json"
    path.write_text("old")
    with pytest.raises(RuntimeError), atomic_path(path) as tmp:
        with open(tmp, "w") as f:
            f.write("half of the new")
        assert path.read_text() == "old"  # nothing visible before the block ends
        raise RuntimeError("the writer failed midway")
    assert path.read_text() == "old" and leftovers(tmp_path) == []
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        f.write("new")
    assert path.read_text() == "new" and leftovers(tmp_path) == []


def test_exclusive_never_replaces_and_missing_parents_are_made(tmp_path):
    path = tmp_path / "a" / "b" / "out.txt"
    with atomic_path(path, exclusive=True) as tmp, open(tmp, "w") as f:
        f.write("first")
    with pytest.raises(FileExistsError), atomic_path(path, exclusive=True) as tmp, open(tmp, "w") as f:
        f.write("second")
    assert path.read_text() == "first" and leftovers(path.parent) == []


def test_mode_follows_the_umask_unless_given(tmp_path):
    old = os.umask(0o027)
    try:
        with atomic_path(tmp_path / "plain") as tmp, open(tmp, "w") as f:
            f.write("x")
        with atomic_path(tmp_path / "private", mode=0o600) as tmp, open(tmp, "w") as f:
            f.write("x")
    finally:
        os.umask(old)
    # mkstemp makes 0600 files; the default is what open() would have given under this umask.
    assert os.stat(tmp_path / "plain").st_mode & 0o777 == 0o640
    assert os.stat(tmp_path / "private").st_mode & 0o777 == 0o600


def test_unlink_quietly_removes_and_tolerates_a_missing_file(tmp_path):
    p = tmp_path / "f"
    p.write_text("x")
    unlink_quietly(p)
    assert not p.exists()
    unlink_quietly(p)  # already gone: not an error
    unlink_quietly(tmp_path / "no" / "such" / "dir")
