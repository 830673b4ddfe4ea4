"""`kvtier bench --num-clients N`: N worker processes (past the GIL), one aggregate view, one merged result.

Each client is a `kvtier bench` process with its share of the job (`share_config`, also used for MPI ranks): its
share of the users, its own cache subdirectory, its share of the CPU/GPU/disk capacities, and seed + i. The parent
shows the clients' summed progress, forwards Ctrl-C, stops every client when one fails, and merges the results
with `merge.merge_results`, the code of `kvtier merge`: bytes, counts and capacities add up, latency percentiles
come from the merged histograms, rates are over the union of the clients' windows. Each client's own result is
kept under `clients`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import yaml

from kvconnector.units import human_bytes

from ..common.cli import Interrupted, exit_code, signal_name, stop_signals_handled, stop_signals_raise
from ..common.leftovers import OwnedDir, die_with_parent, disk_temp_dir, made_dirs, remove_dead, remove_empty
from ..mpi import split
from ..outputs.io_trace import tagged
from ..outputs.paths import os_reason
from .config import BenchConfig
from .finish import bench_fail, finish
from .merge import merge_results, print_sources
from .view import STATUS_ENV, LiveView

CLIENTS_PREFIX = "kvtier-clients-"


def share_config(cfg: BenchConfig, i: int, n: int, cache_dir: str | None, local_n: int | None = None) -> dict:
    """Client or rank i of n: its share of the users, requests and request rate, seed + i, its own cache directory;
    the CPU, GPU and disk capacities split among the `local_n` processes of its host (default all n)."""
    local_n = local_n or n
    data = cfg.model_dump(mode="json")
    data.update(
        num_clients=1,
        num_users=split(cfg.num_users, n, i),
        seed=(cfg.seed or 0) + i,
        output=None,
        cache_dir=cache_dir,
        progress=False,
        xlsx_output=None,
        csv_output=None,
        html_output=None,
        plots=None,
        max_requests=split(cfg.max_requests, n, i) if cfg.max_requests else 0,
        request_rate=cfg.request_rate / n,
        cpu_mem_gb=cfg.cpu_mem_gb / local_n,
        gpu_mem_gb=None if cfg.gpu_mem_gb is None else cfg.gpu_mem_gb / local_n,
        storage_capacity_gb=cfg.storage_capacity_gb / local_n,
    )
    return data


def client_config(cfg: BenchConfig, i: int, workdir: str, cache_base: str) -> dict:
    data = share_config(cfg, i, cfg.num_clients, os.path.join(cache_base, f"client-{i}"))
    data.update(
        output=os.path.join(workdir, f"client-{i}.json"),
        io_trace_log=tagged(cfg.io_trace_log, f"client-{i}") if cfg.io_trace_log else None,
        io_op_log=tagged(cfg.io_op_log, f"client-{i}") if cfg.io_op_log else None,
    )
    return data


def run_clients(cfg: BenchConfig, output: str, is_default: bool = False) -> int:
    if cfg.seed is None:
        cfg = cfg.model_copy(update={"seed": int(time.time()) % 2**31})
    # What a killed run left (its directories name their owner): removed before this run makes its own.
    cache_home = disk_temp_dir()  # the clients' caches, when no --cache-dir is given
    for base in {tempfile.gettempdir(), cache_home}:
        dirs, nbytes = remove_dead(base, CLIENTS_PREFIX)
        if dirs:
            print(
                f"kvtier bench: removed {human_bytes(nbytes)} in {dirs} {CLIENTS_PREFIX}* director"
                f"{'y' if dirs == 1 else 'ies'} under {base} left by runs no longer alive",
                file=sys.stderr,
                flush=True,
            )
    owned = [OwnedDir(CLIENTS_PREFIX)]
    workdir = owned[0].path
    made = []
    if cfg.cache_dir:
        cache_base = os.path.abspath(cfg.cache_dir)
        made = made_dirs(cache_base)
    else:
        owned.append(OwnedDir(CLIENTS_PREFIX, cache_home))
        cache_base = owned[1].path
    try:  # the block device is looked up from the directory, so it must exist before the clients make it
        os.makedirs(cache_base, exist_ok=True)
    except OSError as exc:
        for o in owned:
            o.remove()
        remove_empty(made)
        return bench_fail(f"--cache-dir {cfg.cache_dir}: cannot create it ({os_reason(exc)})")
    procs: list[subprocess.Popen] = []
    stop = {"signal": None}
    try:
        with stop_signals_raise():  # a signal while clients start: the finally below stops and cleans up
            for i in range(cfg.num_clients):
                path = os.path.join(workdir, f"client-{i}.yaml")
                with open(path, "w") as f:
                    yaml.safe_dump(client_config(cfg, i, workdir, cache_base), f)
                # The parent already folded KVTIER_* variables into the clients' configs; inherited, they would
                # override each client's share (KVTIER_NUM_USERS would undo the split of users).
                env = {k: v for k, v in os.environ.items() if not k.startswith("KVTIER_")}
                env[STATUS_ENV] = os.path.join(workdir, f"client-{i}.status")
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "replay.cli", "bench", "--config", path],
                        env=env,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.PIPE,
                        text=True,
                        # Killed with the parent (SIGTERM: each removes its cache as on Ctrl-C).
                        preexec_fn=die_with_parent(signal.SIGTERM),
                    )
                )
        codes = _supervise(cfg, procs, workdir, stop)
        errors = [p.stderr.read().strip() for p in procs]
        docs, clients = [], []
        for i in range(cfg.num_clients):
            try:
                with open(os.path.join(workdir, f"client-{i}.json")) as f:
                    docs.append(json.load(f))
                clients.append(i)
            except (OSError, json.JSONDecodeError):
                pass
    except Interrupted as exc:
        return bench_fail(f"interrupted while starting the clients ({exc}); no results", exc.exit_code)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for o in owned:
            o.remove()
        remove_empty(made)
    if not docs:
        msg = next((e.splitlines()[-1] for e in errors if e), "no client produced results")
        return bench_fail(f"clients failed: {msg}", max(codes) or 1)
    doc = merge_results(docs, [f"client-{i}" for i in clients], cfg, extra=[{"client": i} for i in clients])
    stopped = (0, exit_code(signal.SIGINT), exit_code(signal.SIGTERM))
    failed = [
        f"client {i}: {e.splitlines()[-1]}" for i, (c, e) in enumerate(zip(codes, errors)) if c not in stopped and e
    ]
    if failed and doc["status"] == "completed":
        doc["status"], doc["error"] = "failed", "; ".join(failed)
    if stop["signal"] is not None:
        doc["stop_signal"] = signal_name(stop["signal"])
    print_sources(doc)
    return finish(doc, cfg, output, is_default)


def _supervise(cfg: BenchConfig, procs: list[subprocess.Popen], workdir: str, stop: dict) -> list[int]:
    """Wait for the clients with an aggregate live view; on SIGINT/SIGTERM (forwarded as received) or a failing
    client (SIGINT), stop them all. The signal received is left in stop["signal"]."""
    stopping = False

    def stop_all(signum=signal.SIGINT, _frame=None):
        nonlocal stopping
        if _frame is not None:
            stop["signal"] = signum
        stopping = True
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    with stop_signals_handled(stop_all), LiveView(cfg.duration, enabled=cfg.progress) as view:
        start = time.monotonic()
        while any(p.poll() is None for p in procs):
            time.sleep(0.5)
            if not stopping and any(p.poll() not in (None, 0) for p in procs):
                stop_all()
            snap = _aggregate_status(workdir, len(procs))
            if snap:
                snap["t_s"] = round(time.monotonic() - start, 2)
                view.update(snap)
    return [p.returncode for p in procs]


def _aggregate_status(workdir: str, n: int) -> dict | None:
    snaps = []
    for i in range(n):
        try:
            with open(os.path.join(workdir, f"client-{i}.status")) as f:
                snaps.append(json.load(f))
        except (OSError, json.JSONDecodeError):
            continue
    return sum_snapshots(snaps)


def sum_snapshots(snaps: list[dict]) -> dict | None:
    """Live snapshots of several clients or ranks as one (for the aggregate view); None when there are none."""
    if not snaps:
        return None
    total = {"requests": 0, "read_bytes": 0, "written_bytes": 0, "users": 0, "tiers": {}}
    for s in snaps:
        for k in ("requests", "read_bytes", "written_bytes", "users"):
            total[k] += s.get(k, 0)
        for name, t in s["tiers"].items():
            agg = total["tiers"].setdefault(name, {"entries": 0, "used_bytes": 0})
            agg["entries"] += t["entries"]
            agg["used_bytes"] += t["used_bytes"]
    return total


def merge(docs: list[dict], cfg: BenchConfig, *_unused) -> dict:
    """The clients' documents as one (kept for callers of the earlier signature, whose device counters the merge
    now takes from the clients themselves): `merge.merge_results`."""
    return merge_results(docs, [f"client-{d.get('client', i)}" for i, d in enumerate(docs)], cfg)
