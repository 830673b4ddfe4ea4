"""kvtier tracing: bpftrace storage latency tracer, its wrapper and the fio distiller.

Stands alone: imports nothing from the other kvtier packages, and only the
standard library (matplotlib, lazily, in tracing.report alone), so the
folder can be copied onto an inference node by itself. Names are loaded on
first use, so ``python -m tracing.distill`` does not import itself twice.
"""

from importlib import import_module

_EXPORTS = {
    "Bucket": "histparse",
    "Hist": "histparse",
    "Stats": "histparse",
    "Trace": "histparse",
    "TraceParseError": "histparse",
    "parse_trace": "histparse",
    "DistillError": "distiller",
    "Distilled": "distiller",
    "distill": "distiller",
    "render_job": "fio_job",
    "validate_job": "fio_job",
    "TraceSession": "session",
    "TracingUnavailable": "session",
    "TraceSessionError": "session",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'tracing' has no attribute {name!r}")
