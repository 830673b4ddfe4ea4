"""`write_json`, the one atomic JSON writer: a reader sees the old file or the new one, never half of one, the bytes are
fsynced before the rename makes them the file's, and a non-finite float is written as null (never a bare NaN)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from replay.common.json_files import loads_json, write_json

OLD = {"run": "old", "gbps": 1.5}


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name != "r.json")


def test_a_document_is_written_whole_with_null_for_non_finite_floats(tmp_path):
    path = tmp_path / "sub" / "r.json"  # the directory is made
    write_json(path, {"nan": float("nan"), "inf": [float("inf"), -float("inf")], "ok": 0.5, "t": (1, 2)})
    text = path.read_text()
    assert text.endswith("}\n") and "NaN" not in text and "Infinity" not in text
    assert loads_json(text) == {"nan": None, "inf": [None, None], "ok": 0.5, "t": [1, 2]}
    assert _leftovers(path.parent) == []


def test_the_bytes_are_fsynced_before_the_rename(tmp_path, monkeypatch):
    calls = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (calls.append("replace"), real_replace(a, b))[1])
    write_json(tmp_path / "r.json", OLD)
    assert calls == ["fsync", "replace"]


def test_a_failure_mid_write_leaves_the_old_file_and_no_temp_file(tmp_path, monkeypatch):
    path = tmp_path / "r.json"
    write_json(path, OLD)

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space left"):
        write_json(path, {"run": "new", "rows": list(range(10_000))})
    assert json.loads(path.read_text()) == OLD
    assert _leftovers(tmp_path) == []


def test_a_document_json_cannot_write_touches_no_file(tmp_path):
    path = tmp_path / "r.json"
    write_json(path, OLD)
    with pytest.raises(TypeError):
        write_json(path, {"x": object()})
    assert json.loads(path.read_text()) == OLD and _leftovers(tmp_path) == []
    write_json(path, {"p": Path("/x")}, default=str)  # what the benchmarks' writer passes
    assert json.loads(path.read_text()) == {"p": "/x"}


def test_a_process_killed_mid_write_leaves_the_old_file(tmp_path):
    # A real crash: the child is SIGKILLed after writing the new bytes to the temp file, before the rename.
    path = tmp_path / "r.json"
    write_json(path, OLD)
    child = (
        "import os, signal, sys\n"
        "from replay.common.json_files import write_json\n"
        "os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)\n"
        "write_json(sys.argv[1], {'run': 'new', 'rows': list(range(100_000))})\n"
    )
    p = subprocess.run([sys.executable, "-c", child, str(path)], capture_output=True, text=True, timeout=60)
    assert p.returncode == -signal.SIGKILL, p.stderr
    assert json.loads(path.read_text()) == OLD
    (tmp,) = _leftovers(tmp_path)  # what the killed writer left: a temp name, never the results file's
    assert tmp.startswith(".kvtier-") and tmp.endswith(".json.tmp")


def test_exclusive_never_replaces_a_file(tmp_path):
    path = tmp_path / "r.json"
    write_json(path, OLD)
    with pytest.raises(FileExistsError):
        write_json(path, {"run": "new"}, exclusive=True)
    assert json.loads(path.read_text()) == OLD and _leftovers(tmp_path) == []
