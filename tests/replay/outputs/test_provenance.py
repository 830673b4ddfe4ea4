"""Provenance of a result: the commit of the checkout the code runs from, whether tracked files differ from it."""

import subprocess
from pathlib import Path

from replay.outputs.provenance import provenance

REPO = Path(__file__).resolve().parents[3]


def _git(cwd, *args):
    return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, check=True).stdout.strip()


def test_this_checkout_s_commit():
    p = provenance()
    assert p["commit"] == _git(REPO, "rev-parse", "HEAD")
    assert p["kvtier_version"] not in ("", "unknown")


def test_a_changed_tracked_file_makes_it_dirty_and_a_new_file_does_not(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    _git(tmp_path, "add", "a.py")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = _git(tmp_path, "rev-parse", "HEAD")
    (tmp_path / "notes.txt").write_text("untracked\n")
    assert provenance(tmp_path) == {"kvtier_version": provenance()["kvtier_version"], "commit": head, "dirty": False}
    (tmp_path / "a.py").write_text("x = 2\n")
    assert provenance(tmp_path)["dirty"] is True


def test_no_commit_outside_a_checkout_or_below_its_top(tmp_path):
    assert provenance(tmp_path)["commit"] is None
    _git(tmp_path, "init", "-q")
    (tmp_path / "pkg").mkdir()
    # an installed package inside somebody else's repository is not that repository's code
    assert provenance(tmp_path / "pkg") == {**provenance(tmp_path / "pkg"), "commit": None, "dirty": None}
