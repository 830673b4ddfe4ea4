"""What the in-process driver measures: per-request and per-QoS-class histograms and sums (no per-request lists),
and the outcome of a run."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvconnector.histogram import LatencyHistogram


def _hist() -> LatencyHistogram:
    return LatencyHistogram()


@dataclass
class ClassStats:
    """Per-QoS-class latencies. Service latency = end to end minus simulated generation: what storage and queueing
    cost the request, which is what the class's SLA is judged on."""

    requests: int = 0
    end_to_end: LatencyHistogram = field(default_factory=_hist)
    service: LatencyHistogram = field(default_factory=_hist)


@dataclass
class RequestStats:
    """Request-level measurements, kept as histograms and sums (no per-request lists)."""

    completed: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    end_to_end: LatencyHistogram = field(default_factory=_hist)
    storage_io: LatencyHistogram = field(default_factory=_hist)
    generation: LatencyHistogram = field(default_factory=_hist)
    queue_wait: LatencyHistogram = field(default_factory=_hist)
    multi_turn_hits: int = 0
    multi_turn_misses: int = 0
    decode_reads: int = 0
    decode_misses: int = 0
    decode_bytes_read: int = 0  # KV bytes the decode reads got (the MLPerf spec's decode_bytes_read_gb)
    prefill_bytes_written: int = 0  # KV bytes of stored prefill entries (the reference's prefill_bytes_written_gb)
    prefix_hits: int = 0
    prefix_misses: int = 0
    prefix_bytes_saved: int = 0
    rag_queries: int = 0
    rag_chunk_reads: int = 0
    rag_chunk_misses: int = 0
    rag_burst: LatencyHistogram = field(default_factory=_hist)
    by_profile: dict[str, int] = field(default_factory=dict)
    by_class: dict[str, ClassStats] = field(default_factory=dict)


@dataclass
class RunOutcome:
    status: str  # completed | interrupted | failed
    error: str | None
    start_ns: int
    end_ns: int
    requests: RequestStats
    timeline: list[dict]
    autoscaling: list[dict]
    # Share of the I/O workers' time spent in storage operations: near 1 means storage-bound.
    io_saturation: float = 0.0
    # How the run kept its --duration window: see SyntheticDriver._window_report.
    window: dict = field(default_factory=dict)
    # --prefix-model chained: one row per completed round (replay's per-round columns); empty otherwise.
    rounds: list[dict] = field(default_factory=list)
    # --source: measured and predicted per-tier hit rates of the block-hash trace; empty otherwise.
    trace: dict = field(default_factory=dict)
    # The first exception of the run that is neither a storage failure nor the user's: a bug. The run stopped there
    # (status failed); the caller writes what was measured, then raises it (replay/cli.py logs its traceback).
    bug: BaseException | None = None

    @property
    def elapsed_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9
