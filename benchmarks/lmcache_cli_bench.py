#!/usr/bin/env python3
"""lmcache_cli_bench.py	LMCache's own L2 benchmark (`lmcache bench l2`, 0.5.7) on kvtier's and LMCache's fs adapters.

usage: benchmarks/lmcache_cli_bench.py [--lmcache PATH] [--dir DIR] [--data-size-kb 256] [--num-keys 32]
                                       [--in-flight 4] [--rounds 20] [--repeats 5] [--no-cold-load] [--json OUT]

`lmcache bench l2` (lmcache 0.5.7, lmcache/cli/commands/bench/l2_adapter_bench) builds one L2 adapter from an
--l2-adapter JSON, as the LMCache server does, and drives it from one producer thread: each round submits --in-flight
tasks of --num-keys keys, waits on the adapter's event fd for all of them, and times the round; store, then lookup,
then load, after one warm-up round each; with --no-skip-verify it compares the last round's loaded bytes with what
was stored. This script runs it, unchanged, on three sides in one invocation, each in a fresh directory:
- kvtier (direct): kvconnector.lmcache.l2_adapter.KvtierL2Adapter as a "plugin" adapter (O_DIRECT, fdatasync, rename);
- lmcache-fs (use_odirect): LMCache's "fs" adapter with use_odirect true, the reference of the ratios;
- lmcache-fs (buffered): the same, buffered (its default).
Every side gets --l1-align-bytes 4096 (O_DIRECT needs aligned buffers), --lookup-max-hit-rate 1 (lookups of stored
keys) and --no-skip-verify. The tool drops no cache: its loads follow its stores in the same process, so a buffered
side reads back from the page cache. Unless --no-cold-load, each side is then run again with `--only load` on the same
directory after `sync; echo 1 > /proc/sys/vm/drop_caches` (root): a new process, cold caches, the same keys (the tool
lays its keys out so that `--only load` after a store finds them). The sides alternate their order between repeats;
the table gives medians of the tool's per-run averages, the ratios the range over repeats in brackets. Throughput in
MiB/s (the tool's "MB" is 2^20 bytes).
Exit 1 if a run failed, a round timed out, a key was missing or the tool's integrity check failed.

example (2 cores, virtio disk; the disk's speed drifts between runs, compare ratios within one run):
  $ sudo .venv/bin/python benchmarks/lmcache_cli_bench.py
  side                       store MiB/s  lookup keys/s  load MiB/s  cold load MiB/s  verified
  kvtier (direct)                  ...
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from deploy.host import drop_caches
from replay.outputs.provenance import write_run_json

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CLI = ROOT / ".venv-lmcache057" / "bin" / "lmcache"
REFERENCE = "lmcache-fs (use_odirect)"


def adapter_json(side: str, directory: Path, capacity_gb: float) -> str:
    if side == "kvtier (direct)":
        params = {"disk_dir": str(directory), "disk_capacity_gb": capacity_gb, "io_mode": "direct", "snapshot_path": ""}
        return json.dumps(
            {
                "type": "plugin",
                "module_path": "kvconnector.lmcache.l2_adapter",
                "class_name": "KvtierL2Adapter",
                "adapter_params": params,
            }
        )
    return json.dumps({"type": "fs", "base_path": str(directory), "use_odirect": side == REFERENCE})


SIDES = ["kvtier (direct)", REFERENCE, "lmcache-fs (buffered)"]


def run_tool(cli: Path, spec: str, args: argparse.Namespace, only: str | None) -> dict:
    """One `lmcache bench l2` run: {"ok", "ops": {operation: the tool's metrics}, "log"}."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [str(cli), "bench", "l2", "--l2-adapter", spec, "--l1-align-bytes", "4096"]
        cmd += ["--data-size-kb", str(args.data_size_kb), "--num-keys", str(args.num_keys)]
        cmd += ["--in-flight", str(args.in_flight), "--rounds", str(args.rounds), "--warmup-rounds", "1"]
        cmd += ["--lookup-max-hit-rate", "1", "--no-skip-verify", "--format", "json", "--output", out.name, "--quiet"]
        if only:
            cmd += ["--only", only]
        env = dict(os.environ, LMCACHE_TRACK_USAGE="false", PYTHONPATH=str(ROOT))
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
        text = Path(out.name).read_text()
    ops = {}
    if text.strip():
        for section in json.loads(text)["metrics"].values():
            if "operation" in section:
                ops[section["operation"].lower()] = section
    return {"ok": p.returncode == 0, "ops": ops, "log": (p.stdout + p.stderr)[-3000:]}


def complete(op: dict) -> bool:
    """Every round finished and every key was found (a lookup of stored keys) or moved."""
    return op.get("rounds_timed_out", 1) == 0 and op.get("total_success", -1) == op.get("total_keys")


def bench_side(cli: Path, side: str, directory: Path, args: argparse.Namespace) -> dict:
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True, mode=0o700)
    stored_gb = (args.rounds + 1) * args.in_flight * args.num_keys * (args.data_size_kb * 1024 + 4096) / 1e9
    spec = adapter_json(side, directory, capacity_gb=2 * stored_gb + 0.01)  # nothing is evicted
    try:
        warm = run_tool(cli, spec, args, None)
        cold = None
        if args.cold_load:
            drop_caches()
            cold = run_tool(cli, spec, args, "load")
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    ops = warm["ops"]
    ok = warm["ok"] and all(complete(ops.get(o, {})) for o in ("store", "lookup", "load"))
    r = {
        "side": side,
        "store_mibps": ops.get("store", {}).get("throughput_avg_mbps", 0.0),
        "lookup_keys_per_s": ops.get("lookup", {}).get("ops_per_sec_avg", 0.0),
        "load_mibps": ops.get("load", {}).get("throughput_avg_mbps", 0.0),
        "cold_load_mibps": None,
        "verified": warm["ok"],  # the tool exits 1 when its integrity check fails
        "ok": ok,
        "log": None if ok else warm["log"],
    }
    if cold is not None:
        load = cold["ops"].get("load", {})
        r["cold_load_mibps"] = load.get("throughput_avg_mbps", 0.0)
        r["ok"] = r["ok"] and cold["ok"] and complete(load)
        r["log"] = r["log"] or (None if r["ok"] else cold["log"])
    return r


def median_result(rs: list[dict]) -> dict:
    out = dict(rs[0])
    for k in ("store_mibps", "lookup_keys_per_s", "load_mibps", "cold_load_mibps"):
        vals = [r[k] for r in rs if r[k] is not None]
        out[k] = statistics.median(vals) if vals else None
    out["verified"] = all(r["verified"] for r in rs)
    out["ok"] = all(r["ok"] for r in rs)
    return out


def table(results: list[dict], runs: dict[str, list[dict]] | None = None) -> str:
    """The medians, then each side's ratio to the reference: the median's ratio and, with `runs`, the range of the
    per-repeat ratios (each side against the reference run next to it in the same repeat)."""
    lines = [
        f"{'side':26} {'store MiB/s':>11} {'lookup keys/s':>13} {'load MiB/s':>10} {'cold load MiB/s':>15}  verified"
    ]
    for r in results:
        cold = f"{r['cold_load_mibps']:15.0f}" if r["cold_load_mibps"] is not None else f"{'-':>15}"
        flag = "" if r["ok"] else "  (FAILED: a run failed, timed out or missed keys)"
        lines.append(
            f"{r['side']:26} {r['store_mibps']:11.0f} {r['lookup_keys_per_s']:13.0f} {r['load_mibps']:10.0f} {cold}"
            f"  {'yes' if r['verified'] else 'NO'}{flag}"
        )
    ref = next(r for r in results if r["side"] == REFERENCE)
    for r in results:
        if r is ref:
            continue
        parts = []
        for label, k in (
            ("store", "store_mibps"),
            ("lookup", "lookup_keys_per_s"),
            ("load", "load_mibps"),
            ("cold load", "cold_load_mibps"),
        ):
            if r[k] is None:
                continue
            spread = ""
            if runs:
                per = [a[k] / b[k] for a, b in zip(runs[r["side"]], runs[REFERENCE]) if a[k] and b[k]]
                spread = f" ({min(per):.2f}-{max(per):.2f})" if len(per) > 1 else ""
            parts.append(f"{label} {ratio(r[k], ref[k])}{spread}")
        lines.append(f"ratio {r['side']} / {REFERENCE}: " + ", ".join(parts))
    return "\n".join(lines)


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "n/a"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--lmcache", default=str(DEFAULT_CLI), help="the `lmcache` CLI of LMCache >= 0.5.7 [%(default)s]")
    ap.add_argument("--dir", default=str(ROOT / "results" / "lmcache_cli_bench"), help="work directory (wiped)")
    ap.add_argument("--data-size-kb", type=int, default=256, help="bytes per key, KiB (the tool's default)")
    ap.add_argument("--num-keys", type=int, default=32, help="keys per task (the tool's default)")
    ap.add_argument("--in-flight", type=int, default=4, help="tasks submitted per round before waiting")
    ap.add_argument("--rounds", type=int, default=20, help="measured rounds per operation (plus one warm-up)")
    ap.add_argument("--repeats", type=int, default=5, help="runs per side, alternating the order; medians")
    ap.add_argument("--no-cold-load", dest="cold_load", action="store_false", help="skip the cold-cache load run")
    ap.add_argument("--json", help="write every run and the medians here")
    a = ap.parse_args(argv)
    cli = Path(a.lmcache)
    if not os.access(cli, os.X_OK):
        print(
            f"lmcache_cli_bench: no lmcache CLI at {cli} (make .venv-lmcache057 with `make test-lmcache057`)",
            file=sys.stderr,
        )
        return 2
    for name in ("data_size_kb", "num_keys", "in_flight", "rounds", "repeats"):
        if getattr(a, name) < 1:
            print(f"lmcache_cli_bench: --{name.replace('_', '-')} must be at least 1", file=sys.stderr)
            return 2
    if a.data_size_kb % 4:
        print("lmcache_cli_bench: --data-size-kb must be a multiple of 4 (O_DIRECT: 4096-byte blocks)", file=sys.stderr)
        return 2
    if a.cold_load and os.geteuid() != 0:
        print(
            "lmcache_cli_bench: the cold load needs root (drop_caches); run as root or pass --no-cold-load",
            file=sys.stderr,
        )
        return 2
    base = Path(a.dir)
    runs: dict[str, list[dict]] = {s: [] for s in SIDES}
    for rep in range(a.repeats):
        # Alternate the order: the disk's speed drifts within a run, and the side that runs first would gain.
        for side in SIDES if rep % 2 == 0 else SIDES[::-1]:
            r = bench_side(cli, side, base / side.split()[0], a)
            runs[side].append(r)
            cold = f", cold load {r['cold_load_mibps']:.0f}" if r["cold_load_mibps"] is not None else ""
            print(
                f"repeat {rep + 1}/{a.repeats} {side}: store {r['store_mibps']:.0f}, load {r['load_mibps']:.0f}{cold}"
                f" MiB/s{'' if r['ok'] else ' FAILED'}",
                file=sys.stderr,
                flush=True,
            )
            if not r["ok"]:
                print(r["log"], file=sys.stderr)
    results = [median_result(rs) for rs in runs.values()]
    print(
        f"lmcache bench l2: {a.num_keys} keys x {a.data_size_kb} KiB per task, {a.in_flight} in flight, "
        f"{a.rounds} rounds (+1 warm-up); medians of {a.repeats} repeats; dir {base}"
    )
    print(table(results, runs))
    if a.json:
        write_run_json(a.json, {"args": vars(a), "results": results, "runs": runs}, argv=argv, indent=1)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
