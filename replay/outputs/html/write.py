"""Writing the page: whole or not at all (a temp file, then one rename, as every output of kvtier)."""

from __future__ import annotations

from ..paths import atomic_path
from .kinds import ReportError, Run, run_from_doc
from .page import render_report


def write_report(path: str, runs: list[Run], title: str | None = None) -> str:
    """Render `runs` into `path`; return the path. ReportError for runs that cannot share a page, OSError from the
    file system."""
    page = render_report(runs, title)
    with atomic_path(path, suffix=".html.tmp") as tmp, open(tmp, "w", encoding="utf-8") as fh:
        fh.write(page)
    return path


def write_html(doc: dict, path: str, results_path: str | None = None) -> str:
    """--html-output of a command: the page of the document it has just written (`results_path`, shown as the run's
    source; the label is its file name). Raises OSError only: a document the report cannot read is a bug of the
    command that wrote it, and its JSON is on disk for `kvtier report` anyway."""
    source = results_path or path
    try:
        return write_report(path, [run_from_doc(doc, source)])
    except ReportError as exc:
        raise OSError(f"the report cannot read the results ({exc})") from None
