"""Which kind of result a file holds, checked against the shape the report reads before anything is drawn.

Every command writes its own document (a storage trace is bpftrace's output, text or JSON lines); the kind is told
by the keys each writer sets (`kind` where there is one) and then validated with a pydantic model of just the parts
the report uses: a file that looks like a kind but lacks or mistypes what the report reads is refused with one line
naming the field, never half drawn. Extra keys are allowed (older and newer writers add sections). JSON is read as
every results reader reads it (replay/common/json_files.py: finite numbers, bounded nesting), and a `kvtier bench`
result (a run, a merge, --trials) passes replay/outputs/results_file.py's check first, as for merge, compare and check.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from kvconnector.errors import UserError
from kvconnector.validation import describe_validation_error
from replay.common.json_files import loads_json, open_regular

from .._common import default_labels
from ..results_file import ResultsFileError, validate_results

# A report's section for each kind, in the words of the command that writes it.
KIND_TITLES = {
    "bench": "kvtier bench",
    "trials": "kvtier bench --trials",
    "merged": "kvtier merge",
    "replay": "kvtier replay",
    "plan": "kvtier plan",
    "plan-trace": "kvtier plan --trace",
    "sweep": "kvtier sweep",
    "trace": "storage trace (tracing/storage_latency_stack.sh)",
    "mlperf": "MLPerf Storage KV cache run (kvtier mlperf run / mlpstorage)",
}
# Kinds whose runs share a summary table (kvtier compare's rows) and can be overlaid in one report.
FAMILY = {"bench": "bench", "trials": "bench", "merged": "bench"}


class ReportError(UserError):
    """A file the report cannot read: one line for the user."""


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


Number = float | int


class _Latency(_Open):
    count: int
    p50: Number


class _BenchSummary(_Open):
    elapsed_time: Number
    requests_per_second: Number
    end_to_end_latency_ms: _Latency


class _Sample(_Open):
    """One timeline sample: cumulative counters at t_s (replay/outputs/_common.timeline_series takes rates of them)."""

    t_s: Number
    requests: Number = 0
    read_bytes: Number = 0
    written_bytes: Number = 0
    tiers: dict[str, dict[str, Number | None]] = {}


class BenchDoc(_Open):
    status: str
    summary: _BenchSummary
    tiers: dict[str, dict[str, Any]] = {}
    timeline: list[_Sample] = []
    request_histograms: dict[str, str] = {}
    environment: dict[str, Any] = {}
    config: dict[str, Any] = {}


class _TrialsSummary(_Open):
    elapsed_time: Number
    requests_per_second: Number


class _Trial(_Open):
    trial: int
    status: str


class TrialsDoc(_Open):
    kind: str
    status: str
    trials_requested: int
    trials_completed: int
    summary: _TrialsSummary
    per_trial: list[_Trial]
    aggregate: dict[str, dict[str, Any]]


class _ReplayRound(_Open):
    round: int
    hit_rate: Number | None
    ideal_hit_rate: Number | None


class ReplayDoc(_Open):
    completed: int
    failed: int
    request_throughput: Number
    ttft_ms: _Latency
    e2el_ms: _Latency
    histograms: dict[str, str] = {}
    rounds: list[_ReplayRound] | None = None


class _PlanRound(_Open):
    round: int
    predicted_hit_rate: Number
    ideal_hit_rate: Number
    bytes_written_total: Number | None = None


class _PlanConfig(_Open):
    name: str
    rounds: list[_PlanRound]
    collapse_round: int | None


class PlanDoc(_Open):
    kind: str
    status: str
    workload: dict[str, Any]
    configurations: list[_PlanConfig]


class _CurvePoint(_Open):
    capacity_tokens: Number
    hit_rate: Number


class _TraceTier(_Open):
    name: str
    capacity_tokens: Number
    hit_rate: Number


class _PlanTrace(_Open):
    name: str
    requests: int
    prompt_tokens: int
    max_hit_rate: Number
    tiers: list[_TraceTier]
    curve: list[_CurvePoint]


class PlanTraceDoc(_Open):
    kind: str
    status: str
    traces: list[_PlanTrace]


class _SweepPoint(_Open):
    bw: str
    bw_bytes_s: Number
    lat_ms: Number
    runs: int
    metrics: dict[str, Number | None]
    relative: dict[str, Number | None]


class _SweepRun(_Open):
    exit_code: int


class SweepDoc(_Open):
    kind: str
    driver: str
    status: str
    grid: dict[str, Any]
    runs: list[_SweepRun]
    points: list[_SweepPoint]
    reference: dict[str, Number | None] | None = None


class _MlperfOption(_Open):
    aggregated_read_bandwidth_gbps: Number
    aggregated_storage_throughput_tokens_per_sec: Number
    partial_failure: bool = False


class _MlperfSummary(_Open):
    total_ranks: int
    options: dict[str, _MlperfOption]


class _MlperfRank(_Open):
    option: int
    trial: int
    rank: int
    path: str


class _MlperfFinding(_Open):
    rule: str
    section: str
    verdict: str
    detail: str


class MlperfDoc(_Open):
    """A run of the MLPerf harness as replay/mlperf/report_doc.py reads it (run directory, summary, rank files and
    the rules' findings) for the page: made by `kvtier report RUN_DIR`, never a file of its own."""

    kind: str
    run_dir: str
    summary: _MlperfSummary
    ranks: list[_MlperfRank]
    findings: list[_MlperfFinding]
    failing: list[str]
    record: dict[str, Any]


MODELS: dict[str, type[BaseModel]] = {
    "bench": BenchDoc,
    "merged": BenchDoc,
    "trials": TrialsDoc,
    "replay": ReplayDoc,
    "plan": PlanDoc,
    "plan-trace": PlanTraceDoc,
    "sweep": SweepDoc,
    "mlperf": MlperfDoc,
}


@dataclass
class Run:
    """One input of the report: its label, path, kind, and the document (or, for a trace, the parsed trace)."""

    label: str
    path: str
    kind: str
    doc: Any
    raw: str = ""  # a trace's text, for its health lines


def kind_of(doc: dict) -> str | None:
    """The kind a results document claims by its keys, or None."""
    declared = doc.get("kind")
    if declared == "kvtier-bench-trials":
        return "trials"
    if declared == "kvtier plan":
        return "plan"
    if declared == "kvtier plan --trace":
        return "plan-trace"
    if declared == "kvtier sweep":
        return "sweep"
    if declared == "kvtier mlperf run":
        return "mlperf"
    if declared is not None:
        return None
    if "request_throughput" in doc and "ttft_ms" in doc:
        return "replay"
    if isinstance(doc.get("summary"), dict) and "elapsed_time" in doc["summary"]:
        return "merged" if isinstance(doc.get("clients"), list) else "bench"
    return None


def _read_text(path: str) -> str:
    try:
        with open_regular(path) as fh:
            data = fh.read()
    except FileNotFoundError:
        raise ReportError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ReportError(f"{path}: is a directory, not a results file") from None
    except OSError as exc:
        raise ReportError(f"{path}: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ReportError(f"{path}: not a kvtier result (not text)") from None


def _load_trace(path: str, text: str) -> Run | None:
    # imported here: tracing/ stands alone and the other kinds do not need it
    from tracing.histparse import TraceParseError, parse_trace

    try:
        trace = parse_trace(text)
    except TraceParseError:
        return None
    if not trace.maps:
        return None
    return Run(label="", path=path, kind="trace", doc=trace, raw=text)


def load_run(path: str) -> Run:
    """Read and validate one input; ReportError (one line) for anything the report cannot draw."""
    text = _read_text(path)
    try:
        doc = loads_json(text)
    except json.JSONDecodeError:
        doc = None
    except ValueError as exc:  # json_files.InputError: NaN, Infinity, nested too deep
        raise ReportError(f"{path}: not a kvtier result ({exc})") from None
    if not isinstance(doc, dict):  # bpftrace's JSON output is one object per line; its text output is not JSON
        run = _load_trace(path, text)
        if run is None:
            raise ReportError(f"{path}: not a kvtier result (not a JSON object, nor a storage trace)")
        return run
    kind = kind_of(doc)
    if kind is None and isinstance(doc.get("options"), dict) and "total_ranks" in doc:
        raise ReportError(f"{path}: a kvcache run summary is reported alone (or give its run directory)")
    if kind is None:
        what = f"kind {doc['kind']!r}" if isinstance(doc.get("kind"), str) else "keys " + ", ".join(list(doc)[:5])
        raise ReportError(f"{path}: not a kvtier result the report knows ({what})")
    _validate(doc, kind, path)
    return Run(label="", path=path, kind=kind, doc=doc)


def _validate(doc: dict, kind: str, path: str) -> None:
    try:
        if FAMILY.get(kind) == "bench":
            validate_results(doc, path)
        MODELS[kind].model_validate(doc)
    except ResultsFileError as exc:
        raise ReportError(str(exc)) from None
    except ValidationError as exc:
        raise ReportError(
            f"{path}: a {KIND_TITLES[kind]} result the report cannot read: {describe_validation_error(exc)}"
        ) from None


def run_from_doc(doc: dict, path: str, label: str | None = None) -> Run:
    """A document a command has just written, checked as `load_run` checks a file (for --html-output)."""
    kind = kind_of(doc)
    if kind is None:
        raise ReportError(f"{path}: not a kvtier result the report knows")
    _validate(doc, kind, path)
    return Run(label=label or default_labels([path])[0], path=path, kind=kind, doc=doc)
