"""Where a run's own scratch directories go when the user named none: $TMPDIR when it is set (the user's choice, as
for mktemp; also how a test keeps a run's scratch apart from every other run on the machine), else /var/tmp."""

from __future__ import annotations

from replay.common.leftovers import disk_temp_dir


def test_scratch_goes_to_tmpdir_when_set_else_var_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert disk_temp_dir() == str(tmp_path)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "missing"))  # a TMPDIR that is not there is passed over
    assert disk_temp_dir() == "/var/tmp"
    monkeypatch.delenv("TMPDIR")
    assert disk_temp_dir() == "/var/tmp"
