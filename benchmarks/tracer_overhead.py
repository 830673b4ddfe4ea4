"""Tracer overhead and distiller fidelity, measured (not a timed test).

    sudo .venv/bin/python benchmarks/tracer_overhead.py [--runtime-s 5] [--rounds 2] [--dir /var/tmp]
    sudo .venv/bin/python benchmarks/tracer_overhead.py --target loop --rounds 5 --no-fidelity
    sudo .venv/bin/python benchmarks/tracer_overhead.py --depth-runs 5 --no-overhead --no-fidelity

Overhead: the same fio job (70% reads of 128 KiB, libaio QD 8, direct; and
4 KiB random reads, QD 32) is run alternately without the tracer and with
it attached (all layers, then block only with --no-syscalls), rounds times;
the tracer is attached before fio starts and filtered on the name "fio", so
every second of the traced runs is traced. Loss = 1 - traced / untraced
throughput, medians over rounds. Cost per event: the time each I/O took
longer traced (1/IOPS traced - 1/IOPS untraced, medians), over the probe
runs per I/O counted in the trace (block probes, and syscall entries and
exits); and the kernel's own measure, kernel.bpf_stats_enabled set for the
run: run time per probe run and probe runs per I/O (every run, the ones
the filters drop included). --target loop runs it on a loop device over a
tmpfs file (quiet and fast: what is left is the tracer), --target disk on a
file in --dir.

Fidelity: the traced run of the first job is distilled into a fio job, which
is replayed on a fresh file; bandwidth and mean completion latency of the
replay are compared with the original's.

Depth (--depth-runs N): fio randrw 70% reads of 512 KiB, direct, libaio at
QD 1, 4, 8 and 32, each traced block-only by pid for 3 s, N times, on a
file in --dir (--target disk) or on the loop device (--target loop); the
distilled iodepth of each run, beside Little's law and the sampled edge
(--keep DIR keeps each run's trace, depth-<target>-qd<N>-<run>.txt).

Needs root, bpftrace and fio (and losetup for --target loop). Prints
tables; --json FILE writes the figures.
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

from replay.outputs.provenance import write_run_json
from tracing.distill import distill, render_job
from tracing.histparse import parse_trace

REPO = Path(__file__).resolve().parents[1]
SH = REPO / "tracing" / "storage_latency_stack.sh"

JOBS = {
    "randrw70-128k-qd8": ["--rw=randrw", "--rwmixread=70", "--bs=128k", "--iodepth=8"],
    "randread-4k-qd32": ["--rw=randread", "--bs=4k", "--iodepth=32"],
}


def fio_run(name: str, args: list[str], path: Path, runtime_s: int, out_json: Path, size: str = "512m") -> dict:
    cmd = [
        "fio",
        f"--name={name}",
        f"--filename={path}",
        f"--size={size}",
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
    def __init__(self, out: Path, no_syscalls: bool, target: str = "fio", dev: str | None = None):
        self.out = out
        cmd = ["bash", str(SH), target, "--out", str(out)] + (["--no-syscalls"] if no_syscalls else [])
        cmd += ["--dev", dev] if dev else []
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

    def prog_stats(self) -> tuple[int, int]:
        """(run_time_ns, run_cnt) summed over the BPF programs of the wrapper's
        bpftrace: what the kernel measured the probes cost (with
        kernel.bpf_stats_enabled=1; zeros without it)."""
        kids, todo = set(), {self.proc.pid}
        while todo:  # the wrapper's descendants
            parent = todo.pop()
            for st in Path("/proc").glob("[0-9]*/stat"):
                try:
                    fields = st.read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if int(fields[1]) == parent and int(st.parent.name) not in kids:
                    kids.add(int(st.parent.name))
                    todo.add(int(st.parent.name))
        ns = cnt = 0
        for pid in kids:
            for fd in Path(f"/proc/{pid}/fdinfo").glob("*"):
                try:
                    info = dict(ln.split(":", 1) for ln in fd.read_text().splitlines() if ":" in ln)
                except OSError:
                    continue
                if "prog_type" in info:
                    ns += int(info.get("run_time_ns", "0").strip() or 0)
                    cnt += int(info.get("run_cnt", "0").strip() or 0)
        return ns, cnt

    def stop(self):
        self.run_ns, self.run_cnt = self.prog_stats()
        os.killpg(self.proc.pid, signal.SIGINT)
        self.proc.wait(timeout=120)
        self.log.close()
        return parse_trace((self.out / "trace.txt").read_text())


def events_per_io(tr) -> float:
    """Probe runs per block request the trace counted: block (io_start, insert,
    issue, completion; a requeue adds itself and a second issue) and syscall
    entries and exits of the traced process. Runs filtered out (other
    processes' syscalls) are not counted: a lower bound of the probe runs."""
    issued = tr.number("issued_read") + tr.number("issued_write")
    if not issued:
        return 0.0
    n = 4 * issued + 2 * tr.number("requeue_reqs")
    for name, keys in tr.maps.items():
        if (name.startswith("sys_") and name.endswith("_usecs")) or name in ("fsync_usecs", "fdatasync_usecs"):
            for v in keys.values():
                n += 2 * getattr(v, "total", 0)
    return n / issued


class LoopDevice:
    """A loop device over a file in tmpfs: a fast, quiet block device."""

    def __init__(self, gib: int):
        self.dir = Path(tempfile.mkdtemp(prefix="kvtier-tracer-loop-", dir="/dev/shm"))
        img = self.dir / "loop.img"
        with open(img, "wb") as f:
            f.truncate(gib << 30)
        p = subprocess.run(["losetup", "--find", "--show", str(img)], capture_output=True, text=True)
        if p.returncode != 0:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise SystemExit(f"tracer_overhead: losetup failed: {p.stderr.strip()}")
        self.dev = p.stdout.strip()

    def close(self):
        subprocess.run(["losetup", "-d", self.dev], check=False)
        shutil.rmtree(self.dir, ignore_errors=True)


def overhead(args, work: Path, data: Path, size: str, dev: str | None, results: dict):
    first = None
    for job, jargs in JOBS.items():
        runs: dict[str, list[dict]] = {"untraced": [], "traced": [], "traced-block-only": []}
        for rnd in range(args.rounds):
            for mode in runs:
                out_json = work / f"{job}-{mode}-{rnd}.json"
                tracer = None
                if mode != "untraced":
                    tracer = Tracer(
                        work / f"trace-{job}-{mode}-{rnd}", no_syscalls=(mode == "traced-block-only"), dev=dev
                    )
                s = fio_run(job, jargs, data, args.runtime_s, out_json, size=size)
                if tracer:
                    tr = tracer.stop()
                    s["missed_events"] = tr.meta.get("missed_events")
                    s["events_per_io"] = events_per_io(tr)
                    s["prog_ns_per_run"] = tracer.run_ns / tracer.run_cnt if tracer.run_cnt else None
                    s["prog_runs_per_io"] = tracer.run_cnt / (s["iops"] * args.runtime_s) if s["iops"] else None
                    issued = tr.number("issued_read") + tr.number("issued_write")
                    done = tr.number("completed_read") + tr.number("completed_write")
                    s["lost_completion_pct"] = 100 * max(0, issued - done) / issued if issued else 0
                    if job == "randrw70-128k-qd8" and mode == "traced-block-only" and first is None:
                        first = (tr, s)
                runs[mode].append(s)
                print(
                    f"  {job:<18} {mode:<18} round {rnd}: {s['bw_mib_s']:8.1f} MiB/s "
                    f"{s['iops']:9.0f} IOPS  clat {s['clat_mean_us']:7.0f} us",
                    flush=True,
                )
        base = statistics.median(r["bw_mib_s"] for r in runs["untraced"])
        base_iops = statistics.median(r["iops"] for r in runs["untraced"])
        out = {}
        for mode, rs in runs.items():
            iops = statistics.median(r["iops"] for r in rs)
            v = {
                "bw_mib_s": round(statistics.median(r["bw_mib_s"] for r in rs), 1),
                "iops": round(iops),
                "loss_pct": round(100 * (1 - statistics.median(r["bw_mib_s"] for r in rs) / base), 1),
            }
            if mode != "untraced":
                added_ns = 1e9 / iops - 1e9 / base_iops
                epi = statistics.median(r["events_per_io"] for r in rs)
                v.update(
                    added_ns_per_io=round(added_ns),
                    events_per_io=round(epi, 1),
                    ns_per_event=round(added_ns / epi) if epi else None,
                    missed_events=[r["missed_events"] for r in rs],
                    lost_completion_pct=round(statistics.median(r["lost_completion_pct"] for r in rs), 2),
                )
                measured = [r for r in rs if r.get("prog_ns_per_run")]
                if measured:  # the kernel's own measure of the probes (bpf_stats_enabled)
                    v["prog_ns_per_run"] = round(statistics.median(r["prog_ns_per_run"] for r in measured))
                    v["prog_runs_per_io"] = round(statistics.median(r["prog_runs_per_io"] for r in measured), 1)
                    v["prog_ns_per_io"] = round(v["prog_ns_per_run"] * v["prog_runs_per_io"])
            out[mode] = v
        results["overhead"][job] = out
    return first


def fidelity(args, work: Path, first, results: dict):
    first_trace, first_orig = first
    d = distill(first_trace, process="bench", runtime_s=args.runtime_s, size="512m")
    job_text = render_job(d, source="bench", tr=first_trace)
    (work / "replay.fio").write_text(job_text)
    if args.keep:
        keep = Path(args.keep)
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


DEPTH_QDS = (1, 4, 8, 32)


def depth_runs(args, work: Path, data: Path, dev: str, results: dict):
    """Distilled iodepth of fio randrw70 512 KiB at known depths, N runs each,
    on data (a file on the disk, or the loop device); traces kept in --keep."""
    out: dict = {}
    for rnd in range(args.depth_runs):
        for qd in DEPTH_QDS:
            fio = subprocess.Popen(
                ["fio", "--name=depth", f"--filename={data}", "--size=512m", "--rw=randrw", "--rwmixread=70"]
                + ["--bs=512k", "--direct=1", "--ioengine=libaio", f"--iodepth={qd}", "--thread", "--time_based"]
                + ["--runtime=120"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                time.sleep(1.0)  # laid out, I/O running
                tdir = work / f"depth-qd{qd}-{rnd}"
                p = subprocess.run(
                    ["bash", str(SH), str(fio.pid), "--dev", dev, "--duration", "3", "--out", str(tdir)]
                    + ["--no-syscalls"],
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
            finally:
                fio.send_signal(signal.SIGINT)
                fio.wait(timeout=60)
            if p.returncode != 0:
                raise SystemExit(f"tracer_overhead: tracer failed: {p.stderr.strip()[-300:]}")
            if args.keep:
                keep = Path(args.keep) / f"depth-{args.target}-qd{qd}-{rnd}.txt"
                keep.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(tdir / "trace.txt", keep)
            d = distill(parse_trace((tdir / "trace.txt").read_text()))
            f = d.figures
            row = {
                "iodepth": d.iodepth,
                "little": f.get("iodepth_little"),
                "edge": f.get("iodepth_sampled_edge"),
                "p50": f.get("iodepth_sampled_p50"),
                "p95": f.get("iodepth_sampled_p95"),
                "mean": f.get("iodepth_sampled_mean"),
                "issued": f.get("issued"),
                "lost_completions": f.get("lost_completions", 0),
            }
            out.setdefault(str(qd), []).append(row)
            print(f"  depth QD {qd:<3} run {rnd}: iodepth {d.iodepth:<3} {row}", flush=True)
    results["depth"] = out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="examples:\n"
        "  sudo .venv/bin/python benchmarks/tracer_overhead.py --runtime-s 5 --rounds 3\n"
        "  sudo .venv/bin/python benchmarks/tracer_overhead.py --target loop --rounds 5 --no-fidelity\n"
        "  sudo .venv/bin/python benchmarks/tracer_overhead.py --depth-runs 5 --no-overhead --no-fidelity",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--runtime-s", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dir", default="/var/tmp", help="a folder on a real disk (not tmpfs)")
    ap.add_argument(
        "--target",
        choices=("disk", "loop"),
        default="disk",
        help="overhead on a file in --dir (disk) or on a loop device over a tmpfs file (loop)",
    )
    ap.add_argument("--loop-gib", type=int, default=1, help="size of the loop device (--target loop)")
    ap.add_argument("--no-overhead", action="store_true", help="skip the overhead runs")
    ap.add_argument("--no-fidelity", action="store_true", help="skip the distil-and-replay run")
    ap.add_argument("--depth-runs", type=int, default=0, help="runs per QD of the iodepth check (0: none)")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--keep", metavar="DIR", help="keep the traces (fidelity, depth runs) and the distilled job here")
    args = ap.parse_args(argv)
    if os.geteuid() != 0 or not shutil.which("bpftrace") or not shutil.which("fio"):
        print("tracer_overhead: needs root, bpftrace and fio", file=sys.stderr)
        return 2
    if args.target == "loop" and not shutil.which("losetup"):
        print("tracer_overhead: --target loop needs losetup", file=sys.stderr)
        return 2
    if args.target == "loop" and not args.no_fidelity:
        print("tracer_overhead: --target loop measures overhead only: add --no-fidelity", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="kvtier-tracer-bench-", dir=args.dir))
    results: dict = {
        "runtime_s": args.runtime_s,
        "rounds": args.rounds,
        "target": args.target,
        "load_avg_start": os.getloadavg(),
        "overhead": {},
        "fidelity": {},
    }
    loop = None
    stats = Path("/proc/sys/kernel/bpf_stats_enabled")
    stats_was = stats.read_text().strip() if stats.exists() else None
    if stats_was == "0" and not args.no_overhead:
        stats.write_text("1")  # per-program run time, for the cost per probe run; put back below
        print("tracer_overhead: kernel.bpf_stats_enabled set to 1 for the run (back to 0 at the end)")
    try:
        first = None
        if args.target == "loop":
            loop = LoopDevice(args.loop_gib)
            data, size, dev = Path(loop.dev), f"{args.loop_gib}g", loop.dev
        else:
            data, size, dev = work / "bench.dat", "512m", None
        if not args.no_overhead or not args.no_fidelity:
            first = overhead(args, work, data, size, dev, results)
        if not args.no_fidelity and first is not None:
            fidelity(args, work, first, results)
        if args.depth_runs:
            depth_runs(args, work, data, dev or str(work), results)
    finally:
        if stats_was == "0" and not args.no_overhead:
            stats.write_text("0")
        if loop:
            loop.close()
        shutil.rmtree(work, ignore_errors=True)
    results["load_avg_end"] = os.getloadavg()

    print()
    la = results["load_avg_start"]
    print(f"load average at start {la[0]:.1f} {la[1]:.1f} {la[2]:.1f} on {os.cpu_count()} CPUs")
    if results["overhead"]:
        print(f"Tracer overhead on {args.target} (fio, {args.runtime_s} s per run, median of {args.rounds} rounds)")
        print(f"{'job':<20}{'mode':<20}{'IOPS':>9}{'loss':>8}{'+ns/IO':>9}{'ev/IO':>7}{'ns/ev':>7}{'lost':>7}")
        for job, modes in results["overhead"].items():
            for mode, v in modes.items():
                extra = ""
                if "added_ns_per_io" in v:
                    extra = (
                        f"{v['added_ns_per_io']:>9}{v['events_per_io']:>7}{v['ns_per_event'] or '-':>7}"
                        f"{v['lost_completion_pct']:>6}%"
                    )
                print(f"{job:<20}{mode:<20}{v['iops']:>9}{v['loss_pct']:>7.1f}%{extra}")
        print("+ns/IO, ns/ev: from throughput (noisy on a shared machine); ev/IO: probe runs the trace counted")
        print(f"{'job':<20}{'mode':<20}{'probe ns/run':>13}{'runs/IO':>9}{'probe ns/IO':>12}  (kernel's bpf_stats)")
        for job, modes in results["overhead"].items():
            for mode, v in modes.items():
                if "prog_ns_per_run" in v:
                    print(
                        f"{job:<20}{mode:<20}{v['prog_ns_per_run']:>13}{v['prog_runs_per_io']:>9}"
                        f"{v['prog_ns_per_io']:>12}"
                    )
    f = results["fidelity"]
    if f:
        print()
        print("Fidelity (original fio 70/30 128k QD8, traced block-only, vs the distilled job replayed)")
        print(f"{'':<12}{'MiB/s':>10}{'clat us':>10}{'reads':>8}")
        for k in ("original", "replay"):
            print(f"{k:<12}{f[k]['bw_mib_s']:>10.1f}{f[k]['clat_mean_us']:>10.0f}{f[k]['read_share']:>8.2f}")
        print(f"{'difference':<12}{f['bw_diff_pct']:>9.1f}%{f['clat_diff_pct']:>9.1f}%")
        print(f"distilled: {f['job']}")
    if results.get("depth"):
        print()
        print(f"Distilled iodepth, fio randrw70 512k, block-only, {args.depth_runs} runs per QD")
        print(f"{'fio QD':>6}  {'iodepth per run':<24}{'Little per run':<34}{'in +-25% (6-10 at 8)':>8}")
        for qd, rows in results["depth"].items():
            q = int(qd)
            lo, hi = (6, 10) if q == 8 else (0.75 * q, 1.25 * q)
            ok = sum(1 for r in rows if lo <= r["iodepth"] <= hi)
            print(
                f"{qd:>6}  {' '.join(str(r['iodepth']) for r in rows):<24}"
                f"{' '.join(str(r['little']) for r in rows):<34}"
                f"{ok}/{len(rows)}"
            )
    if args.json:
        write_run_json(args.json, results, argv=argv, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
