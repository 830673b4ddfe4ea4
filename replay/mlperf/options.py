"""The three Options of the MLPerf Storage v3.0 KV cache workload (Rules.md Table KVCache-1), and the kv-cache.py
flags the harness gives a rank for each.

Facts from mlpstorage 3.0.27 (hazemawadalla/storage rules-pr 2f65ef1): `WORKLOAD_PARAMS` and
`_build_option_kvcache_args` / `_build_global_kvcache_args` in mlpstorage_py/benchmarks/kvcache.py. In CLOSED a rank
gets exactly the Option's parameters; in OPEN each parameter the user's flag (or its argparse default) supersedes,
one key at a time, and the global knobs follow (--rag-num-docs, --autoscaler-mode and --performance-profile always,
as mlpstorage's OPEN parser gives them defaults).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Option:
    number: int
    name: str
    model: str
    num_users: int  # per client (MPI rank)
    duration_s: int
    gpu_mem_gb: float
    cpu_mem_gb: float
    max_concurrent_allocs: int
    generation_mode: str = "none"

    def flags(self) -> list[str]:
        """The kv-cache.py flags of this Option, in the harness's order (CLOSED: exactly these)."""
        return [
            *("--model", self.model),
            *("--num-users", str(self.num_users)),
            *("--duration", str(self.duration_s)),
            *("--gpu-mem-gb", f"{self.gpu_mem_gb:g}"),
            *("--cpu-mem-gb", f"{self.cpu_mem_gb:g}"),
            *("--max-concurrent-allocs", str(self.max_concurrent_allocs)),
            *("--generation-mode", self.generation_mode),
        ]


OPTIONS = {
    1: Option(1, "Max Storage Stress", "llama3.1-8b", 200, 300, 0, 0, 16),
    2: Option(2, "Storage Throughput", "llama3.1-8b", 100, 300, 0, 4, 16),
    3: Option(3, "Large Model (70B)", "llama3.1-70b-instruct", 70, 300, 0, 0, 4),
}
