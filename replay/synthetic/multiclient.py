"""`kvtier bench --num-clients N`: N worker processes (past the GIL), one aggregate view, one merged result.

Each client is a `kvtier bench` process with its share of the users, its own cache subdirectory, its share of the
CPU/GPU/disk capacities, and seed + i. The parent shows the clients' summed progress, forwards Ctrl-C, stops every
client when one fails, and merges the results: bytes, counts and capacities add up; latency percentiles come from
the merged histograms (never averaged or maxed); bandwidth is summed bytes over the longest client's elapsed time;
the block device is measured once, by the parent. Each client's own result is kept under `clients`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import yaml

from kvconnector.units import GB

from ..cli_common import STOP_SIGNALS, Interrupted, exit_code, signal_name, stop_signals_raise
from ..outputs.paths import os_reason
from . import sysinfo
from .config import BenchConfig
from .finish import _fail, finish
from .results import document_keys, fallbacks, merge_tier_details, request_histograms, request_stats_of_docs
from .results import summary as run_summary
from .view import STATUS_ENV, LiveView

ORDER = {"completed": 0, "interrupted": 1, "failed": 2}


def split(total: int, n: int, i: int) -> int:
    return total // n + (1 if i < total % n else 0)


def client_config(cfg: BenchConfig, i: int, workdir: str, cache_base: str) -> dict:
    n = cfg.num_clients
    data = cfg.model_dump(mode="json")
    data.update(
        num_clients=1,
        num_users=split(cfg.num_users, n, i),
        seed=(cfg.seed or 0) + i,
        output=os.path.join(workdir, f"client-{i}.json"),
        cache_dir=os.path.join(cache_base, f"client-{i}"),
        progress=False,
        xlsx_output=None,
        csv_output=None,
        plots=None,
        max_requests=split(cfg.max_requests, n, i) if cfg.max_requests else 0,
        request_rate=cfg.request_rate / n,
        cpu_mem_gb=cfg.cpu_mem_gb / n,
        gpu_mem_gb=None if cfg.gpu_mem_gb is None else cfg.gpu_mem_gb / n,
        storage_capacity_gb=cfg.storage_capacity_gb / n,
        io_trace_log=f"{cfg.io_trace_log}.client-{i}" if cfg.io_trace_log else None,
    )
    return data


def run_clients(cfg: BenchConfig, output: str, is_default: bool = False) -> int:
    if cfg.num_users < cfg.num_clients:
        return _fail(f"--num-clients {cfg.num_clients} needs at least as many users (--num-users {cfg.num_users})")
    if cfg.seed is None:
        cfg = cfg.model_copy(update={"seed": int(time.time()) % 2**31})
    workdir = tempfile.mkdtemp(prefix="kvtier-clients-")
    cache_base = (
        os.path.abspath(cfg.cache_dir) if cfg.cache_dir else tempfile.mkdtemp(prefix="kvtier-clients-", dir="/var/tmp")
    )
    try:  # the block device is looked up from the directory, so it must exist before the clients make it
        os.makedirs(cache_base, exist_ok=True)
    except OSError as exc:
        shutil.rmtree(workdir, ignore_errors=True)
        return _fail(f"--cache-dir {cfg.cache_dir}: cannot create it ({os_reason(exc)})")
    procs: list[subprocess.Popen] = []
    env_dev = sysinfo.block_device_of(cache_base)
    disk0 = sysinfo.disk_counters(env_dev)
    t0 = time.perf_counter()
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
                    )
                )
        codes = _supervise(cfg, procs, workdir, stop)
        disk1 = sysinfo.disk_counters(env_dev)
        wall = time.perf_counter() - t0
        errors = [p.stderr.read().strip() for p in procs]
        docs = []
        for i in range(cfg.num_clients):
            try:
                with open(os.path.join(workdir, f"client-{i}.json")) as f:
                    docs.append({"client": i, **json.load(f)})
            except (OSError, json.JSONDecodeError):
                pass
    except Interrupted as exc:
        return _fail(f"interrupted while starting the clients ({exc}); no results", exc.exit_code)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(workdir, ignore_errors=True)
        if not cfg.cache_dir:
            shutil.rmtree(cache_base, ignore_errors=True)
    if not docs:
        msg = next((e.splitlines()[-1] for e in errors if e), "no client produced results")
        return _fail(f"clients failed: {msg}", max(codes) or 1)
    doc = merge(docs, cfg, env_dev, disk0, disk1, wall)
    stopped = (0, exit_code(signal.SIGINT), exit_code(signal.SIGTERM))
    failed = [
        f"client {i}: {e.splitlines()[-1]}" for i, (c, e) in enumerate(zip(codes, errors)) if c not in stopped and e
    ]
    if failed and doc["status"] == "completed":
        doc["status"], doc["error"] = "failed", "; ".join(failed)
    if stop["signal"] is not None:
        doc["stop_signal"] = signal_name(stop["signal"])
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

    old = {sig: signal.signal(sig, stop_all) for sig in STOP_SIGNALS}
    try:
        with LiveView(cfg.duration, enabled=cfg.progress) as view:
            start = time.monotonic()
            while any(p.poll() is None for p in procs):
                time.sleep(0.5)
                if not stopping and any(p.poll() not in (None, 0) for p in procs):
                    stop_all()
                snap = _aggregate_status(workdir, len(procs))
                if snap:
                    snap["t_s"] = round(time.monotonic() - start, 2)
                    view.update(snap)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    return [p.returncode for p in procs]


def _aggregate_status(workdir: str, n: int) -> dict | None:
    total = {"requests": 0, "read_bytes": 0, "written_bytes": 0, "users": 0, "tiers": {}}
    seen = False
    for i in range(n):
        try:
            with open(os.path.join(workdir, f"client-{i}.status")) as f:
                s = json.load(f)
        except (OSError, json.JSONDecodeError):
            continue
        seen = True
        for k in ("requests", "read_bytes", "written_bytes", "users"):
            total[k] += s.get(k, 0)
        for name, t in s["tiers"].items():
            agg = total["tiers"].setdefault(name, {"entries": 0, "used_bytes": 0})
            agg["entries"] += t["entries"]
            agg["used_bytes"] += t["used_bytes"]
    return total if seen else None


def merge(docs: list[dict], cfg: BenchConfig, device: str | None, disk0, disk1, wall_s: float) -> dict:
    tiers = merge_tier_details([d["tiers"] for d in docs])
    events: dict = {}
    for d in docs:
        for k, v in d.get("store_events", {}).items():
            events[k] = events.get(k, 0) + v
    req = request_stats_of_docs(docs)
    status = max((d["status"] for d in docs), key=lambda s: ORDER.get(s, 2))
    # The longest client sets the elapsed time (bandwidth is summed bytes over it) and stands for the window.
    longest = max(docs, key=lambda d: d["summary"]["elapsed_time"])
    elapsed = longest["summary"]["elapsed_time"]
    # Every client has the same number of I/O workers: the share of all workers' time, weighted by each one's run.
    ran_s = sum(d["summary"]["elapsed_time"] for d in docs)
    busy_s = sum(d["summary"].get("io_saturation", 0.0) * d["summary"]["elapsed_time"] for d in docs)
    summary = run_summary(
        req,
        cfg,
        status=status,
        elapsed_s=elapsed,
        tiers=tiers,
        events=events,
        bytes_per_token=docs[0]["model"]["bytes_per_token"],
        io_saturation=round(busy_s / ran_s, 4) if ran_s else 0.0,
        window=longest["summary"].get("window", {}),
        autoscaling=[d.get("autoscaling_stats", []) for d in docs],
        num_clients=len(docs),
    )
    block = None
    if disk0 and disk1:
        delta = disk1.minus(disk0)
        block = {
            "device": device,
            **delta,
            "read_gbps": round(delta["read_bytes"] / GB / wall_s, 4),
            "write_gbps": round(delta["written_bytes"] / GB / wall_s, 4),
            "note": "measured once by the parent over all clients' lifetime (start-up included)",
        }
    timeline = []
    for i in range(max(len(d["timeline"]) for d in docs)):
        rows = [d["timeline"][i] for d in docs if i < len(d["timeline"])]
        agg = {"t_s": max(r["t_s"] for r in rows), "tiers": {}}
        for k in ("requests", "read_bytes", "written_bytes", "users"):
            agg[k] = sum(r.get(k, 0) for r in rows)
        for r in rows:
            for name, t in r["tiers"].items():
                a = agg["tiers"].setdefault(name, {"entries": 0, "used_bytes": 0})
                a["entries"] += t["entries"]
                a["used_bytes"] += t["used_bytes"]
        timeline.append(agg)
    first = docs[0]
    return {
        "kvtier_version": first["kvtier_version"],
        "started_at": min(d["started_at"] for d in docs),
        "status": status,
        "error": "; ".join(d["error"] for d in docs if d.get("error")) or None,
        "notes": first["notes"] + [f"merged from {len(docs)} clients"],
        "model": first["model"],
        "workload": first["workload"],
        "config": cfg.model_dump(mode="json"),
        "environment": first["environment"] | {"cache_dir": os.path.dirname(first["environment"]["cache_dir"])},
        "setup": {f"client-{d.get('client', i)}": d.get("setup", {}) for i, d in enumerate(docs)},
        "summary": summary,
        **document_keys(summary),
        "tiers": tiers,
        "store_events": events,
        "block_device": block,
        "fallbacks": fallbacks(tiers),
        "request_histograms": request_histograms(req),
        "autoscaling_stats": [
            dict(s, client=d.get("client", i)) for i, d in enumerate(docs) for s in d.get("autoscaling_stats", [])
        ],
        "timeline": timeline,
        "clients": [{k: v for k, v in d.items() if k != "timeline"} for d in docs],
    }
