"""Run trees of rank files for the tests of `kvtier mlperf summary` and of its agreement with mlpstorage's own
aggregation: `rank_doc` is a rank file as kvtier bench writes it, reduced to the keys the aggregation reads."""

from __future__ import annotations

import json
from pathlib import Path


def rank_doc(read, write, tps, stps, p95, dev_read, dev_write, entries=10) -> dict:
    """A rank file as kvtier bench writes it, reduced to the keys the aggregation reads."""
    return {
        "summary": {
            "status": "completed",
            "avg_throughput_tokens_per_sec": tps,
            "storage_throughput_tokens_per_sec": stps,
            "storage_io_latency_ms": {"p50": p95 / 2, "p95": p95},
            "cache_stats": {
                "tier_storage_read_bandwidth_gbps": read,
                "tier_storage_write_bandwidth_gbps": write,
                "storage_read_device_p95_ms": dev_read,
                "storage_write_device_p95_ms": dev_write,
                "storage_entries": entries,
            },
        }
    }


def put(run: Path, option: int, trial: int, rank: int, doc, name: str = "kvcache_results_20260101_120000.json"):
    d = run / f"option_{option}" / f"trial_{trial}" / f"rank_{rank}"
    d.mkdir(parents=True, exist_ok=True)
    path = d / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


# Option 1: 2 ranks x 3 trials, every file complete.
#   (read, write, tokens/s, storage tokens/s, io p95, device read p95, device write p95) per trial, rank 0 / rank 1
FULL = {
    0: [(1.0, 0.2, 100, 10, 5, 2, 1), (2.0, 0.3, 200, 20, 7, 3, 6)],
    1: [(1.5, 0.4, 150, 5, 12, 8, 2), (2.5, 0.4, 150, 10, 3, 1, 2)],
    2: [(0.5, 0.1, 90, 40, 4, 4, 3), (1.5, 0.1, 120, 20, 9, 4, 5)],
}


def full_tree(run: Path) -> None:
    for trial, ranks in FULL.items():
        for rank, figures in enumerate(ranks):
            put(run, 1, trial, rank, rank_doc(*figures))


# ---- whole run directories, as each harness writes them, for `kvtier check RUN_DIR` ---------------------------------
RUN_DATETIME = "20260101_120000"


def option_params(option: int) -> dict:
    """Table KVCache-1's parameters of `option` as kvtier bench records them in a rank file's config."""
    from replay.mlperf.options import OPTIONS

    o = OPTIONS[option]
    return {
        "model": o.model,
        "num_users": o.num_users,
        "duration": float(o.duration_s),
        "gpu_mem_gb": float(o.gpu_mem_gb),
        "cpu_mem_gb": float(o.cpu_mem_gb),
        "max_concurrent_allocs": o.max_concurrent_allocs,
        "generation_mode": o.generation_mode,
    }


def wrapper_command(run: Path, option: int, trial: int, cache: Path, ranks: int, extra: str = "") -> str:
    """The mpirun line mlpstorage records for one trial (mlpstorage_py/benchmarks/kvcache.py `_execute_run`)."""
    from replay.mlperf.options import OPTIONS

    flags = " ".join(OPTIONS[option].flags())
    return (
        f"mpirun -n {ranks} -host 127.0.0.1:{ranks} --npernode {ranks} --bind-to none --map-by socket"
        f" --mca orte_abort_on_non_zero_status 0 /usr/bin/python3 /opt/shim/mlperf_wrapper.py"
        f" --rank-output-base {run}/option_{option}/trial_{trial} --rank-cache-base {cache} --seed-base 42"
        f" --config /opt/shim/config.yaml {flags}{extra}"
    )


def harness_tree(run: Path, cache: Path, results: Path, mode: str = "closed", ranks: int = 2, trials: int = 3):
    """A run directory as mlpstorage writes it for a run where every rule holds (in `mode`): its metadata (the keys
    the rules read), every rank's results file (with the config kvtier bench records) and, by `finish`, the run
    summary. Returns the metadata document (written again by `write_metadata` after a test alters it)."""
    run.mkdir(parents=True, exist_ok=True)
    commands = []
    for option in (1, 2, 3):
        for trial in range(trials):
            commands.append(
                {
                    "command": wrapper_command(run, option, trial, cache, ranks),
                    "stdout": str(run / f"kvcache_opt{option}_trial{trial}_{RUN_DATETIME}.stdout.log"),
                    "stderr": str(run / f"kvcache_opt{option}_trial{trial}_{RUN_DATETIME}.stderr.log"),
                }
            )
            for rank in range(ranks):
                doc = rank_doc(1.0 + rank, 0.5, 100 + option, 50 + trial, 9.0, 3.0 + rank, 2.0)
                out = run / f"option_{option}" / f"trial_{trial}" / f"rank_{rank}"
                doc["config"] = option_params(option) | {
                    "seed": 42 + rank,
                    "cache_dir": str(cache / f"rank_{rank}"),
                    "output": str(out / f"kvtier_inflight_kvcache_results_{RUN_DATETIME}.json"),
                    "enable_autoscaling": False,
                }
                put(run, option, trial, rank, doc, f"kvcache_results_{RUN_DATETIME}.json")
    meta = {
        "benchmark_type": "kv_cache",
        "run_datetime": RUN_DATETIME,
        "num_processes": ranks,
        "command": "run",
        "model": "llama3.1-8b",
        # what mlpstorage's run-rules checker reads (kvcache.py `metadata`): the run's first Option's workload
        "parameters": option_params(1) | {"cache_dir": str(cache), "performance_profile": "throughput"},
        "override_parameters": {},
        "command_output_files": commands,
        "args": {
            "mode": mode,
            "cache_dir": str(cache),
            "results_dir": str(results),
            "seed": None,
            "trials": None if mode == "closed" else trials,
            "inter_option_delay": None if mode == "closed" else 0,
            "config": None,
            "enable_autoscaling": False,
            "hosts": ["127.0.0.1"],
            "num_processes": ranks,
            "npernode": 1,
        },
    }
    write_metadata(run, meta)
    return meta


def write_metadata(run: Path, meta: dict) -> Path:
    path = run / f"kv_cache_{RUN_DATETIME}_metadata.json"
    path.write_text(json.dumps(meta))
    return path


def rank_file(run: Path, option: int, trial: int, rank: int) -> Path:
    return run / f"option_{option}" / f"trial_{trial}" / f"rank_{rank}" / f"kvcache_results_{RUN_DATETIME}.json"


def edit_rank(run: Path, option: int, trial: int, rank: int, change) -> None:
    path = rank_file(run, option, trial, rank)
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def finish(run: Path, ranks: int, trials: int) -> Path:
    """The run summary, as the harness writes it after the last Option (kvtier's aggregation: mlpstorage's)."""
    from replay.mlperf.summary import summarize, write_summary

    return write_summary(str(run), summarize(str(run), ranks, trials, ranks, 1, RUN_DATETIME))
