"""`kvtier bench` without the command line: build the tiers from a config, set up, drive them, assemble results."""

from __future__ import annotations

import datetime as dt
import logging
import os
import random
import shutil
import signal
import sys
import tempfile
import time

from kvconnector.errors import ConfigError
from kvconnector.store import TieredStore
from kvconnector.tiers import CPUTier, DiskTier, GPUTier, cuda_torch
from kvconnector.units import GB, human_bytes
from replay.models import ModelSpec, resolve_model

from ..common.leftovers import disk_temp_dir, keep, made_dirs, remove_dead, remove_empty
from ..outputs.paths import check_new_dirs, os_reason
from ..sources.base import WorkloadError
from . import sysinfo
from .config import BenchConfig
from .driver import SyntheticDriver
from .mlperf_config import is_large_model, unused_key_notes
from .null_tier import NullTier
from .payload import RandomPayload
from .precondition import run_precondition
from .request import rag_key
from .results import document_keys, fallbacks, request_histograms, summary, tier_details
from .stats import RunOutcome
from .validation_trace import load_validation_trace, validate_run
from .workload import Workload

log = logging.getLogger("kvtier.bench")

DEFAULT_GPU_MEM_GB = 16.0
PREPOPULATE_PER_USER = 10
AUTO_DISK_SHARE = 0.95


def build_tiers(cfg: BenchConfig, run_dir: str, notes: list[str]) -> list:
    """GPU (num_gpus x gpu_mem_gb), CPU and disk tiers, sizes in cfg.size_unit; in the trace-only mode
    (--io-trace-log) no-op tiers of the same sizes (no CUDA, memory or disk needed)."""
    tiers = []
    gpu_gb = gpu_mem_gb_to_run(cfg, notes)
    gpu_bytes = cfg.size_bytes(gpu_gb) * cfg.num_gpus  # the reference's pool: num_gpus x gpu-mem-gb
    cpu_bytes = cfg.size_bytes(cfg.cpu_mem_gb)
    disk_bytes = cfg.size_bytes(cfg.storage_capacity_gb)
    if cfg.trace_only:
        if gpu_bytes > 0:
            tiers.append(NullTier("gpu", "gpu", gpu_bytes))
        if cpu_bytes > 0:
            tiers.append(NullTier("cpu", "cpu", cpu_bytes))
        if cfg.storage_backend == "s3":
            tiers.append(NullTier("s3", "s3", disk_bytes))
        else:
            tiers.append(NullTier("disk", "disk", disk_bytes or auto_disk_bytes(run_dir)))
        return tiers
    if gpu_bytes > 0:
        check_gpu_pool(cfg, gpu_gb, gpu_bytes)
        if cfg.num_gpus > 1:
            notes.append(
                f"GPU tier: {cfg.num_gpus} x {gpu_gb:g} {cfg.size_unit} = {human_bytes(gpu_bytes)} on the first CUDA "
                "device, as the reference pools them"
            )
        tiers.append(GPUTier(gpu_bytes))  # raises a ConfigError without CUDA
    if cpu_bytes > 0:
        avail = sysinfo.mem_available_bytes()
        if avail and cpu_bytes > 0.9 * avail:
            raise ConfigError(
                f"--cpu-mem-gb {cfg.cpu_mem_gb:g} ({cfg.size_unit}) exceeds 90% of the {human_bytes(avail)} of memory "
                "available here"
            )
        tiers.append(CPUTier(cpu_bytes))
    if cfg.storage_backend == "s3":
        tiers.append(s3_tier(cfg, run_dir, disk_bytes))
        return tiers
    free = shutil.disk_usage(run_dir).free
    if disk_bytes > free:
        raise ConfigError(
            f"--storage-capacity-gb {cfg.storage_capacity_gb:g} ({cfg.size_unit}) exceeds the {human_bytes(free)} free "
            f"under {os.path.dirname(run_dir)}"
        )
    tiers.append(DiskTier(run_dir, disk_bytes or auto_disk_bytes(run_dir), cfg.io_mode, name="disk", sync=cfg.sync))
    return tiers


def s3_tier(cfg: BenchConfig, run_dir: str, capacity: int):
    """The storage tier in an S3 bucket, under a prefix named as the run's directory (unique per run and client)."""
    from kvconnector.s3_tier import S3Tier

    prefix = f"kvtier-bench/{os.path.basename(run_dir)}/"
    return S3Tier(cfg.s3_bucket, capacity, prefix=prefix, endpoint=cfg.s3_endpoint, create_bucket=False)


def gpu_mem_gb_to_run(cfg: BenchConfig, notes: list[str]) -> float:
    """--gpu-mem-gb, or left out: 16 where CUDA is, else 0 with a note (a fallback is said, never silent)."""
    if cfg.gpu_mem_gb is not None:
        return cfg.gpu_mem_gb
    if cuda_torch() is None:
        notes.append("no CUDA device: GPU tier disabled (--gpu-mem-gb 0)")
        return 0.0
    return DEFAULT_GPU_MEM_GB


def check_gpu_pool(cfg: BenchConfig, gpu_gb: float, gpu_bytes: int) -> None:
    """The GPU tier lives on the first CUDA device (as the reference's GPU backend): a pool larger than that device's
    memory would fail on the first allocation past it, mid-run. ConfigError now instead (no CUDA: GPUTier says so)."""
    torch = cuda_torch()
    if torch is None:
        return
    total = torch.cuda.get_device_properties(0).total_memory
    if gpu_bytes > total:
        pool = f"{cfg.num_gpus} x " if cfg.num_gpus > 1 else ""
        raise ConfigError(
            f"--gpu-mem-gb {pool}{gpu_gb:g} {cfg.size_unit} = {human_bytes(gpu_bytes)}: more than the "
            f"{human_bytes(total)} of the first CUDA device, which holds the whole GPU tier (--io-trace-log models a "
            "larger node without its memory)"
        )


def auto_disk_bytes(run_dir: str) -> int:
    """--storage-capacity-gb 0: 95% of the filesystem's free space, as the reference's auto-detection (its cache.py:
    statvfs f_bavail x f_frsize x 0.95)."""
    return int(shutil.disk_usage(run_dir).free * AUTO_DISK_SHARE)


RUN_DIR_PREFIX = "kvtier-run-"


def make_run_dir(cfg: BenchConfig, made: list[str] | None = None) -> str:
    """A fresh directory for this run's entries: inside --cache-dir when given, else a temporary one. The missing
    part of --cache-dir's path is created and listed in `made` (the run removes it at its end, if empty). What
    dead runs left under the same base (their run directories, which name their owner: leftovers.py) is removed
    first, in one line on stderr."""
    stamp = f"{RUN_DIR_PREFIX}{dt.datetime.now():%Y%m%d-%H%M%S}-{os.getpid()}-"
    if cfg.cache_dir:
        base = os.path.abspath(cfg.cache_dir)
        existing = base
        while not os.path.lexists(existing):  # the part of the path that exists must be directories
            existing = os.path.dirname(existing)
        if not os.path.isdir(existing):
            raise ConfigError(f"--cache-dir {cfg.cache_dir}: {existing} is not a directory")
        check_new_dirs(base, f"--cache-dir {cfg.cache_dir}")  # the outputs' rule: no new top-level directory
        if made is not None:
            made.extend(made_dirs(base))
        try:
            os.makedirs(base, exist_ok=True)
            _remove_dead_runs(base)
            return tempfile.mkdtemp(prefix=stamp, dir=base)
        except OSError as exc:
            if made:
                remove_empty(made)
            raise ConfigError(
                f"--cache-dir {cfg.cache_dir}: cannot create a directory under {base} ({os_reason(exc)})"
            ) from exc
    base = disk_temp_dir()
    _remove_dead_runs(base)
    return tempfile.mkdtemp(prefix=stamp, dir=base)


def _remove_dead_runs(base: str) -> None:
    dirs, nbytes = remove_dead(base, RUN_DIR_PREFIX)
    if dirs:
        print(
            f"kvtier bench: removed {human_bytes(nbytes)} in {dirs} {RUN_DIR_PREFIX}* "
            f"director{'y' if dirs == 1 else 'ies'} under {base} left by runs no longer alive",
            file=sys.stderr,
            flush=True,
        )


def context_bound(cfg: BenchConfig, spec: ModelSpec) -> int | None:
    """The most tokens one request may hold: the model's context length, lowered by --max-context-tokens."""
    model = spec.max_context_tokens or None
    flag = cfg.max_context_tokens
    if flag is not None and model is not None and flag > model:
        raise ConfigError(f"--max-context-tokens {flag} exceeds the context length of {spec.name} ({model} tokens)")
    return flag if flag is not None else model


def model_spec(cfg: BenchConfig) -> ModelSpec:
    custom = cfg.model_configs.get(cfg.model)
    if custom is not None:
        return ModelSpec(cfg.model, **custom.spec_fields(cfg.model))
    return resolve_model(cfg.model)


class Bench:
    """One run. `prepare()` validates and builds everything (user errors surface here, before any I/O)."""

    def __init__(self, cfg: BenchConfig) -> None:
        self.cfg = cfg
        self.notes: list[str] = []
        self.setup: dict = {}
        self.store = None
        self.run_dir = None
        self.made_dirs: list[str] = []  # the missing part of --cache-dir's path, created by this run
        self.bug: BaseException | None = None  # a bug that ended the run (RunOutcome.bug), raised once results are out

    def prepare(self) -> None:
        cfg = self.cfg
        self.spec = model_spec(cfg)
        self.notes.extend(unused_key_notes(cfg))
        # With tensor parallelism each rank stores 1/TP of every entry (the reference divides an entry's bytes by
        # TP): this process is one rank, so its entries are bytes_per_token / TP per token.
        self.full_bytes_per_token = self.spec.bytes_per_token(cfg.kv_dtype)
        self.bytes_per_token = self.full_bytes_per_token // cfg.tensor_parallel
        if self.bytes_per_token < 1:
            raise ConfigError(
                f"--tensor-parallel {cfg.tensor_parallel}: more ranks than {self.spec.name}'s "
                f"{self.full_bytes_per_token} B per token"
            )
        tp = cfg.tensor_parallel
        if tp > 1 and tp & (tp - 1):
            self.notes.append(f"--tensor-parallel {tp} is not a power of 2 (uncommon, allowed)")
        if tp > 1 and self.full_bytes_per_token % tp:
            self.notes.append(
                f"--tensor-parallel {tp}: {self.full_bytes_per_token} B per token do not split evenly; each rank "
                f"stores {self.bytes_per_token} B per token"
            )
        self.validation_trace = load_validation_trace(cfg.validation_trace) if cfg.validation_trace else None
        self.seed = cfg.seed if cfg.seed is not None else random.randrange(2**31)
        self.max_context_tokens = context_bound(cfg, self.spec)
        try:
            self.workload = Workload(cfg, self.seed, self.max_context_tokens)
        except WorkloadError as exc:
            raise ConfigError(str(exc)) from exc
        if self.workload.report:
            r = self.workload.report
            self.notes.append(
                f"{r.source}: {r.conversations} conversations, {r.turns} turns, tokenizer {r.tokenizer}"
                + (f", skipped {dict(r.skipped)}" if r.skipped else "")
                + (f", cut to {self.max_context_tokens} tokens {dict(r.truncated)}" if r.truncated else "")
            )
        # From here on the config holds what runs, and the results file records it: no None left to the host.
        trace = self.workload.block_trace
        self.cfg = cfg = cfg.as_run(
            seed=self.seed,
            gpu_mem_gb=gpu_mem_gb_to_run(cfg, self.notes),
            max_context_tokens=self.max_context_tokens,
            trace_block_tokens=trace.block_tokens if trace is not None else None,
        )
        self.run_dir = make_run_dir(cfg, self.made_dirs)
        try:
            self.tiers = build_tiers(cfg, self.run_dir, self.notes)
            if cfg.keep_cache:
                keep(self.run_dir)  # asked for: never a dead run's leftovers to remove, even if this run is killed
        except BaseException:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            remove_empty(self.made_dirs)
            raise
        self.notes.extend(f"{t.name}: fallback {k} x{v}" for t in self.tiers for k, v in t.fallbacks.items())
        if cfg.trace_only:
            sizes = ", ".join(f"{t.name} {human_bytes(t.capacity_bytes)}" for t in self.tiers)
            self.notes.append(
                f"trace-only mode (--io-trace-log {cfg.io_trace_log}): no device I/O, every tier a no-op of its "
                f"size ({sizes}); latencies and bandwidths in the results are not a device's"
            )
            if cfg.precondition:
                self.notes.append("--precondition skipped: the trace-only mode does no device I/O")
        self.store = TieredStore(
            self.tiers,
            target_usage_ratio=cfg.eviction.target_usage_ratio,
            large_entry_limit_ratio=cfg.eviction.large_entry_limit_ratio,
            promote_on_hit=cfg.promote_on_hit,
        )
        # An entry larger than this share of the largest tier fits no tier: cut it before trying (see the store).
        largest = max(t.capacity_bytes for t in self.tiers)
        tier_tokens = int(largest * cfg.eviction.large_entry_limit_ratio) // self.bytes_per_token
        if tier_tokens < 1:  # the caller's cleanup() removes the run directory
            raise ConfigError(
                f"one token of {self.spec.name} ({self.bytes_per_token:,} B) fits no tier "
                f"(the largest holds {largest:,} B): give the tiers more room"
            )
        self.workload.set_entry_limit(tier_tokens)
        self.payload = RandomPayload(cfg.random_buffer_mb, self.seed)

    # ---- set-up I/O, excluded from the results --------------------------------------------------------------------
    def set_up(self, on_progress=None) -> None:
        cfg = self.cfg
        rng = random.Random(self.seed ^ 0x5E7)
        disk = self.tiers[-1]
        if cfg.precondition and not cfg.trace_only:
            self.setup["precondition"] = run_precondition(cfg, disk, self.run_dir, self.payload, on_progress)
            if "error" in self.setup["precondition"]:
                self.notes.append(f"precondition stopped early: {self.setup['precondition']['error']}")
        if cfg.enable_rag:
            chunk_bytes = cfg.rag.chunk_tokens_for(self.bytes_per_token) * self.bytes_per_token
            docs = self.workload.rag_documents(is_large_model(cfg, self.spec))
            total = sum(docs)
            for i, (d, c) in enumerate((d, c) for d, n in enumerate(docs) for c in range(n)):
                self.store.put(rag_key(d, c), self.payload.chunks(chunk_bytes, rng))
                if on_progress:
                    on_progress("rag ingest", i + 1, total)
            self.setup["rag_ingest"] = {"documents": len(docs), "chunks": total, "chunk_bytes": chunk_bytes}
        self.prepopulated: list[str] = []
        if cfg.decode_only:
            n = cfg.num_users * PREPOPULATE_PER_USER
            templates = list(cfg.user_templates.values())
            for i in range(n):
                t = templates[i % len(templates)]
                key = f"pre/{i}"
                tokens = self.workload.entry_tokens(rng.randint(*t.context_tokens))
                self.store.put(key, self.payload.chunks(tokens * self.bytes_per_token, rng))
                self.prepopulated.append(key)
                if on_progress:
                    on_progress("pre-populate", i + 1, n)
            self.setup["prepopulated_entries"] = n
        self.store.reset_stats()

    def run(self, on_sample=None, phase_hook=None) -> dict:
        cfg = self.cfg
        started = dt.datetime.now(dt.UTC)
        env = sysinfo.environment(self.run_dir)
        disk0 = sysinfo.disk_counters(env["block_device"])
        proc0 = sysinfo.process_counters()
        driver = SyntheticDriver(
            cfg,
            self.store,
            self.bytes_per_token,
            self.workload,
            self.payload,
            self.seed,
            on_sample=on_sample,
            prepopulated=getattr(self, "prepopulated", []),
            phase_hook=phase_hook,
        )
        self.driver = driver
        try:
            outcome = driver.run()
        finally:
            disk1 = sysinfo.disk_counters(env["block_device"])
            proc = sysinfo.process_counters().minus(proc0)
        self.bug = outcome.bug
        return self.results(outcome, env, started, disk0, disk1, proc)

    def cleanup(self) -> None:
        if self.store is not None and not self.cfg.keep_cache:
            for tier in self.store.tiers:
                if hasattr(tier, "remove_all"):  # an object store's prefix, made for this run
                    tier.remove_all()
        if self.store is not None:
            self.store.close()
        if self.run_dir and not self.cfg.keep_cache:
            shutil.rmtree(self.run_dir, ignore_errors=True)
        remove_empty(self.made_dirs)

    # ---- results -----------------------------------------------------------------------------------------------------
    def results(self, outcome: RunOutcome, env: dict, started, disk0, disk1, proc: dict) -> dict:
        cfg = self.cfg
        elapsed = outcome.elapsed_s
        req = outcome.requests
        tiers = tier_details(self.store)
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
        # The window's wall-clock ends: results merged later (kvtier merge, MPI ranks) take the union of windows.
        start_unix_s = (time.time_ns() - (time.perf_counter_ns() - outcome.start_ns)) / 1e9
        window = dict(outcome.window, start_unix_s=round(start_unix_s, 3), end_unix_s=round(start_unix_s + elapsed, 3))
        run_summary = summary(
            req,
            cfg,
            status=outcome.status,
            elapsed_s=elapsed,
            tiers=tiers,
            events=self.store.events,
            bytes_per_token=self.bytes_per_token,
            io_saturation=outcome.io_saturation,
            window=window,
            autoscaling=[outcome.autoscaling],
        )
        report = self.workload.report
        extra = {}
        if self.validation_trace is not None:
            extra["validation"] = validate_run(self.validation_trace, run_summary)
        return {
            "kvtier_version": _version(),
            "started_at": started.isoformat(timespec="seconds"),
            "status": outcome.status,
            "error": outcome.error,
            "stop_signal": None if self.driver.stop_signal is None else signal.Signals(self.driver.stop_signal).name,
            "notes": self.notes,
            # How sizes and requests were read: the size keys' unit and the request model (replay/synthetic/README.md).
            "request_model": cfg.request_model,
            "size_unit": cfg.size_unit,
            "trace_only": cfg.trace_only,  # --io-trace-log: no device I/O, every tier a no-op of its size
            "model": {
                "name": self.spec.name,
                # per rank: the full entry's bytes / tensor_parallel
                "bytes_per_token": self.bytes_per_token,
                "full_bytes_per_token": self.full_bytes_per_token,
                "tensor_parallel": cfg.tensor_parallel,
                "kv_dtype": cfg.kv_dtype,
                "mla": self.spec.is_mla,
            },
            "workload": {
                "source": self.workload.kind,
                "timed": self.workload.timed,
                "max_context_tokens": self.max_context_tokens,
                # Entries cut to the bound during the run, by the limit that cut them (the model's context
                # length or the largest tier); dataset rows cut as they loaded are in load_report.truncated.
                "truncated_requests": dict(self.workload.truncated_requests),
                "load_report": None
                if report is None
                else {
                    "conversations": report.conversations,
                    "turns": report.turns,
                    "skipped": dict(report.skipped),
                    "truncated": dict(report.truncated),
                    "tokenizer": report.tokenizer,
                },
            },
            "config": cfg.model_dump(mode="json"),  # as it ran (prepare: BenchConfig.as_run)
            "environment": env,
            "setup": self.setup,
            "summary": run_summary,
            **document_keys(run_summary),
            "tiers": tiers,
            "store_events": dict(self.store.events),
            "block_device": block,
            # this process over the run's window (set-up excluded): its CPU per GiB it moved through the block layer
            "process": proc,
            "fallbacks": fallbacks(tiers),
            "request_histograms": request_histograms(req),
            "autoscaling_stats": outcome.autoscaling,
            "timeline": outcome.timeline,
            # --prefix-model chained: replay's per-round rows (replay/synthetic/chained.py)
            **({"block_size": cfg.block_size, "rounds": outcome.rounds} if outcome.rounds else {}),
            # --source: measured against predicted per-tier hit rates (replay/synthetic/trace_blocks.py)
            **({"trace": outcome.trace} if outcome.trace else {}),
            **extra,
        }


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("kvtier")
    except Exception:
        return "unknown"
