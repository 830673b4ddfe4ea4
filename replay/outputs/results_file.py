"""A `kvtier bench` results file read back (merge, compare, check, report): validated against one model at load.

Results files are edited by people and made by other programs, so every reader gets a file checked the same way
before it reads a field: JSON with finite numbers and bounded nesting (replay/common/json_files.py), then `ResultsFile`
(a run, single or merged) or `TrialsFile` (a `--trials` document). The models hold the fields the readers use, typed
strictly (a string where a number belongs is refused, never coerced), with the bounds the writer keeps (counts,
bytes and durations are >= 0); other keys are allowed, as older and newer writers add sections. A file that fails is
one line naming the file and the field (`ResultsFileError`), never a TypeError deep inside a merge.

`load_results_file(path)` returns the document as written (a dict), so readers keep their own code; what an older
kvtier wrote as null but the file itself records is filled in (`_older_nulls`), so every reader sees what ran.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvconnector.errors import UserError
from kvconnector.validation import describe_validation_error

from ..common.json_files import loads_json, open_regular

__all__ = ["ResultsFile", "ResultsFileError", "TrialsFile", "load_results_file", "validate_results"]


class ResultsFileError(UserError, ValueError):
    """A results file kvtier will not read; the message (one line) names the file and why."""


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)


# Strict: an int or float, never a bool or a numeric string; finite (the JSON reader already refuses NaN/Infinity).
Number = Annotated[float, Field(strict=True, allow_inf_nan=False)]
Amount = Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0)]  # a count, bytes, a duration, a rate
Count = Annotated[int, Field(strict=True, ge=0)]
_ABSENT: Any = None  # default of a key that may be missing but is never null when given (defaults go unvalidated)


class Window(_Open):
    start_unix_s: Number | None = None
    end_unix_s: Number | None = None
    duration_s: Amount | None = None


class Summary(_Open):
    elapsed_time: Amount
    status: str | None = None
    num_clients: Annotated[int, Field(strict=True, ge=1)] | None = None
    total_requests: Amount | None = None
    total_tokens: Amount | None = None
    prompt_tokens: Amount | None = None
    generated_tokens: Amount | None = None
    requests_per_second: Amount | None = None
    avg_throughput_tokens_per_sec: Amount | None = None
    total_storage_io_time: Amount | None = None
    io_saturation: Amount | None = None
    window: Window | None = None
    end_to_end_latency_ms: dict[str, Amount | None] | None = None
    storage_io_latency_ms: dict[str, Amount | None] | None = None
    cache_stats: dict[str, Any] | None = None
    storage_stats: dict[str, Any] | None = None


class ModelInfo(_Open):
    name: str | None = None
    bytes_per_token: Amount | None = None


class RunConfig(_Open):
    """The keys of `config` that readers use; the whole config is checked by `kvtier merge` against BenchConfig.
    A key may be missing (older files; readers fall back), but where given it has the writer's type: never null
    where BenchConfig has no null. gpu_mem_gb: kvtier writes the size that ran; older versions wrote null for
    --gpu-mem-gb left out (16 with CUDA, 0 without): read as the file's own tiers section tells (`_older_nulls`)."""

    model: str = _ABSENT
    num_users: Count = _ABSENT
    duration: Amount = _ABSENT
    seed: int | None = None
    gpu_mem_gb: Amount | None = None
    cpu_mem_gb: Amount = _ABSENT
    storage_capacity_gb: Amount = _ABSENT
    generation_mode: str = _ABSENT
    request_model: str = _ABSENT
    size_unit: str = _ABSENT
    io_trace_log: str | None = None
    cache_dir: str | None = None


class Environment(_Open):
    hostname: str | None = None
    cache_dir: str | None = None
    cpu_model: str | None = None
    memory_bytes: Count | None = None
    block_device: str | None = None
    drive: dict[str, Any] | None = None


class TierOp(_Open):
    ops: Amount | None = None
    bytes: Amount | None = None
    latency_ms: dict[str, Amount | None] | None = None
    histograms: dict[str, str] | None = None


class Tier(_Open):
    entries: Amount | None = None
    used_bytes: Amount | None = None
    capacity_bytes: Amount | None = None
    read: TierOp | None = None
    write: TierOp | None = None


class BlockDevice(_Open):
    device: str | None = None
    reads: Amount | None = None
    read_bytes: Amount | None = None
    writes: Amount | None = None
    written_bytes: Amount | None = None
    busy_ms: Amount | None = None
    read_gbps: Amount | None = None
    write_gbps: Amount | None = None


class Process(_Open):
    """`kvtier bench`'s own process over the run's window: CPU seconds and the bytes it moved through the block
    layer (/proc/self/io)."""

    cpu_user_s: Amount | None = None
    cpu_system_s: Amount | None = None
    read_bytes: Amount | None = None
    written_bytes: Amount | None = None
    cpu_s_per_gib_moved: Amount | None = None


class TimelinePoint(_Open):
    t_s: Number
    requests: Amount | None = None
    read_bytes: Amount | None = None
    written_bytes: Amount | None = None
    users: Amount | None = None
    tiers: dict[str, dict[str, Any]] | None = None


class ResultsFile(_Open):
    """One `kvtier bench` run, or a merge of runs (`clients`: the runs it holds, each one of these)."""

    kind: None = None  # a bench result has none; documents of other commands name theirs
    status: str
    error: str | None = None
    started_at: str | None = None
    kvtier_version: str | None = None
    model: ModelInfo | None = None
    config: RunConfig | None = None
    environment: Environment | None = None
    workload: dict[str, Any] | None = None
    summary: Summary
    tiers: dict[str, Tier] | None = None
    block_device: BlockDevice | None = None
    process: Process | None = None
    request_histograms: dict[str, str] | None = None
    timeline: list[TimelinePoint] | None = None
    storage_stats: dict[str, Any] | None = None
    clients: list[ResultsFile] | None = None


class TrialSummary(_Open):
    trial: Annotated[int, Field(strict=True, ge=1)]
    status: str
    file: str | None = None
    seed: int | None = None
    exit_code: int | None = None
    summary: Summary


class TrialsFile(_Open):
    """The document of `kvtier bench --trials N`: each trial's summary and the medians."""

    kind: Literal["kvtier-bench-trials"]
    status: str
    config: RunConfig | None = None
    environment: Environment | None = None
    per_trial: list[TrialSummary]
    summary: dict[str, Any] | None = None


def validate_results(doc: Any, path: str, no_trials: str | None = None) -> dict:
    """`doc` checked against `ResultsFile` or (by its `kind`) `TrialsFile`; returned as it is, or ResultsFileError.
    `no_trials`: a reader that takes single runs only refuses a --trials document with this (after the path)."""
    if not isinstance(doc, dict):
        raise ResultsFileError(f"{path}: not a kvtier result (not a JSON object)")
    if doc.get("kind") == "kvtier-bench-trials":
        if no_trials:
            raise ResultsFileError(f"{path}: {no_trials}")
        model: type[BaseModel] = TrialsFile
    elif "kind" in doc:
        raise ResultsFileError(f"{path}: a {doc['kind']!r} document, not a kvtier bench result")
    elif "request_throughput" in doc and "ttft_ms" in doc:
        raise ResultsFileError(f"{path}: a `kvtier replay` summary, not a kvtier bench result")
    elif not isinstance(doc.get("summary"), dict) or "elapsed_time" not in doc["summary"]:
        raise ResultsFileError(f"{path}: not a kvtier bench result (no summary.elapsed_time)")
    else:
        model = ResultsFile
    try:
        model.model_validate(doc)
    except ValidationError as exc:
        raise ResultsFileError(
            f"{path}: not a valid kvtier bench result: {describe_validation_error(exc, show_input=True)}"
        ) from None
    except RecursionError:  # clients inside clients: the JSON reader bounds the depth well below this
        raise ResultsFileError(f"{path}: nested too deep") from None
    _older_nulls(doc)
    return doc


# The bytes of one size_unit (replay/synthetic/config.py SIZE_UNITS; files without size_unit read sizes in GB).
_SIZE_UNITS = {"GiB": 1 << 30, "GB": 1_000_000_000}


def _older_nulls(doc: dict) -> None:
    """Fill in what an older kvtier left null in a run's config but the file itself records: --gpu-mem-gb left out
    was null (16 with CUDA, 0 without, on whichever host ran it), and the run's tiers section holds the GPU tier it
    had (num_gpus x gpu_mem_gb) or none. A merge's sources (`clients`) likewise; a --trials document has no tiers
    and keeps its null (its trials' own files tell)."""
    for client in doc.get("clients") or []:
        _older_nulls(client)
    config, tiers = doc.get("config"), doc.get("tiers")
    if not isinstance(config, dict) or config.get("gpu_mem_gb", 0) is not None or not isinstance(tiers, dict):
        return
    gpu = next((t for name, t in tiers.items() if name == "gpu" or t.get("kind") == "gpu"), None)
    if gpu is None:
        config["gpu_mem_gb"] = 0.0
        return
    unit = _SIZE_UNITS.get(config.get("size_unit", "GB"), 1_000_000_000)
    gpus = config.get("num_gpus") if isinstance(config.get("num_gpus"), int) and config.get("num_gpus") > 0 else 1
    capacity = gpu.get("capacity_bytes")
    if isinstance(capacity, (int, float)) and not isinstance(capacity, bool):
        config["gpu_mem_gb"] = round(capacity / gpus / unit, 6)


def load_results_file(path: str, no_trials: str | None = None) -> dict:
    """Read and validate a `kvtier bench` results file (a run, a merged run or a --trials document): the document,
    or ResultsFileError (one line naming the file and what is wrong). `no_trials`: see `validate_results`."""
    try:
        with open_regular(path) as fh:
            data = fh.read()
    except FileNotFoundError:
        raise ResultsFileError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ResultsFileError(f"{path}: is a directory, not a results file") from None
    except OSError as exc:  # permission, a FIFO or device, ...
        raise ResultsFileError(f"{path}: {exc.strerror or exc}") from None
    try:
        doc = loads_json(data)
    except UnicodeDecodeError:
        raise ResultsFileError(f"{path}: not a kvtier result (not UTF-8 text)") from None
    except json.JSONDecodeError as exc:
        raise ResultsFileError(f"{path}: not a kvtier result (not JSON: {exc})") from None
    except ValueError as exc:  # json_files.InputError: NaN, Infinity, nested too deep
        raise ResultsFileError(f"{path}: not a kvtier result ({exc})") from None
    return validate_results(doc, path, no_trials)
