"""Tracer overhead and distiller fidelity, measured (not a timed test).

    sudo .venv/bin/python benchmarks/tracer_overhead.py [--runtime-s 5] [--rounds 2] [--dir /var/tmp]

Overhead: the same fio job (70% reads of 128 KiB, libaio QD 8, direct; and
4 KiB random reads, QD 32) is run alternately without the tracer and with
it attached (all layers, then block only with --no-syscalls), rounds times;
the tracer is attached before fio starts and filtered on the name "fio", so
every second of the traced runs is traced. Loss = 1 - traced / untraced
throughput, medians over rounds.

Fidelity: the traced run of the first job is distilled into a fio job, which
is replayed on a fresh file; bandwidth and mean completion latency of the
replay are compared with the original's.

Needs root, bpftrace and fio. Prints a table; --json FILE writes the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tracing.distill import distill, render_job
from tracing.histparse import parse_trace

REPO = Path(__file__).resolve().parents[1]
SH = REPO / "tracing" / "storage_latency_stack.sh"

JOBS = {
    "randrw70-128k-qd8": ["--rw=randrw", "--rwmixread=70", "--bs=128k", "--iodepth=8"],
    "randread-4k-qd32": ["--rw=randread", "--bs=4k", "--iodepth=32"],
}


def fio_run(name: str, args: list[str], path: Path, runtime_s: int, out_json: Path) -> dict:
    cmd = [
        "fio",
        f"--name={name}",
        f"--filename={path}",
        "--size=512m",
        "--direct=1",
        "--ioengine=libaio",
        "--thread",
        "--time_based",
        f"--runtime={runtime_s}",
        "--randrepeat=0",
        "--output-format=json",
        f"--output={out_json}",
        *args,
    ]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=runtime_s + 120)
    return summary(out_json)


def summary(out_json: Path) -> dict:
    job = json.loads(out_json.read_text())["jobs"][0]
    r, w = job["read"], job["write"]
    ios = r["total_ios"] + w["total_ios"]
    lat = ((r["clat_ns"]["mean"] * r["total_ios"] + w["clat_ns"]["mean"] * w["total_ios"]) / ios / 1000) if ios else 0
    return {
        "bw_mib_s": (r["bw_bytes"] + w["bw_bytes"]) / 2**20,
        "iops": r["iops"] + w["iops"],
        "clat_mean_us": lat,
        "read_share": r["total_ios"] / ios if ios else 0,
    }


class Tracer:
    def __init__(self, out: Path, no_syscalls: bool):
        self.out = out
        cmd = ["bash", str(SH), "fio", "--out", str(out)] + (["--no-syscalls"] if no_syscalls else [])
        self.log = open(out.parent / f"{out.name}.log", "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        trace = out / "trace.txt"
        while time.monotonic() < deadline:
            if trace.exists() and "Tracing storage I/O" in trace.read_text(errors="replace"):
                return
            if self.proc.poll() is not None:
                raise SystemExit(f"tracer failed: {(out.parent / f'{out.name}.log').read_text()[-500:]}")
            time.sleep(0.05)
        raise SystemExit("tracer did not attach in 60 s")

    def stop(self):
        os.killpg(self.proc.pid, signal.SIGINT)
        self.proc.wait(timeout=120)
        self.log.close()
        return parse_trace((self.out / "trace.txt").read_text())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runtime-s", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dir", default="/var/tmp", help="a folder on a real disk (not tmpfs)")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--keep", metavar="DIR", help="keep the fidelity trace and its distilled job here")
    args = ap.parse_args(argv)
    if os.geteuid() != 0 or not shutil.which("bpftrace") or not shutil.which("fio"):
        print("tracer_overhead: needs root, bpftrace and fio", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="kvtier-tracer-bench-", dir=args.dir))
    results: dict = {"runtime_s": args.runtime_s, "rounds": args.rounds, "overhead": {}, "fidelity": {}}
    first_trace = None
    first_orig = None
    try:
        data = work / "bench.dat"
        for job, jargs in JOBS.items():
            runs: dict[str, list[dict]] = {"untraced": [], "traced": [], "traced-block-only": []}
            for rnd in range(args.rounds):
                for mode in runs:
                    out_json = work / f"{job}-{mode}-{rnd}.json"
                    tracer = None
                    if mode != "untraced":
                        tracer = Tracer(work / f"trace-{job}-{mode}-{rnd}", no_syscalls=(mode == "traced-block-only"))
                    s = fio_run(job, jargs, data, args.runtime_s, out_json)
                    if tracer:
                        tr = tracer.stop()
                        s["missed_events"] = tr.meta.get("missed_events")
                        if job == "randrw70-128k-qd8" and mode == "traced-block-only" and first_trace is None:
                            first_trace, first_orig = tr, s
                    runs[mode].append(s)
                    print(
                        f"  {job:<18} {mode:<18} round {rnd}: {s['bw_mib_s']:8.1f} MiB/s "
                        f"{s['iops']:9.0f} IOPS  clat {s['clat_mean_us']:7.0f} us",
                        flush=True,
                    )
            base = statistics.median(r["bw_mib_s"] for r in runs["untraced"])
            results["overhead"][job] = {
                mode: {
                    "bw_mib_s": round(statistics.median(r["bw_mib_s"] for r in rs), 1),
                    "loss_pct": round(100 * (1 - statistics.median(r["bw_mib_s"] for r in rs) / base), 1),
                }
                for mode, rs in runs.items()
            }

        # fidelity: distil the block-only capture of the 70/30 job, replay it
        d = distill(first_trace, process="bench", runtime_s=args.runtime_s, size="512m")
        job_text = render_job(d, source="bench", tr=first_trace)
        (work / "replay.fio").write_text(job_text)
        keep = Path(args.keep) if args.keep else None
        if keep:
            keep.mkdir(parents=True, exist_ok=True)
            (keep / "replay.fio").write_text(job_text)
            shutil.copy(work / "trace-randrw70-128k-qd8-traced-block-only-0" / "trace.txt", keep / "trace.txt")
        rep_json = work / "replay.json"
        env = dict(os.environ, TARGET=str(work / "replay.dat"))
        subprocess.run(
            ["fio", "--output-format=json", f"--output={rep_json}", str(work / "replay.fio")],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
            timeout=args.runtime_s + 120,
        )
        rep = summary(rep_json)
        results["fidelity"] = {
            "original": {k: round(v, 3) for k, v in first_orig.items() if isinstance(v, float)},
            "replay": {k: round(v, 3) for k, v in rep.items()},
            "bw_diff_pct": round(100 * (rep["bw_mib_s"] / first_orig["bw_mib_s"] - 1), 1),
            "clat_diff_pct": round(100 * (rep["clat_mean_us"] / first_orig["clat_mean_us"] - 1), 1),
            "job": {
                "rw": d.rw,
                "rwmixread": d.rwmixread,
                "iodepth": d.iodepth,
                "bssplit_read": d.bssplit_read,
                "bssplit_write": d.bssplit_write,
            },
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print()
    print(f"Tracer overhead (fio, {args.runtime_s} s per run, median of {args.rounds} rounds)")
    print(f"{'job':<20}{'mode':<20}{'MiB/s':>10}{'loss':>8}")
    for job, modes in results["overhead"].items():
        for mode, v in modes.items():
            print(f"{job:<20}{mode:<20}{v['bw_mib_s']:>10.1f}{v['loss_pct']:>7.1f}%")
    f = results["fidelity"]
    print()
    print("Fidelity (original fio 70/30 128k QD8, traced block-only, vs the distilled job replayed)")
    print(f"{'':<12}{'MiB/s':>10}{'clat us':>10}{'reads':>8}")
    for k in ("original", "replay"):
        print(f"{k:<12}{f[k]['bw_mib_s']:>10.1f}{f[k]['clat_mean_us']:>10.0f}{f[k]['read_share']:>8.2f}")
    print(f"{'difference':<12}{f['bw_diff_pct']:>9.1f}%{f['clat_diff_pct']:>9.1f}%")
    print(f"distilled: {f['job']}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
