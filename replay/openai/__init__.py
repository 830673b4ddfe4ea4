"""OpenAI-compatible HTTP driver: `kvtier replay` (streaming client, schedules, sessions, server metrics, reports)."""

from replay.openai.client import RequestRecord, RequestSpec, send_streaming
from replay.openai.driver import Driver, DriverOptions, RunState
from replay.openai.schedule import arrival_offsets_ns, trace_offsets_ns

__all__ = ["RequestRecord", "RequestSpec", "send_streaming", "Driver", "DriverOptions", "RunState",
           "arrival_offsets_ns", "trace_offsets_ns"]
