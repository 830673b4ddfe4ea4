#!/usr/bin/env python3
"""mlpstorage driving the MLPerf KV cache reference vs mlpstorage driving kvtier, the same short OPEN run each.

Both sides are one unchanged `mlpstorage open kvcache run` (the pinned rules-pr checkout, --mlpstorage, run by
--mlpstorage-python, which must also import numpy and pyyaml: the reference's kv-cache.py runs under the harness's
Python). Only --kvcache-bin-path differs:

  reference   a copy of the checkout's kv_cache_benchmark/ whose mlperf_wrapper.py sleeps 0 s before and after each
              run instead of 90 (mlpstorage passes no delay to the wrapper; the copy changes nothing else)
  kvtier      `kvtier mlperf shim DIR --start-delay 0 --end-delay 0`

Per side and rank count: /proc/diskstats of the cache directory's disk around each Option (split where mlpstorage
prints "Running option N"), the children's rusage (CPU seconds of mlpstorage, mpirun and every rank) and the wall time
around the whole run; per Option from mlpstorage's kvcache_run_summary_*.json: read and write GB/s, the p95 it scores,
storage tokens/s; from the rank files: the bytes each tool says it read and wrote.

  python benchmarks/mlperf_harness_side_by_side.py --mlpstorage /var/tmp/mlpstorage \\
      --mlpstorage-python /var/tmp/mlpstorage-venv/bin/python --dir /var/tmp/kvtier-mlperf-side --ranks 1 4
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

from replay.common.cli import fail
from replay.outputs.paths import default_results_path
from replay.outputs.provenance import write_run_json
from replay.synthetic.sysinfo import block_device_of, disk_counters

PROG = "mlperf_harness_side_by_side"
OPTIONS = (1, 2, 3)
GIB = 1 << 30
IDLE_S = 5.0


def parse_args(argv):
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mlpstorage", required=True, help="checkout of mlpstorage (rules-pr 2f65ef1)")
    p.add_argument("--mlpstorage-python", required=True, help="Python with mlpstorage's imports, numpy and pyyaml")
    p.add_argument("--dir", required=True, help="scratch directory: cache, results, shims (emptied per run)")
    p.add_argument("--ranks", type=int, nargs="+", default=[1])
    p.add_argument("--model", default="llama3.1-8b")
    p.add_argument("--num-users", type=int, default=4)
    p.add_argument("--duration", type=int, default=10)
    p.add_argument("--output", default=None, help="JSON of the run (default results/<datetime>.json)")
    return p.parse_args(argv)


def reference_bin(src: Path, scratch: Path) -> Path:
    """The reference's kv_cache_benchmark/ copied, its wrapper's 90 s delays set to 0 (nothing else changed)."""
    dst = scratch / "reference-bin"
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src / "kv_cache_benchmark", dst, ignore=shutil.ignore_patterns("tests", "docs", "vllm_lmcache*"))
    w = dst / "mlperf_wrapper.py"
    text = w.read_text()
    if "TEST_DELAY = 90\n" not in text:
        raise SystemExit(f"{PROG}: {w}: no 'TEST_DELAY = 90' to set to 0; the wrapper changed, look at it")
    w.write_text(text.replace("TEST_DELAY = 90\n", "TEST_DELAY = 0\n", 1))
    return dst / "kv-cache.py"


def kvtier_bin(scratch: Path) -> Path:
    d = scratch / "kvtier-shim"
    shutil.rmtree(d, ignore_errors=True)
    cmd = [sys.executable, "-m", "replay.cli", "mlperf", "shim", str(d), "--start-delay", "0", "--end-delay", "0"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return d / "kv-cache.py"


def drop_caches() -> bool:
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def _get(doc, path):
    for part in path.split("."):
        if not isinstance(doc, dict) or part not in doc:
            return None
        doc = doc[part]
    return doc


def rank_bytes(run_dir: Path, option: int) -> dict:
    """Bytes the tool itself says it read and wrote, summed over the Option's rank files, and its requests."""
    out = {"rank_files": 0, "reported_read_bytes": 0, "reported_write_bytes": 0, "requests": 0}
    for f in glob.glob(str(run_dir / f"option_{option}" / "trial_*" / "rank_*" / "kvcache_results_*.json")):
        with open(f) as fh:
            s = json.load(fh).get("summary") or {}
        out["rank_files"] += 1
        for key, dst in (("total_read_bytes", "reported_read_bytes"), ("total_write_bytes", "reported_write_bytes")):
            v = _get(s, f"storage_stats.{key}")
            out[dst] += int(v if v is not None else _get(s, f"cache_stats.{key}") or 0)
        out["requests"] += int(s.get("total_requests") or 0)
    return out


def run_side(side: str, bin_path: Path, ranks: int, a, scratch: Path) -> dict:
    res, cache = scratch / f"results-{side}-{ranks}", scratch / f"cache-{side}-{ranks}"
    for d in (res, cache):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    py, src = a.mlpstorage_python, a.mlpstorage
    subprocess.run([py, "-m", "mlpstorage_py.main", "init", "kvtierbench", str(res)], cwd=src, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    cmd = [py, "-m", "mlpstorage_py.main", "open", "kvcache", "run", "--kvcache-bin-path", str(bin_path),
           "--systemname", "sut", "--results-dir", str(res), "--cache-dir", str(cache), "--model", a.model,
           "--num-users", str(a.num_users), "--duration", str(a.duration), "--gpu-mem-gb", "0", "--cpu-mem-gb", "0",
           "--generation-mode", "none", "--trials", "1", "--inter-option-delay", "0",
           "--num-processes", str(ranks)]  # fmt: skip
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    if ranks > (os.cpu_count() or 1):
        cmd.append("--oversubscribe")
    dev = block_device_of(str(cache))
    dropped = drop_caches()
    # Others' I/O on the same disk (a shared VM) lands in the counters too: measure it idle first, to read against.
    idle0 = disk_counters(dev)
    time.sleep(IDLE_S)
    idle1 = disk_counters(dev)
    idle = idle1.minus(idle0) if idle0 and idle1 else {}
    background = {k: idle.get(k, 0) / IDLE_S for k in ("read_bytes", "written_bytes")}
    log = scratch / f"mlpstorage-{side}-{ranks}.log"
    marks: list[tuple[int, float, object]] = []
    ru0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
    marks.append((0, t0, disk_counters(dev)))
    with open(log, "w") as lf:
        proc = subprocess.Popen(cmd, cwd=src, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:
            lf.write(line)
            for o in OPTIONS:
                if f"Running option {o} " in line:
                    marks.append((o, time.monotonic(), disk_counters(dev)))
        rc = proc.wait()
    t1, ru1 = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
    marks.append((99, t1, disk_counters(dev)))
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    summaries = sorted(res.rglob("kvcache_run_summary_*.json"))
    summ = json.loads(summaries[-1].read_text()) if summaries else {}
    run_dir = summaries[-1].parent if summaries else res
    per_opt = {}
    for i, (o, ts, c) in enumerate(marks):
        if o not in OPTIONS or c is None:
            continue
        nt, nc = marks[i + 1][1], marks[i + 1][2]
        dd = nc.minus(c) if nc else {}
        agg = (summ.get("options") or summ.get("option_results") or summ).get(str(o)) or {}
        per_opt[o] = {"summary": agg, "wall_s": nt - ts, "device": dd, **rank_bytes(run_dir, o)}
    dev_all = marks[-1][2].minus(marks[0][2]) if marks[0][2] and marks[-1][2] else {}
    return {"side": side, "ranks": ranks, "rc": rc, "wall_s": t1 - t0, "cpu_s": cpu, "device_name": dev,
            "device": dev_all, "background_bytes_per_s": background, "caches_dropped": dropped, "command": cmd,
            "log": str(log),
            "summary_file": str(summaries[-1]) if summaries else None, "summary": summ, "options": per_opt}  # fmt: skip


def table(runs: list[dict]) -> str:
    head = ("| ranks | side | Option | read GB/s | write GB/s | p95 ms (scored) | storage tok/s | device read GB"
            " | reported read GB | device written GB | reported written GB | requests | wall s |")  # fmt: skip
    rows = [head, "|" + " --- |" * 13]
    for r in runs:
        for o, d in r["options"].items():
            s, dv = d["summary"], d["device"]

            def f(k, s=s):
                v = s.get(k)
                return f"{v:.3g}" if isinstance(v, (int, float)) else "-"

            rows.append(
                f"| {r['ranks']} | {r['side']} | {o} | {f('aggregated_read_bandwidth_gbps')} | "
                f"{f('aggregated_write_bandwidth_gbps')} | {f('aggregated_p95_latency_ms')} | "
                f"{f('aggregated_storage_throughput_tokens_per_sec')} | {dv.get('read_bytes', 0) / 1e9:.2f} | "
                f"{d['reported_read_bytes'] / 1e9:.2f} | {dv.get('written_bytes', 0) / 1e9:.2f} | "
                f"{d['reported_write_bytes'] / 1e9:.2f} | {d['requests']} | {d['wall_s']:.0f} |"
            )
    rows.append("")
    rows.append("| ranks | side | exit | wall s | CPU s | device GiB moved | CPU s per GiB moved | idle MB/s r/w |")
    rows.append("|" + " --- |" * 8)
    for r in runs:
        moved = (r["device"].get("read_bytes", 0) + r["device"].get("written_bytes", 0)) / GIB
        per = f"{r['cpu_s'] / moved:.2f}" if moved else "-"
        bg = r["background_bytes_per_s"]
        rows.append(f"| {r['ranks']} | {r['side']} | {r['rc']} | {r['wall_s']:.0f} | {r['cpu_s']:.1f} | "
                    f"{moved:.2f} | {per} | {bg.get('read_bytes', 0) / 1e6:.1f} / "
                    f"{bg.get('written_bytes', 0) / 1e6:.1f} |")  # fmt: skip
    return "\n".join(rows)


def main(argv=None) -> int:
    a = parse_args(argv)
    src, scratch = Path(a.mlpstorage), Path(a.dir)
    if not (src / "mlpstorage_py").is_dir() or not (src / "kv_cache_benchmark" / "kv-cache.py").is_file():
        return fail(PROG, f"--mlpstorage {src}: not an mlpstorage checkout (no mlpstorage_py/, kv_cache_benchmark/)")
    probe = subprocess.run([a.mlpstorage_python, "-c", "import numpy, yaml, psutil, pydantic"], capture_output=True)
    if probe.returncode != 0:
        return fail(PROG, f"--mlpstorage-python {a.mlpstorage_python}: cannot import numpy, yaml, psutil, pydantic")
    scratch.mkdir(parents=True, exist_ok=True)
    bins = {"reference": reference_bin(src, scratch), "kvtier": kvtier_bin(scratch)}
    commit = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    load = {"before": os.getloadavg()}
    runs = []
    for ranks in a.ranks:
        for side in ("reference", "kvtier"):
            print(f"{PROG}: {side}, {ranks} rank(s) ...", file=sys.stderr, flush=True)
            runs.append(run_side(side, bins[side], ranks, a, scratch))
            print(table(runs[-1:]), flush=True)
    load["after"] = os.getloadavg()
    md = table(runs)
    print(md)
    out = a.output or default_results_path()
    doc = {"mlpstorage_commit": commit.strip(), "model": a.model, "num_users": a.num_users, "duration_s": a.duration,
           "trials": 1, "load_avg": load, "runs": runs, "table_md": md}  # fmt: skip
    write_run_json(out, doc, argv=argv)
    print(f"{PROG}: wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
