"""kvtier under the MLPerf Storage v3.0 KV cache submission harness (mlpstorage): `kvtier mlperf`.

- `shim`: writes a directory mlpstorage runs as the reference's kv-cache.py and mlperf_wrapper.py; its two scripts
  are `wrapper_script` and `kvcache_script` (standard library only: they run under the harness's Python).
- `summary`: the harness's aggregation of rank files into `kvcache_run_summary_<time>.json`.
- `options`: the three Options of Table KVCache-1 and the flags the harness gives a rank for each.

It drives `kvtier bench` through its command line only, as mlpstorage drives the reference: it imports no driver
(tests/test_layers.py).
"""

from .shim import write_shim
from .summary import aggregate_option, rank_figures, run_summary, summarize, write_summary

__all__ = ["aggregate_option", "rank_figures", "run_summary", "summarize", "write_shim", "write_summary"]
