"""Writing the page: whole or not at all (a temp file, then one rename, as every output of kvtier)."""

from __future__ import annotations

from ..paths import atomic_path
from .kinds import Run
from .page import render_report


def write_report(path: str, runs: list[Run], title: str | None = None) -> str:
    """Render `runs` into `path`; return the path. ReportError for runs that cannot share a page, OSError from the
    file system."""
    page = render_report(runs, title)
    with atomic_path(path, suffix=".html.tmp") as tmp, open(tmp, "w", encoding="utf-8") as fh:
        fh.write(page)
    return path
