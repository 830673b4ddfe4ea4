"""`kvtier report`: one self-contained HTML page per run, or several runs of one kind overlaid with ratios.

    kvtier report RUN.json [RUN2.json ...] -o report.html
    kvtier bench|replay|plan|sweep ... --html-output report.html     (the same page, written at the end of the run)

Kinds: kvtier bench (and --trials, and kvtier merge's output), kvtier replay, kvtier plan (and --trace), kvtier
sweep, and a storage trace of tracing/storage_latency_stack.sh (its text or JSON output). `kinds` tells and
validates them, `sections` says what each shows, `page` lays it out with plotly's JavaScript inlined.
"""

from .kinds import KIND_TITLES, ReportError, Run, default_labels, load_run, run_from_doc
from .page import render_report
from .write import write_html, write_report

__all__ = [
    "KIND_TITLES",
    "ReportError",
    "Run",
    "default_labels",
    "load_run",
    "render_report",
    "run_from_doc",
    "write_html",
    "write_report",
]
