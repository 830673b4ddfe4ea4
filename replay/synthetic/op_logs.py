"""The run's operation logs, on the store as its op listener: `--io-trace-log` (the trace-only mode's log, in the
MLPerf reference's columns) and `--io-op-log` (kvtier's log of a real run, with host and device times). Both may be
given: the same operations go to both files."""

from __future__ import annotations

import time

from kvconnector.errors import ConfigError

from ..outputs.io_trace import IOTraceLog, set_request_phase


def attach_op_logs(store, io_trace_log: str | None, io_op_log: str | None) -> tuple[list[IOTraceLog], object]:
    """Open the logs asked for and make them the store's op listener; returns (logs, the driver's phase hook or
    None). ConfigError naming the flag when a file cannot be opened (nothing is left open then)."""
    logs: list[IOTraceLog] = []
    start_ns = time.perf_counter_ns()
    try:
        for flag, path, columns in (("--io-trace-log", io_trace_log, "mlperf"), ("--io-op-log", io_op_log, "kvtier")):
            if path:
                try:
                    logs.append(IOTraceLog(path, start_ns, columns=columns))
                except OSError as exc:
                    raise ConfigError(f"{flag} {path}: {exc.strerror or exc}") from exc
    except BaseException:
        for log in logs:
            log.close()
        raise
    if not logs:
        return logs, None
    store.op_listener = logs[0] if len(logs) == 1 else _Tee(logs)
    return logs, set_request_phase


def detach_op_logs(store, logs: list[IOTraceLog]) -> None:
    """Stop listening and close the files (what is pending is written)."""
    if store is not None:
        store.op_listener = None
    for log in logs:
        log.close()


class _Tee:
    def __init__(self, logs: list[IOTraceLog]) -> None:
        self.logs = tuple(logs)

    def __call__(self, *args) -> None:
        for log in self.logs:
            log(*args)
