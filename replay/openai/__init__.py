"""OpenAI-compatible HTTP driver: `kvtier replay` (streaming client, schedules, sessions, server metrics, reports)."""

from replay.openai.client import RequestRecord, RequestSpec, send_streaming
from replay.openai.driver import Driver, DriverOptions, RunState
from replay.openai.schedule import arrival_offsets_ns, trace_offsets_ns

__all__ = [
    "Driver",
    "DriverOptions",
    "RequestRecord",
    "RequestSpec",
    "RunState",
    "arrival_offsets_ns",
    "send_streaming",
    "trace_offsets_ns",
]
