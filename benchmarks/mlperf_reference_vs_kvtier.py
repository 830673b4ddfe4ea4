#!/usr/bin/env python3
"""kvtier bench and the MLPerf KV Cache reference implementation, side by side on the same device, same flags.

The reference is kv_cache_benchmark/ of a checkout of the hazemawadalla/storage repository (a fork of
mlcommons/storage); it is run from that checkout, never copied here. Its Python dependencies go into their own venv
(--ref-venv, default ~/.cache/kvtier/mlperf-reference-venv), created when missing with pip from PyPI: numpy and
pyyaml, the two "core" lines of its requirements.txt (torch, tiktoken, pandas and openpyxl are optional there and
not needed with --gpu-mem-gb 0, the synthetic workload and JSON output).

Three sides, each run --rounds times per model, the order reversed every round (a disk whose speed drifts weighs on
all sides alike):
  reference        python kv-cache.py FLAGS
  kvtier           kvtier bench FLAGS --request-model kvtier       (kvtier's request model: per-turn increments)
  kvtier-refmodel  kvtier bench FLAGS --request-model reference    (the reference's request semantics, kvtier's
                                                                    default; given explicitly all the same)
FLAGS = --config CONFIG --model M --num-users U --duration D --gpu-mem-gb 0 --cpu-mem-gb 0 --generation-mode G
        --seed 42 --storage-capacity-gb S --cache-dir <fresh dir under --dir> --output <json>
CONFIG is the reference's own kv_cache_benchmark/config.yaml for both tools. The flags mean the same in both
(kvtier's `--help` and replay/synthetic/README.md; the reference's kv_cache/cli.py): --duration is the measurement
window in seconds, --storage-capacity-gb the disk tier's size in GiB (the reference's 0 = "95% of the free space" is
avoided); kvtier is given --size-unit GiB explicitly (its default), so both tiers hold the same bytes. G is
--generation-mode (none by default): with fast or realistic both tools wait the same simulated generation per token,
so neither is bound by its own I/O or CPU and their queues serve alike (the fair way to compare request mixes).

Per run:
  process R/W    bytes the child process itself read from / wrote to the block layer (wait4 rusage ru_inblock /
                 ru_oublock, the counters of /proc/PID/io): only that process's I/O, whoever else uses the disk
  diskstats R/W  the device's own counters (/proc/diskstats of the disk under --dir) over the child's life: includes
                 every other process's I/O on that disk, so on a shared disk it is an upper bound
  reported R/W   what the tool says it read / wrote to its storage tier (reference: summary.cache_stats.total_*_bytes;
                 kvtier: storage_stats.total_*_bytes)
  CPU-s/GiB      the child's user + system CPU seconds (rusage) per GiB the process moved (process R + W)
  wall = setup + window + after
                 the child's whole life split at the tool's measurement window (summary.elapsed_time): the
                 reference's window starts at its "Starting benchmark" line (the log's lines are time-stamped here),
                 kvtier's at summary.window.start_unix_s
  dev GB/s       process R + W inside the window (from /proc/PID/io, sampled every 0.5 s) over the window
  GB after window  process I/O after the window ended: the reference joins its workers with a 2 s timeout each
                 while they finish their requests, and counts what finishes before its statistics (divided by the
                 window)
  decode_bytes_read_gb   kvtier's (summary.cache_stats); the reference's code does not write this key (the spec's
                 name for it), so it is '-' there
Then the ratio kvtier / reference of each figure per round, and the median and range over the rounds.
GB = 1e9 bytes, GiB = 2^30. Every run's cache directory is created here and removed after the run; the tools' JSON
and console logs are kept in --logs (default: next to --json).

A child whose resident memory passes --max-rss-gb is stopped (the reference holds whole entries in memory, up to
2 GiB each for llama3.1-8b) and the run is reported as failed; so is one that passes --run-timeout-s.
On this machine the reference's GPU tier cannot be used (no GPU): --gpu-mem-gb is 0 for both tools.

examples:
  git clone https://github.com/hazemawadalla/storage /var/tmp/mlperf-ref
  python benchmarks/mlperf_reference_vs_kvtier.py --reference /var/tmp/mlperf-ref --dir /var/tmp/kvbench
  python benchmarks/mlperf_reference_vs_kvtier.py --reference /var/tmp/mlperf-ref --dir /mnt/nvme/kvbench \\
      --models tiny-1b --num-users 8 --duration 30 --rounds 3 --json mlperf-vs-kvtier.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from kvconnector.files import atomic_path
from replay.common.cli import OneLineParser, fail, stop_signals_raise
from replay.outputs.paths import check_outputs, default_results_path
from replay.outputs.provenance import write_run_json
from replay.synthetic.sysinfo import block_device_of, disk_counters

ROOT = Path(__file__).resolve().parents[1]
PROG = "mlperf_reference_vs_kvtier"
CLONE = "git clone https://github.com/hazemawadalla/storage"
GB = 1e9
GIB = float(1 << 30)
SECTOR = 512
SIDES = ("reference", "kvtier", "kvtier-refmodel")
REF_PACKAGES = ("numpy", "pyyaml")
POLL_S = 0.5
PROGRESS_S = 5.0


def parse_args(argv: list[str] | None):
    p = OneLineParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reference", metavar="DIR", help="checkout of hazemawadalla/storage (or its kv_cache_benchmark/)")
    p.add_argument("--dir", default="/var/tmp/kvtier-mlperf-vs", help="directory on the device under test")
    p.add_argument("--models", default="tiny-1b,llama3.1-8b", help="comma-separated (default: %(default)s)")
    p.add_argument("--num-users", type=int, default=8)
    p.add_argument("--duration", type=int, default=20, help="measurement window, seconds (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument(
        "--generation-mode",
        choices=("none", "fast", "realistic"),
        default="none",
        help="simulated generation per token, both tools (default: %(default)s; fast or realistic bound both by the "
        "same generation time instead of each by its own I/O and CPU)",
    )
    p.add_argument("--storage-capacity-gb", type=float, default=20.0, help="disk tier, GiB (default: %(default)s)")
    p.add_argument("--config", help="config.yaml for both tools (default: the reference's own)")
    p.add_argument("--sides", default=",".join(SIDES), help="comma-separated subset of: " + ", ".join(SIDES))
    p.add_argument("--ref-venv", default=os.path.join(_cache_home(), "kvtier", "mlperf-reference-venv"))
    p.add_argument("--max-rss-gb", type=float, default=None, help="stop a child above this RSS (default: 70%% of "
                   "the memory available at the start)")  # fmt: skip
    p.add_argument("--run-timeout-s", type=float, default=None, help="per run (default: 3 x duration + 180)")
    p.add_argument("--json", help="results file (default: results/<time>.json)")
    p.add_argument("--logs", help="where the tools' JSON and console logs go (default: <json stem>-runs/)")
    return p.parse_args(argv)


def _cache_home() -> str:
    return os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")


def bench_dir(reference: str | None) -> Path | None:
    """The kv_cache_benchmark folder of a checkout (or the folder itself), or None."""
    if not reference:
        return None
    for cand in (Path(reference) / "kv_cache_benchmark", Path(reference)):
        if (cand / "kv-cache.py").is_file() and (cand / "kv_cache").is_dir():
            return cand
    return None


def validate(a) -> str | None:
    """The first mistake on the command line, as the one line to print, or None."""
    if bench_dir(a.reference) is None:
        where = a.reference or "DIR"
        return f"--reference {where}: no kv_cache_benchmark/kv-cache.py there; get it with: {CLONE} {where}"
    for name in ("num_users", "duration", "rounds"):
        if getattr(a, name) < 1:
            return f"--{name.replace('_', '-')} {getattr(a, name)}: must be at least 1"
    if a.storage_capacity_gb <= 0:
        return f"--storage-capacity-gb {a.storage_capacity_gb:g}: must be above 0 (the reference reads 0 as 'all')"
    sides = [s for s in a.sides.split(",") if s]
    bad = [s for s in sides if s not in SIDES]
    if bad or not sides:
        return f"--sides {a.sides}: choose from {', '.join(SIDES)}"
    if "reference" not in sides:
        return f"--sides {a.sides}: the reference side is what the ratios divide by"
    a.sides = [s for s in SIDES if s in sides]
    a.models = [m for m in a.models.split(",") if m]
    if not a.models:
        return "--models: give at least one model"
    a.config = a.config or str(bench_dir(a.reference) / "config.yaml")
    if not os.path.isfile(a.config):
        return f"--config {a.config}: no such file"
    return None


def space_problem(a) -> str | None:
    """--dir made and its free space checked: after the outputs are claimed, so a user's mistake is said first."""
    try:
        os.makedirs(a.dir, exist_ok=True)
        free = shutil.disk_usage(a.dir).free
    except OSError as exc:
        return f"--dir {a.dir}: {exc.strerror}"
    if free < (a.storage_capacity_gb + 2) * GIB:
        return (
            f"--dir {a.dir}: {free / GIB:.1f} GiB free, the runs need --storage-capacity-gb "
            f"{a.storage_capacity_gb:g} + 2 GiB"
        )
    return None


def ref_python(venv: str) -> tuple[str, str]:
    """The reference venv's python, created (pip from PyPI) when missing or incomplete; (path, what was done)."""
    py = os.path.join(venv, "bin", "python")
    probe = [py, "-c", "import numpy, yaml; print(numpy.__version__, yaml.__version__)"]
    if os.path.exists(py):
        r = subprocess.run(probe, capture_output=True, text=True)
        if r.returncode == 0:
            return py, f"numpy/pyyaml {r.stdout.strip()} (existing venv)"
    print(f"{PROG}: creating {venv} for the reference (pip from PyPI: {', '.join(REF_PACKAGES)})", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    subprocess.run([py, "-m", "pip", "install", "-q", *REF_PACKAGES], check=True)
    r = subprocess.run(probe, capture_output=True, text=True, check=True)
    return py, f"numpy/pyyaml {r.stdout.strip()} (installed now)"


def git_commit(path: Path) -> str | None:
    r = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True)
    return r.stdout.strip() or None if r.returncode == 0 else None


def command(side: str, a, model: str, cache: str, out: str, py: str, bdir: Path) -> tuple[list[str], str]:
    """The child's argv and working directory: both tools get the same flags."""
    flags = ["--config", os.path.abspath(a.config), "--model", model, "--num-users", str(a.num_users)]
    flags += ["--duration", str(a.duration), "--gpu-mem-gb", "0", "--cpu-mem-gb", "0"]
    flags += ["--generation-mode", a.generation_mode]
    flags += ["--seed", str(a.seed), "--cache-dir", cache, "--output", out]
    if side == "reference":
        return [py, "kv-cache.py", *flags, "--storage-capacity-gb", f"{a.storage_capacity_gb:g}"], str(bdir)
    # The same tier size in bytes: both read the number as GiB (kvtier's default unit, given explicitly so a change of
    # default cannot make the tiers differ), and each kvtier side names its request model.
    extra = ["--storage-capacity-gb", f"{a.storage_capacity_gb:g}", "--size-unit", "GiB"]
    extra += ["--request-model", "reference" if side == "kvtier-refmodel" else "kvtier"]
    return [sys.executable, "-m", "replay.cli", "bench", *flags, *extra], str(ROOT)


def proc_io(pid: int) -> tuple[int, int] | None:
    """Bytes the process made the block layer read and write (/proc/PID/io, through psutil)."""
    try:
        io = psutil.Process(pid).io_counters()
    except psutil.Error:
        return None
    return io.read_bytes, io.write_bytes


def proc_rss(pid: int) -> int:
    try:
        return psutil.Process(pid).memory_info().rss
    except psutil.Error:
        return 0


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the child's process group, SIGKILL after 10 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def run_one(side: str, model: str, rnd: int, a, ctx: dict, label: str) -> dict:
    """One child run: start it, watch it (progress, RSS, timeout), then its rusage, counters and JSON."""
    name = f"{model}-{side}-r{rnd}"
    cache = os.path.join(ctx["work"], name)
    out = os.path.join(ctx["logs"], name + ".json")
    log = os.path.join(ctx["logs"], name + ".log")
    os.makedirs(cache)
    argv, cwd = command(side, a, model, cache, out, ctx["py"], ctx["bdir"])
    rec: dict = {"model": model, "side": side, "round": rnd, "argv": argv, "log": log, "output": out}
    os.sync()  # other writers' dirty pages go out before the counters start, not during the run
    load0 = os.getloadavg()[0]
    d0 = disk_counters(ctx["device"])
    t0, t0_unix = time.monotonic(), time.time()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    marks: dict = {}
    logger = threading.Thread(target=_log_lines, args=(proc.stdout, log, t0, marks), daemon=True)
    logger.start()
    samples = [(0.0, 0, 0)]  # (s since the start, process bytes read, written): where in time the I/O happened
    io_first = io_last = None
    last_io = (0, 0)
    peak_rss = 0
    stopped = None
    next_progress = t0 + PROGRESS_S
    try:
        while True:
            pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            now = time.monotonic()
            io = proc_io(proc.pid)
            if io is not None and io != last_io:
                io_first = io_first if io_first is not None else now - POLL_S / 2
                io_last, last_io = now, io
                samples.append((round(now - t0, 2), *io))
            rss = proc_rss(proc.pid)
            peak_rss = max(peak_rss, rss)
            if stopped is None and rss > ctx["max_rss"]:
                stopped = f"stopped: RSS {rss / GIB:.1f} GiB above --max-rss-gb {ctx['max_rss'] / GIB:.1f}"
                stop_group(proc)
            elif stopped is None and now - t0 > ctx["timeout"]:
                stopped = f"stopped: still running after --run-timeout-s {ctx['timeout']:g}"
                stop_group(proc)
            if now >= next_progress:
                next_progress += PROGRESS_S
                print(
                    f"  {label} {name}: {now - t0:5.0f} s, process read {last_io[0] / GB:6.2f} GB, "
                    f"written {last_io[1] / GB:6.2f} GB, RSS {rss / GIB:4.1f} GiB, load {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
            time.sleep(POLL_S)
    except BaseException:
        stop_group(proc)
        os.wait4(proc.pid, 0)
        raise
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    wall = time.monotonic() - t0
    logger.join(timeout=5)
    d1 = disk_counters(ctx["device"])
    code = os.waitstatus_to_exitcode(status)
    rec.update(
        exit_code=code,
        status=stopped or ("ok" if code == 0 else f"exit {code}"),
        wall_s=round(wall, 2),
        cpu_s=round(ru.ru_utime + ru.ru_stime, 3),
        cpu_user_s=round(ru.ru_utime, 3),
        cpu_sys_s=round(ru.ru_stime, 3),
        peak_rss_bytes=max(peak_rss, ru.ru_maxrss * 1024),
        process_read_bytes=ru.ru_inblock * SECTOR,
        process_write_bytes=ru.ru_oublock * SECTOR,
        io_span_s=round(io_last - io_first, 2) if io_first is not None and io_last > io_first else None,
        load_before=round(load0, 2),
        load_after=round(os.getloadavg()[0], 2),
    )
    if d0 and d1:
        delta = d1.minus(d0)
        rec["diskstats_read_bytes"], rec["diskstats_write_bytes"] = delta["read_bytes"], delta["written_bytes"]
    rec.update(reported(side, out))
    rec["status"] = judge(rec)
    # Where the window lay in the child's life: the reference prints a line as it starts its clock, kvtier writes
    # the window's start time into its JSON.
    start_unix = rec.pop("window_start_unix", None)
    rec["setup_s"] = round(start_unix - t0_unix, 2) if start_unix else marks.get("start")
    rec["io_samples"] = samples
    derive(rec)
    return rec


START_MARK = b"Starting benchmark"  # the reference's line just before it starts its window


def _log_lines(pipe, log: str, t0: float, marks: dict) -> None:
    """Copy the child's output to `log`, each line stamped with the seconds since the child started."""
    with open(log, "wb") as f:
        for line in pipe:
            t = time.monotonic() - t0
            if START_MARK in line and "start" not in marks:
                marks["start"] = round(t, 2)
            f.write(b"%8.2f  " % t + line)


def _get(doc: dict, path: str):
    for part in path.split("."):
        if not isinstance(doc, dict) or part not in doc:
            return None
        doc = doc[part]
    return doc


def reported(side: str, out: str) -> dict:
    """The tool's own figures from its JSON (None where it wrote none)."""
    try:
        with open(out) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return {"reported": False}
    s = doc.get("summary") or {}
    src = "cache_stats" if side == "reference" else "storage_stats"
    decode = _get(s, "cache_stats.decode_bytes_read_gb") if side != "reference" else None
    return {
        "reported": True,
        "requests": s.get("total_requests", doc.get("requests_completed")),
        "window_s": s.get("elapsed_time"),
        "reported_read_bytes": _get(s, f"{src}.total_read_bytes"),
        "reported_write_bytes": _get(s, f"{src}.total_write_bytes"),
        "decode_bytes_read_gb": decode,
        "window_start_unix": _get(s, "window.start_unix_s"),
    }


def judge(rec: dict) -> str:
    """A run's status: a clean exit counts only with a results file that has a window."""
    if rec["status"] != "ok":
        return rec["status"]
    if not rec.get("reported"):
        return "no results file"
    if not rec.get("window_s"):
        return "no summary (no request completed)"  # the reference writes none then, and exits 0
    return "ok"


def _bytes_at(samples: list, t: float) -> int:
    """Process bytes (read + written) moved by time `t` (the last sample at or before it)."""
    moved = 0
    for ts, rd, wr in samples:
        if ts > t:
            break
        moved = rd + wr
    return moved


def derive(r: dict) -> None:
    moved = r["process_read_bytes"] + r["process_write_bytes"]
    r["cpu_s_per_gib"] = round(r["cpu_s"] / (moved / GIB), 3) if moved else None
    win, setup = r.get("window_s"), r.get("setup_s")
    r["wall_over_window"] = round(r["wall_s"] / win, 2) if win else None
    r["io_span_over_window"] = round(r["io_span_s"] / win, 2) if win and r.get("io_span_s") else None
    r["device_gbps"] = r["after_window_s"] = r["io_after_window_bytes"] = r["io_before_window_bytes"] = None
    if win and setup is not None:
        # Bandwidth in the window: process bytes between the window's start and end (0.5 s samples) over its length.
        before, by_end = _bytes_at(r["io_samples"], setup), _bytes_at(r["io_samples"], setup + win)
        r["device_gbps"] = round((by_end - before) / GB / win, 3)
        r["after_window_s"] = round(r["wall_s"] - setup - win, 2)
        r["io_before_window_bytes"] = before
        r["io_after_window_bytes"] = max(0, moved - by_end)
    for op, rep in (("read", "reported_read_bytes"), ("write", "reported_write_bytes")):
        got = r.get(rep)
        r[f"device_over_reported_{op}"] = round(r[f"process_{op}_bytes"] / got, 3) if got else None


RATIO_KEYS = (
    "device_gbps",
    "cpu_s_per_gib",
    "process_read_bytes",
    "process_write_bytes",
    "requests",
    "wall_over_window",
    "io_span_over_window",
)


def ratios(runs: list[dict]) -> list[dict]:
    """kvtier / reference per figure, per model and kvtier side: one ratio per round (same round's runs)."""
    ok = {(r["model"], r["side"], r["round"]): r for r in runs if r["status"] == "ok"}
    out = []
    for model in dict.fromkeys(r["model"] for r in runs):
        for side in ("kvtier", "kvtier-refmodel"):
            for key in RATIO_KEYS:
                vals = []
                for (m, s, rnd), r in ok.items():
                    ref = ok.get((m, "reference", rnd))
                    if m == model and s == side and ref and r.get(key) and ref.get(key):
                        vals.append(r[key] / ref[key])
                row = {"model": model, "side": side, "figure": key, "rounds": len(vals)}
                if vals:
                    row.update(median=round(statistics.median(vals), 3), min=round(min(vals), 3))
                    row.update(max=round(max(vals), 3), per_round=[round(v, 3) for v in vals])
                out.append(row)
    return out


def _gb(v) -> str:
    return "-" if v is None else f"{v / GB:.2f}"


def print_tables(runs: list[dict], rats: list[dict]) -> None:

    from replay.outputs.tables import rows_table
    from replay.outputs.terminal import console

    rows = []
    for r in runs:
        rows.append(
            {
                "run": f"{r['model']} {r['side']} r{r['round']}",
                "status": r["status"],
                "req": r.get("requests"),
                "rw": f"{_gb(r.get('reported_read_bytes'))} / {_gb(r.get('reported_write_bytes'))}",
                "pw": f"{_gb(r['process_read_bytes'])} / {_gb(r['process_write_bytes'])}",
                "ds": f"{_gb(r.get('diskstats_read_bytes'))} / {_gb(r.get('diskstats_write_bytes'))}",
                "dr": f"{r.get('device_over_reported_read') or '-'} / {r.get('device_over_reported_write') or '-'}",
                "gbps": r.get("device_gbps"),
                "cpu": r.get("cpu_s_per_gib"),
                "win": f"{r['wall_s']:.0f} / {r.get('setup_s') or 0:.0f} / {r.get('window_s') or 0:.1f} / "
                f"{r.get('after_window_s') or 0:.0f}",
                "after": _gb(r.get("io_after_window_bytes")),
                "dec": r.get("decode_bytes_read_gb"),
            }
        )
    cols = [
        ("run", "run"),
        ("status", "status"),
        ("req", "requests"),
        ("rw", "reported R/W GB"),
        ("pw", "process R/W GB"),
        ("ds", "diskstats R/W GB"),
        ("dr", "process/reported R/W"),
        ("gbps", "dev GB/s"),
        ("cpu", "CPU-s/GiB"),
        ("win", "wall = setup + window + after, s"),
        ("after", "GB after window"),
        ("dec", "decode_bytes_read_gb"),
    ]
    con = console(min_width=240)
    con.print(rows_table("per run (process = the child's own block I/O; diskstats = the whole device)", rows, cols))
    ratio_rows = [
        {
            "what": f"{r['model']} {r['side']}",
            "figure": r["figure"],
            "median": r.get("median"),
            "range": f"{r['min']}-{r['max']}" if r["rounds"] else "-",
            "n": r["rounds"],
        }
        for r in rats
    ]
    cols = [("what", "kvtier side"), ("figure", "figure"), ("median", "kvtier/ref median")]
    cols += [("range", "range"), ("n", "rounds")]
    con.print(rows_table("kvtier / reference, per round then median", ratio_rows, cols))


COLORS = {"reference": "tab:gray", "kvtier": "tab:blue", "kvtier-refmodel": "tab:green"}


def write_plot(doc: dict, path: str) -> None:
    """Three panels, one column per model and side, one mark per round: bandwidth in the window, CPU per GiB, and
    each run's life split into set-up, window and after (bars: the median round)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    runs = [r for r in doc["runs"] if r["status"] == "ok"]
    cols = list(dict.fromkeys((r["model"], r["side"]) for r in runs))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8))
    panels = (("device_gbps", "process I/O in the window, GB/s"), ("cpu_s_per_gib", "CPU-s per GiB moved"))
    for ax, (key, title) in zip(axes, panels, strict=False):
        for i, col in enumerate(cols):
            vals = [r[key] for r in runs if (r["model"], r["side"]) == col and r.get(key) is not None]
            ax.scatter([i] * len(vals), vals, color=COLORS[col[1]], zorder=3)
            if vals:
                ax.bar(i, statistics.median(vals), color=COLORS[col[1]], alpha=0.35)
        ax.set_title(title)
    ax = axes[2]
    for i, col in enumerate(cols):
        mine = [r for r in runs if (r["model"], r["side"]) == col and r.get("setup_s") is not None]
        if not mine:
            continue
        r = sorted(mine, key=lambda x: x["wall_s"])[len(mine) // 2]
        parts = (r["setup_s"], r["window_s"], max(0.0, r["wall_s"] - r["setup_s"] - r["window_s"]))
        bottom = 0.0
        for part, shade in zip(parts, ("#bbbbbb", COLORS[col[1]], "tab:red"), strict=True):
            ax.bar(i, part, bottom=bottom, color=shade)
            bottom += part
        gb = (r.get("io_after_window_bytes") or 0) / GB
        ax.text(i, bottom, f"{gb:.1f} GB\nafter", ha="center", va="bottom", fontsize=7)
    ax.set_title("wall time of the median round, s")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.12)
    handles = [Patch(color="#bbbbbb", label="set-up"), Patch(facecolor="none", edgecolor="black", label="window")]
    ax.legend(handles=[*handles, Patch(color="tab:red", label="after the window")], fontsize=8, loc="upper right")
    labels = [f"{m}\n{s}" for m, s in cols]
    for ax in axes:
        ax.set_xticks(range(len(cols)), labels, rotation=35, ha="right", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    f = doc["flags"]
    load = (doc["host"]["load_at_start"][0], doc["host"].get("load_at_end", [0])[0])
    fig.suptitle(
        f"MLPerf reference vs kvtier bench: {f['num_users']} users, {f['duration']} s, gpu/cpu 0, "
        f"generation {f.get('generation_mode', 'none')}, "
        f"seed {f['seed']}; {doc['started_at']}, load {load[0]:.1f} -> {load[1]:.1f} on {doc['host']['cpu_count']} "
        "CPUs",
        fontsize=10,
    )
    fig.tight_layout()
    with atomic_path(path, suffix=".png.tmp") as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)


def plan(a) -> list[tuple[str, int, str]]:
    """(model, round, side) in run order: rounds outside, models inside, the side order reversed every round."""
    order = []
    for rnd in range(1, a.rounds + 1):
        for model in a.models:
            sides = a.sides if rnd % 2 else list(reversed(a.sides))
            order += [(model, rnd, s) for s in sides]
    return order


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    msg = validate(a)
    if msg:
        return fail(PROG, msg)
    json_path = a.json or default_results_path()
    if os.path.lexists(json_path):
        return fail(PROG, f"--json {json_path}: exists; give a new name (nothing is overwritten)")
    logs = a.logs or os.path.splitext(json_path)[0] + "-runs"
    try:
        check_outputs({"--json": json_path}, {"--logs": logs})
        if os.path.isdir(logs) and os.listdir(logs):
            return fail(PROG, f"--logs {logs}: not empty; give a new or empty folder (nothing is overwritten)")
        os.makedirs(logs, exist_ok=True)
    except ValueError as exc:
        return fail(PROG, str(exc))
    except OSError as exc:
        return fail(PROG, f"--logs {logs}: {exc.strerror}")
    msg = space_problem(a)
    if msg:
        return fail(PROG, msg)
    bdir = bench_dir(a.reference)
    try:
        py, venv_note = ref_python(a.ref_venv)
    except (subprocess.CalledProcessError, OSError) as exc:
        return fail(PROG, f"--ref-venv {a.ref_venv}: could not prepare it ({exc}); pip install numpy pyyaml there")
    avail = _mem_available()
    ctx = {
        "py": py,
        "bdir": bdir,
        "logs": logs,
        "work": os.path.join(a.dir, f"mlperf-vs-kvtier-{os.getpid()}"),
        "device": block_device_of(a.dir),
        "max_rss": (a.max_rss_gb * GIB) if a.max_rss_gb else 0.7 * avail,
        "timeout": a.run_timeout_s or 3 * a.duration + 180,
    }
    doc = {
        "command": [os.path.relpath(__file__, os.getcwd()), *(argv if argv is not None else sys.argv[1:])],
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": {"cpu_count": os.cpu_count(), "mem_available_bytes": avail, "load_at_start": os.getloadavg()},
        "device": ctx["device"],
        "dir": os.path.abspath(a.dir),
        "reference": {"dir": str(bdir), "commit": git_commit(bdir), "python": py, "deps": venv_note},
        "flags": {
            "config": os.path.abspath(a.config),
            "num_users": a.num_users,
            "duration": a.duration,
            "seed": a.seed,
            "storage_capacity_gib": a.storage_capacity_gb,
            "gpu_mem_gb": 0,
            "cpu_mem_gb": 0,
            "generation_mode": a.generation_mode,
        },
        "runs": [],
    }
    todo = plan(a)
    print(
        f"{PROG}: {len(todo)} runs of {a.duration} s ({', '.join(a.models)}; {', '.join(a.sides)}; "
        f"{a.rounds} rounds) on {ctx['device'] or 'no block device'} under {a.dir}; load {os.getloadavg()[0]:.1f}, "
        f"{os.cpu_count()} CPUs; reference {doc['reference']['commit'] or '?'}",
        flush=True,
    )
    code = 0
    try:
        with stop_signals_raise():
            os.makedirs(ctx["work"])
            for i, (model, rnd, side) in enumerate(todo, 1):
                label = f"[{i}/{len(todo)}]"
                r = run_one(side, model, rnd, a, ctx, label)
                doc["runs"].append(r)
                print(
                    f"{label} {model} {side} round {rnd}: {r['status']}, {r.get('requests')} requests, "
                    f"dev {r['device_gbps'] or '-'} GB/s, {r['cpu_s_per_gib'] or '-'} CPU-s/GiB, "
                    f"wall {r['wall_s']:.0f} s for a {r.get('window_s') or 0:.0f} s window",
                    flush=True,
                )
                if r["status"] != "ok":
                    code = 1
    except KeyboardInterrupt as exc:
        code = getattr(exc, "exit_code", 130)
        doc["interrupted"] = True
        print(f"{PROG}: interrupted; writing the {len(doc['runs'])} finished runs", file=sys.stderr)
    finally:
        shutil.rmtree(ctx["work"], ignore_errors=True)
    doc["ended_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    doc["host"]["load_at_end"] = os.getloadavg()
    doc["ratios"] = ratios(doc["runs"])
    write_run_json(json_path, doc, argv=argv)
    written = [json_path]
    if doc["runs"]:
        print_tables(doc["runs"], doc["ratios"])
        written.append(os.path.splitext(json_path)[0] + ".png")
        write_plot(doc, written[-1])
    print(f"results: {', '.join(written)} (the tools' own JSON and logs: {logs})")
    return code


def _mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 8 << 30


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a killed child leaves no multi-GiB core file behind
    sys.exit(main())
