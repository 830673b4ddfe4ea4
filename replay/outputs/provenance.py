"""What made a result: kvtier's version and, when it runs from a git checkout, the commit and whether the tracked files
differed from it. Every committed figure JSON carries this, so a figure can be traced to the code that made it."""

from __future__ import annotations

import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

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
