"""`kvtier bench` without the command line: build the tiers from a config, drive them, assemble the results."""

from __future__ import annotations

import datetime as dt
import logging
import os
import random
import shutil
import tempfile
import time

from kvconnector.errors import ConfigError
from kvconnector.models import resolve_model
from kvconnector.store import TieredStore
from kvconnector.tiers import GB, CPUTier, DiskTier, GPUTier, cuda_torch

from .. import sysinfo
from ..bench_config import BenchConfig
from ..results import cache_stats, tier_details
from ..sources.synthetic_users import make_users
from .driver import RunOutcome, SyntheticDriver
from .payload import RandomPayload

log = logging.getLogger("kvtier.bench")

DEFAULT_GPU_MEM_GB = 16.0


def build_tiers(cfg: BenchConfig, run_dir: str, notes: list[str]) -> list:
    tiers = []
    gpu_gb = cfg.gpu_mem_gb
    if gpu_gb is None:
        if cuda_torch() is None:
            gpu_gb = 0.0
            notes.append("no CUDA device: GPU tier disabled (--gpu-mem-gb 0)")
        else:
            gpu_gb = DEFAULT_GPU_MEM_GB
    if gpu_gb > 0:
        tiers.append(GPUTier(int(gpu_gb * GB)))  # raises a ConfigError without CUDA
    if cfg.cpu_mem_gb > 0:
        avail = sysinfo.mem_available_bytes()
        if avail and cfg.cpu_mem_gb * GB > 0.9 * avail:
            raise ConfigError(
                f"--cpu-mem-gb {cfg.cpu_mem_gb:g} exceeds 90% of the {avail / GB:.1f} GB of memory available here"
            )
        tiers.append(CPUTier(int(cfg.cpu_mem_gb * GB)))
    free = shutil.disk_usage(run_dir).free
    if cfg.storage_capacity_gb * GB > free:
        raise ConfigError(
            f"--storage-capacity-gb {cfg.storage_capacity_gb:g} exceeds the {free / GB:.1f} GB free under {run_dir}"
        )
    tiers.append(DiskTier(run_dir, int(cfg.storage_capacity_gb * GB), cfg.io_mode, name="disk"))
    return tiers


def make_run_dir(cfg: BenchConfig) -> tuple[str, bool]:
    """A fresh directory for this run's entries: inside --cache-dir when given, else a temporary one."""
    stamp = f"kvtier-run-{dt.datetime.now():%Y%m%d-%H%M%S}-{os.getpid()}-"
    if cfg.cache_dir:
        base = os.path.abspath(cfg.cache_dir)
        try:
            os.makedirs(base, exist_ok=True)
            return tempfile.mkdtemp(prefix=stamp, dir=base), True
        except OSError as exc:
            raise ConfigError(f"cannot use --cache-dir {base}: {exc.strerror}") from exc
    # /var/tmp is disk-backed on most systems, where /tmp may be tmpfs.
    base = "/var/tmp" if os.access("/var/tmp", os.W_OK) else None
    return tempfile.mkdtemp(prefix=stamp, dir=base), True


class Bench:
    """One run. `prepare()` validates and builds everything (user errors surface here, before any I/O)."""

    def __init__(self, cfg: BenchConfig) -> None:
        self.cfg = cfg
        self.notes: list[str] = []

    def prepare(self) -> None:
        cfg = self.cfg
        self.spec = resolve_model(cfg.model)
        self.bytes_per_token = self.spec.bytes_per_token(cfg.kv_dtype)
        self.run_dir, self._remove_run_dir = make_run_dir(cfg)
        try:
            self.tiers = build_tiers(cfg, self.run_dir, self.notes)
        except BaseException:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            raise
        self.notes.extend(f"{t.name}: fallback {k} x{v}" for t in self.tiers for k, v in t.fallbacks.items())
        self.store = TieredStore(self.tiers, target_usage_ratio=cfg.target_usage_ratio,
                                 large_entry_limit_ratio=cfg.large_entry_limit_ratio, promote_on_hit=cfg.promote_on_hit)
        self.seed = cfg.seed if cfg.seed is not None else random.randrange(2**31)
        self.users = make_users(cfg.num_users, cfg.user_profiles, random.Random(self.seed))
        self.payload = RandomPayload(cfg.random_buffer_mb, self.seed)

    def run(self, on_sample=None) -> dict:
        cfg = self.cfg
        started = dt.datetime.now(dt.timezone.utc)
        env = sysinfo.environment(self.run_dir)
        disk0 = sysinfo.disk_counters(env["block_device"])
        driver = SyntheticDriver(cfg.model_copy(update={"seed": self.seed}), self.store, self.bytes_per_token,
                                 self.users, self.payload, on_sample=on_sample)
        self.driver = driver
        try:
            outcome = driver.run()
        finally:
            disk1 = sysinfo.disk_counters(env["block_device"])
        doc = self.results(outcome, env, started, disk0, disk1)
        return doc

    def cleanup(self) -> None:
        if getattr(self, "store", None) is not None:
            self.store.close()
        if getattr(self, "run_dir", None) and self._remove_run_dir and not self.cfg.keep_cache:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def results(self, outcome: RunOutcome, env: dict, started, disk0, disk1) -> dict:
        cfg = self.cfg
        elapsed = outcome.elapsed_s
        req = outcome.requests
        tokens = req.prompt_tokens + req.generated_tokens
        disk_bytes = sum(s.read.nbytes + s.write.nbytes for t, s in zip(self.store.tiers, self.store.stats) if t.kind == "disk")
        block = None
        if disk0 and disk1:
            delta = disk1.minus(disk0)
            block = {
                "device": env["block_device"],
                **delta,
                "read_gbps": round(delta["read_bytes"] / GB / elapsed, 4) if elapsed else 0.0,
                "write_gbps": round(delta["written_bytes"] / GB / elapsed, 4) if elapsed else 0.0,
                "note": "whole-device counters for the run's window: other processes' I/O is included",
            }
        summary = {
            "status": outcome.status,
            "total_requests": req.completed,
            "total_tokens": tokens,
            "prompt_tokens": req.prompt_tokens,
            "generated_tokens": req.generated_tokens,
            "elapsed_time": round(elapsed, 4),
            "requests_per_second": round(req.completed / elapsed, 4) if elapsed else 0.0,
            "avg_throughput_tokens_per_sec": round(tokens / elapsed, 2) if elapsed else 0.0,
            # KV tokens moved through the storage (disk) tier per wall-clock second; not tokens / summed I/O time.
            "storage_throughput_tokens_per_sec": round(disk_bytes / self.bytes_per_token / elapsed, 2) if elapsed else 0.0,
            "end_to_end_latency_ms": req.end_to_end.summary_ms(),
            "storage_io_latency_ms": req.storage_io.summary_ms(),
            "generation_latency_ms": req.generation.summary_ms(),
            "queue_wait_latency_ms": req.queue_wait.summary_ms(),
            "cache_stats": cache_stats(self.store, elapsed),
            "multi_turn_stats": {
                "enabled": not cfg.disable_multi_turn,
                "previous_turn_hits": req.multi_turn_hits,
                "previous_turn_misses": req.multi_turn_misses,
                "hit_rate": round(req.multi_turn_hits / (req.multi_turn_hits + req.multi_turn_misses), 4)
                if req.multi_turn_hits + req.multi_turn_misses else 0.0,
            },
            "decode_stats": {"reads": req.decode_reads, "misses": req.decode_misses, "batch_size": cfg.decode_batch_size},
            "requests_by_profile": dict(sorted(req.by_profile.items())),
        }
        fallbacks = {f"{t.name}.{k}": v for t in self.store.tiers for k, v in t.fallbacks.items()}
        return {
            "kvtier_version": _version(),
            "started_at": started.isoformat(timespec="seconds"),
            "status": outcome.status,
            "error": outcome.error,
            "notes": self.notes,
            "model": {"name": self.spec.name, "bytes_per_token": self.bytes_per_token, "kv_dtype": cfg.kv_dtype,
                      "mla": self.spec.is_mla},
            "config": cfg.model_dump(mode="json") | {"seed": self.seed},
            "environment": env,
            "summary": summary,
            "tiers": tier_details(self.store),
            "block_device": block,
            "fallbacks": fallbacks,
            "request_histograms": {
                "end_to_end": req.end_to_end.encode(),
                "storage_io": req.storage_io.encode(),
                "generation": req.generation.encode(),
                "queue_wait": req.queue_wait.encode(),
            },
            "timeline": outcome.timeline,
        }


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("kvtier")
    except Exception:
        return "unknown"


def default_output_path() -> str:
    return os.path.join("results", f"{time.strftime('%Y%m%d-%H%M%S')}.json")
