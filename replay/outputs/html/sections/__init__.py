"""What the report shows for each kind of result: banners, the summary rows, the figures, configuration and system.

A row (replay/outputs/compare_rows.py) is (metric, unit, path into the document or a function of it, which direction
is better); the page puts each run's value in a column with its ratio to the first run. Rows with a path carry it on
the page (`data-path`), so a reader (and the browser test) can tell which number of the JSON a cell shows. Figures
are plotly figures, one trace per run and series, named `label: series` when several runs are overlaid.

One module per kind (a `VIEW`): _bench.py (kvtier bench; a merge and --trials share its view and add _merge.py's and
_trials.py's parts), _replay.py, _plan.py, _plan_trace.py, _sweep.py, _trace.py (a storage trace), _mlperf.py (a
run of the MLPerf harness, read for it by replay/mlperf/report_doc.py); what they share (figures, series names and
colours, `KindView`) in _shared.py.
"""

from ...compare_rows import Row, value_at
from . import _bench, _mlperf, _plan, _plan_trace, _replay, _sweep, _trace
from ._shared import KindView, overlay_style

__all__ = ["VIEWS", "KindView", "Row", "overlay_style", "value_at"]

VIEWS: dict[str, KindView] = {
    "bench": _bench.VIEW,
    "trials": _bench.VIEW,
    "merged": _bench.VIEW,
    "replay": _replay.VIEW,
    "plan": _plan.VIEW,
    "plan-trace": _plan_trace.VIEW,
    "sweep": _sweep.VIEW,
    "trace": _trace.VIEW,
    "mlperf": _mlperf.VIEW,
}
