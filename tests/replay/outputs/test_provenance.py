"""Provenance of a result: the commit of the checkout the code runs from, whether tracked files differ from it; for a
benchmark's results, the run too (script, arguments, host, kernel, time), written first in its JSON."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from replay.common.json_files import loads_json
from replay.outputs.provenance import provenance, run_provenance, write_run_json

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


# ---- a benchmark run's record (write_run_json: how every benchmarks/*.py writes its results) ----------------------

RUN_KEYS = {"script", "argv", "command", "host", "kernel", "machine", "cpus", "python", "written_utc"}


def test_a_run_s_record_names_the_script_its_arguments_the_host_and_the_time():
    p = run_provenance(["--json", "out dir/r.json"], script=REPO / "benchmarks" / "disk_vs_fio.py")
    assert set(p) == {"kvtier_version", "commit", "dirty"} | RUN_KEYS
    assert p["commit"] == _git(REPO, "rev-parse", "HEAD") and isinstance(p["dirty"], bool)
    assert p["script"] == "benchmarks/disk_vs_fio.py"  # as the checkout names it, run as a file or with -m
    assert p["argv"] == ["--json", "out dir/r.json"]
    assert p["command"] == "benchmarks/disk_vs_fio.py --json 'out dir/r.json'"  # pasted into a shell, it repeats
    assert p["host"] == os.uname().nodename and p["kernel"] == f"Linux {os.uname().release}"
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", p["written_utc"]), p


def test_by_default_the_record_is_this_process_s_command_line(monkeypatch):
    monkeypatch.setattr(sys, "argv", [str(REPO / "benchmarks" / "nodes.py"), "--json", "n.json"])
    p = run_provenance()
    assert (p["script"], p["argv"]) == ("benchmarks/nodes.py", ["--json", "n.json"])


def test_write_run_json_puts_the_record_first_and_writes_nan_as_null(tmp_path):
    path = tmp_path / "r.json"
    record = write_run_json(path, {"args": {"dir": Path("/var/tmp/x")}, "gbps": float("nan")}, argv=["--x"])
    text = path.read_text()
    assert "NaN" not in text
    doc = loads_json(text)
    assert list(doc) == ["provenance", "args", "gbps"]
    assert doc["provenance"] == record and doc["provenance"]["argv"] == ["--x"]
    assert doc["args"] == {"dir": "/var/tmp/x"} and doc["gbps"] is None


def test_write_run_json_refuses_a_document_with_its_own_provenance(tmp_path):
    with pytest.raises(ValueError, match="already holds a provenance"):
        write_run_json(tmp_path / "r.json", {"provenance": provenance(), "rows": []})
    assert list(tmp_path.iterdir()) == []
