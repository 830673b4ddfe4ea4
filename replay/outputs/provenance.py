"""What made a result: kvtier's version and, when it runs from a git checkout, the commit and whether the tracked files
differed from it. Every committed figure JSON carries this, so a figure can be traced to the code that made it.

A benchmark's results file (benchmarks/*.py) records the run too (`run_provenance`): the script and its arguments,
the host and its kernel, the time the file was written. `write_run_json` is the one way a benchmark writes its JSON:
that record first, then the results, written whole or not at all (`replay.common.json_files.write_json`)."""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from ..common.json_files import write_json

SOURCE = Path(__file__).resolve().parents[2]


def kvtier_version() -> str:
    try:
        return version("kvtier")
    except PackageNotFoundError:
        return "unknown"


def _git(source: Path, *args: str) -> str | None:
    try:
        r = subprocess.run(["git", "-C", str(source), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def provenance(source: Path = SOURCE) -> dict:
    """{"kvtier_version", "commit", "dirty"}; commit and dirty are None when the source is not the top of a git
    checkout (an installed wheel; site-packages inside some other repository)."""
    top = _git(source, "rev-parse", "--show-toplevel")
    commit = _git(source, "rev-parse", "HEAD") if top and Path(top).resolve() == source.resolve() else None
    dirty = None if commit is None else bool(_git(source, "status", "--porcelain", "--untracked-files=no"))
    return {"kvtier_version": kvtier_version(), "commit": commit, "dirty": dirty}


def _script_name(script: str | os.PathLike, source: Path) -> str:
    """The script as the checkout names it (benchmarks/x.py), whether run as a file or with -m; else as given."""
    path = Path(script).resolve()
    return str(path.relative_to(source.resolve())) if path.is_relative_to(source.resolve()) else os.fspath(script)


def run_provenance(
    argv: Sequence[str] | None = None, script: str | os.PathLike | None = None, source: Path = SOURCE
) -> dict:
    """`provenance()` plus the run: "script" and "argv" (default: this process's), "command" (the line that repeats
    it), "host", "kernel" (uname's system and release), "machine", "cpus", "python", "written_utc" (now, ISO 8601)."""
    args = [str(a) for a in (sys.argv[1:] if argv is None else argv)]
    name = _script_name(sys.argv[0] if script is None else script, source)
    uname = os.uname()
    return {
        **provenance(source),
        "script": name,
        "argv": args,
        "command": shlex.join([name, *args]),
        "host": uname.nodename,
        "kernel": f"{uname.sysname} {uname.release}",
        "machine": uname.machine,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "written_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write_run_json(
    path: str | os.PathLike,
    doc: Mapping[str, Any],
    *,
    argv: Sequence[str] | None = None,
    script: str | os.PathLike | None = None,
    indent: int | None = 2,
) -> dict:
    """Write a benchmark's results: {"provenance": run_provenance(argv, script), **doc}, whole or not at all (a temp
    file beside `path`, fsynced, renamed), a non-finite float as null, an object json does not know as its str()
    (a Path in the arguments). Returns the provenance written. A `doc` that brings its own "provenance" is refused
    (ValueError): the record is made here, when the file is written, or a figure could carry another run's."""
    if "provenance" in doc:
        raise ValueError("the document already holds a provenance: write_run_json records it")
    record = run_provenance(argv, script)
    write_json(path, {"provenance": record, **doc}, indent=indent, default=str)
    return record
