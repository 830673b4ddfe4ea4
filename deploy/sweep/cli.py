"""`kvtier sweep`: run a driver once per (bandwidth cap, added latency) point with kvtier's disk tier on throttlefs.

The mount stays up for the whole sweep and only its settings change between points (throttlefs's control endpoint),
as a live stack would see it. See deploy/sweep/__init__.py for the order of the runs and what the output holds.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from deploy import stack as live
from kvconnector.errors import ConfigError
from replay.common.cli import Interrupted, OneLineParser, command, stop_signals_raise
from replay.common.leftovers import die_with_parent, disk_temp_dir, watchdog
from replay.outputs.paths import claim_outputs, default_results_path, write_results

from .grid import Point, grid, parse_bw_list, parse_lat_list, schedule
from .metrics import HEADLINE, METRICS, extract, median, relative

PROG = "kvtier sweep"

EPILOG = """\
examples:
  # the in-process driver, its disk tier only (no CPU tier), 3 bandwidths x 4 latencies, each point twice
  kvtier sweep --bw 4GB/s,1GB/s,250MB/s --lat-ms 0,0.5,1,2 --repeat 2 --driver bench --output sweep.json \\
      --plots sweep-plots --html-output sweep.html \\
      -- --num-users 4 --duration 10 --cpu-mem-gb 0 --gpu-mem-gb 0 --storage-capacity-gb 2
  # a live vLLM + LMCache + kvtier stack (deploy/run-stack.sh, started and stopped by the sweep, --kv-dir on the
  # mount); LMCache's L1 is cleared before every point so its hits come from the kvtier disk tier
  kvtier sweep --bw 1GB/s,250MB/s --lat-ms 0,1,2 --driver replay --output sweep.json --plots sweep-plots \\
      --stack '--device cpu --model /tmp/tiny --vllm-port 8000 --lmcache-port 5555 --lmcache-http-port 8090' \\
      -- --source synthetic --rounds 4 --concurrency 4 --output-len 16

The replay driver's server-side figures come from every instance's vLLM /metrics page, or, when --stack has
--prometheus, from the stack's Prometheus (its vLLM, LMCache and kvtier series); `-- --metrics-url URL` names
others, a Prometheus among them: `-- --metrics-url prometheus+http://HOST:PORT` (see kvtier replay --help).
Every point runs the driver as its own process (kvtier bench / kvtier replay with the arguments after --); the sweep
owns the driver's --output (and bench's --cache-dir, replay's --base-url). The unthrottled point (no cap, no added
latency) is the reference: it runs at the start of every pass and at the end, and the table and heat maps give each
point's figures relative to its median. 0 or none in --bw means no cap. Per-run results files go into
OUTPUT-stem.runs/ beside --output; neither replaces an earlier sweep's (an existing one is refused).
The mount and its backing directory are temporary unless --mount/--backing are
given (a given --backing is never emptied; the bench driver removes its own run directory).
"""


def build_parser() -> OneLineParser:
    ap = OneLineParser(
        prog=PROG,
        description="Run a driver once per (bandwidth cap, added latency per operation) point of a throttlefs mount "
        "holding kvtier's disk tier; one table and heat maps relative to the unthrottled point.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--bw", required=True, help="comma-separated caps, both directions (e.g. 4GB/s,1GB/s,250MB/s)")
    ap.add_argument("--lat-ms", required=True, help="comma-separated ms added per operation (e.g. 0,0.5,1,2)")
    ap.add_argument("--repeat", type=int, default=1, help="passes over the grid (alternating direction; default 1)")
    ap.add_argument("--driver", choices=("bench", "replay"), required=True, help="kvtier bench or kvtier replay")
    ap.add_argument("--output", help="sweep JSON (default results/<timestamp>.json)")
    ap.add_argument("--plots", help="directory for the heat-map PNGs")
    ap.add_argument("--html-output", help="a self-contained HTML report (kvtier report's page: interactive heat maps)")
    ap.add_argument("--mount", help="mountpoint, an empty directory (default: a temporary one)")
    ap.add_argument("--backing", help="directory the mount passes through to (default: a temporary one in /var/tmp)")
    ap.add_argument("--stack", default="", help="replay: the arguments of deploy/run-stack.sh up (without --kv-dir)")
    ap.add_argument("--point-timeout", type=float, default=1800, help="seconds one driver run may take (default 1800)")
    return ap


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


_OWNED = {"bench": ("--cache-dir", "--output", "--trials", "--plots", "--config"), "replay": ("--base-url", "--output")}


def _check_driver_args(driver: str, args: list[str]) -> None:
    for a in args:
        if a.split("=", 1)[0] in _OWNED[driver]:
            raise ConfigError(f"{a.split('=', 1)[0]} after --: the sweep sets it for each point")


def _driver_argv(driver: str, args: list[str], mount: str, out: str, stack: live.Stack | None) -> list[str]:
    base = [sys.executable, "-m", "replay.cli", driver, *args, "--output", out]
    if driver == "bench":
        return [*base, "--cache-dir", mount, "--no-progress"]
    assert stack is not None
    ep = stack.endpoints
    extra = ["--base-url", ep["vllm"], "--quiet"]
    if "--model" not in args:
        extra += ["--model", ep["model"]]
    if "--metrics-url" not in args and ep.get("prometheus"):
        # the stack's own Prometheus (--stack '... --prometheus'): every instance's vLLM, LMCache and kvtier
        extra += ["--metrics-url", "prometheus+" + ep["prometheus"]]
    elif "--metrics-url" not in args:
        # every instance's vLLM, so the L2 hit share counts the whole stack
        extra += [a for inst in ep["instances"] for a in ("--metrics-url", inst["vllm"] + "/metrics")]
    return [*base, *extra]


def _throttle_delta(before: dict, after: dict) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for op, a in after.get("ops", {}).items():
        b = before.get("ops", {}).get(op, {})
        d = {k: a.get(k, 0) - b.get(k, 0) for k in ("ops", "bytes", "bw_wait_ns", "lat_ns", "errors")}
        d["added_lat_ms_per_op"] = round(d["lat_ns"] / d["ops"] / 1e6, 4) if d["ops"] else None
        out[op] = d
    return out


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def summarize(driver: str, runs: list[dict]) -> dict[str, Any]:
    """Per point: the median of its runs' figures and their ratios to the reference's median."""
    keys = [k for k, *_ in METRICS[driver]]
    by_point: dict[tuple[float, float, str], list[dict]] = {}
    for r in runs:
        if r["exit_code"] == 0:
            by_point.setdefault((r["bw_bytes_s"], r["lat_ms"], r["bw"]), []).append(r)
    ref_runs = by_point.get((0.0, 0.0, "none"), [])
    ref = {k: median([r["metrics"][k] for r in ref_runs]) for k in keys}
    points = []
    for (bw, lat, text), rs in by_point.items():
        med = {k: median([r["metrics"][k] for r in rs]) for k in keys}
        points.append(
            {
                "bw": text,
                "bw_bytes_s": bw,
                "lat_ms": lat,
                "runs": len(rs),
                "metrics": med,
                "relative": {k: relative(med[k], ref[k]) for k in keys},
            }
        )
    points.sort(key=lambda p: (p["bw_bytes_s"] != 0, -p["bw_bytes_s"], p["lat_ms"]))  # no cap first
    return {"reference": ref, "reference_runs": len(ref_runs), "points": points}


def print_table(driver: str, summary: dict) -> None:
    from replay.outputs.tables import rows_table
    from replay.outputs.terminal import console

    cols = [("bw", "bw cap"), ("lat_ms", "+lat ms"), ("runs", "runs")]
    rows = []
    for p in summary["points"]:
        row = {"bw": p["bw"], "lat_ms": f"{p['lat_ms']:g}", "runs": p["runs"]}
        for key, *_ in METRICS[driver]:
            v, rel = p["metrics"][key], p["relative"][key]
            row[key] = "-" if v is None else (f"{v:.3g}" + (f" (x{rel:.2f})" if rel is not None else ""))
        rows.append(row)
    cols += [(key, head) for key, head, *_ in METRICS[driver]]
    # wide enough for every column even when piped (rich would otherwise squeeze it to 80 columns)
    console(min_width=170).print(
        rows_table(f"kvtier sweep ({driver}): median per point (x = / unthrottled)", rows, cols)
    )


def _progress(i: int, n: int, p: Point, rep: int, msg: str) -> None:
    what = "reference (no cap, +0 ms)" if p.is_reference else f"bw {p.bw_text}, +{p.lat_ms:g} ms"
    print(f"[{i}/{n}] pass {rep + 1}: {what}: {msg}", file=sys.stderr, flush=True)


def runs_dir_of(output: str) -> str:
    return os.path.splitext(output)[0] + ".runs"


class StackFailed(Exception):
    """deploy/stack.py could not start the stack or clear its L1 (it says so with a RuntimeError)."""


def _stack_call(fn, *args):
    try:
        return fn(*args)
    except RuntimeError as exc:  # only from this call: a RuntimeError anywhere else in the sweep is a bug
        raise StackFailed(str(exc)) from exc


def run(a: argparse.Namespace, driver_args: list[str], output: str) -> int:
    bws, lats = parse_bw_list(a.bw), parse_lat_list(a.lat_ms)
    points = grid(bws, lats)
    order = schedule(points, a.repeat)
    runs_dir = runs_dir_of(output)
    os.makedirs(os.path.dirname(os.path.abspath(runs_dir)), exist_ok=True)
    os.mkdir(runs_dir)  # new, like the JSON: checked before the run, which holds the claim on the JSON
    made: list[str] = []  # temporary directories of ours, removed at the end (never a user's)
    if a.mount:
        mount = a.mount
    else:
        mount = tempfile.mkdtemp(prefix="kvtier-sweep-mnt-")
        made.append(mount)
    if a.backing:
        backing = a.backing
    else:
        backing = tempfile.mkdtemp(prefix="kvtier-sweep-kv-", dir=disk_temp_dir())
        made.append(backing)
    from deploy.throttle import ControlError, Mount, MountError

    doc: dict[str, Any] = {
        "kind": "kvtier sweep",
        "driver": a.driver,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "status": "running",
        "grid": {"bw": [t for _, t in bws], "lat_ms": lats, "repeat": a.repeat},
        "driver_args": driver_args,
        "stack_args": a.stack or None,
        "mount": mount,
        "backing": backing,
        "runs_dir": runs_dir,
        "loadavg_start": _loadavg(),
        "order": [{"pass": r, "bw": p.bw_text, "lat_ms": p.lat_ms} for r, p in order],
        "runs": [],
    }
    stack = None
    stack_hold = -1
    code = 0
    bug: BaseException | None = None
    try:
        # Should the sweep be killed, the server unmounts (or a watchdog unmounts it) and our directories go.
        with Mount(mount, backing, ["--bw", "0", "--lat-ms", "0"], remove_after=made) as m:
            if a.driver == "replay":
                state = tempfile.mkdtemp(prefix="kvtier-sweep-stack-")
                made.append(state)
                # The servers run as daemons, which no signal of ours reaches: should the sweep be killed, a
                # watchdog takes the stack down.
                stack_hold = watchdog(run=[["bash", str(live.RUN_STACK), "down", "--state-dir", state]], remove=[state])
                print(f"{PROG}: starting the stack (deploy/run-stack.sh up, state {state})", file=sys.stderr)
                stack = _stack_call(live.start, Path(state), *shlex.split(a.stack), "--kv-dir", mount)
                # Warm-up, not measured: the same prompts every point, so the first point would be the only one
                # computing them all; after this run each point finds the same prefixes in the disk tier.
                warm = os.path.join(runs_dir, "warmup.json")
                print(f"{PROG}: warm-up run (unthrottled, not measured)", file=sys.stderr, flush=True)
                with open(os.path.join(runs_dir, "warmup.log"), "w") as log:
                    argv = _driver_argv(a.driver, driver_args, mount, warm, stack)
                    subprocess.run(
                        argv,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        timeout=a.point_timeout,
                        preexec_fn=die_with_parent(),
                    )
            for i, (rep, p) in enumerate(order, 1):
                m.client.set(**p.changes())
                if stack is not None:
                    for inst in range(len(stack.endpoints.get("instances", []))):
                        _stack_call(live.clear_l1, stack, inst)
                out = os.path.join(runs_dir, f"run-{i:03d}.json")
                argv = _driver_argv(a.driver, driver_args, mount, out, stack)
                _progress(i, len(order), p, rep, "running")
                before = m.client.stats()
                t0 = time.monotonic_ns()
                with open(os.path.join(runs_dir, f"run-{i:03d}.log"), "w") as log:
                    try:
                        rc = subprocess.run(
                            argv,
                            stdout=log,
                            stderr=subprocess.STDOUT,
                            timeout=a.point_timeout,
                            preexec_fn=die_with_parent(),  # a killed sweep's run ends too (and removes its cache)
                        )
                        rc_code = rc.returncode
                    except subprocess.TimeoutExpired:
                        rc_code = 124
                wall_s = (time.monotonic_ns() - t0) / 1e9
                after = m.client.stats()
                res = json.loads(Path(out).read_text()) if os.path.exists(out) else {}
                run_rec = {
                    "index": i,
                    "pass": rep,
                    "bw": p.bw_text,
                    "bw_bytes_s": p.bw_bytes_s,
                    "lat_ms": p.lat_ms,
                    "reference": p.is_reference,
                    "exit_code": rc_code,
                    "wall_s": round(wall_s, 3),
                    "results": out,
                    "metrics": extract(a.driver, res),
                    "throttle": _throttle_delta(before, after),
                    "loadavg": _loadavg(),
                }
                doc["runs"].append(run_rec)
                hk = HEADLINE[a.driver]
                hv = run_rec["metrics"][hk]
                _progress(
                    i, len(order), p, rep, f"exit {rc_code}, {wall_s:.1f} s, {hk} {'-' if hv is None else f'{hv:.3g}'}"
                )
                if rc_code != 0:
                    tail = Path(runs_dir, f"run-{i:03d}.log").read_text()[-400:].strip().splitlines()[-1:]
                    print(f"{PROG}: run {i} failed (exit {rc_code}): {' '.join(tail)}", file=sys.stderr)
                    code = 1
        doc["status"] = "completed" if code == 0 else "completed with failed runs"
    except Interrupted as exc:
        doc["status"] = f"interrupted ({exc})"
        code = exc.exit_code
    except (OSError, MountError, ControlError, StackFailed, subprocess.SubprocessError) as exc:
        # the mount, the stack, the control endpoint, a run that outlived --point-timeout in the warm-up
        doc["status"] = f"failed: {exc}"
        print(f"{PROG}: {exc}", file=sys.stderr)
        code = 1
    except Exception as exc:  # a bug: the points done are still written below, then it is raised (exit 1, logged)
        doc["status"] = f"failed: internal error: {type(exc).__name__}: {exc}"
        bug = exc
    finally:
        if stack is not None:
            live.down(stack.state_dir)
        if stack_hold >= 0:
            os.close(stack_hold)  # taken down here: nothing left for the watchdog
        for d in made:
            shutil.rmtree(d, ignore_errors=True)
    doc["loadavg_end"] = _loadavg()
    doc.update(summarize(a.driver, doc["runs"]))
    if a.plots and doc["points"]:
        from .plots import write_heatmaps

        doc["plots"] = write_heatmaps(doc, a.plots)
    path, moved = write_results(output, doc, is_default=True)  # never replaces a file, even one made meanwhile
    if bug is not None:
        bug.add_note(f"the runs done are in {path}")
        raise bug
    if moved:
        print(f"{PROG}: {moved}; written to {path} instead", file=sys.stderr)
    if doc["points"]:
        print_table(a.driver, doc)
    print(f"results: {path}" + (f", plots in {a.plots}" if a.plots and doc["points"] else ""))
    if a.html_output:
        from replay.outputs.html import write_html  # plotly only when asked

        try:
            write_html(doc, a.html_output, path)
            print(f"report: {a.html_output}")
        except OSError as exc:  # the sweep JSON holds it all: `kvtier report` makes the page from it later
            print(f"{PROG}: --html-output {a.html_output}: not written ({exc.strerror or exc})", file=sys.stderr)
            code = code or 1
    return code


@command("sweep")
def main(argv: list[str] | None = None) -> int:
    own, driver_args = _split(list(sys.argv[1:] if argv is None else argv))
    a = build_parser().parse_args(own)
    # A refusal raises a UserError (ConfigError, SettingError): replay/cli.py says it in one line, exit 2.
    if a.repeat < 1:
        raise ConfigError(f"--repeat {a.repeat}: give 1 or more")
    bws, lats = parse_bw_list(a.bw), parse_lat_list(a.lat_ms)
    if not grid(bws, lats):
        raise ConfigError("the grid has no throttled point (give a cap or a latency above 0)")
    if a.driver == "replay" and not a.stack:
        raise ConfigError("--driver replay needs --stack 'ARGS of deploy/run-stack.sh up' (its --kv-dir is the mount)")
    if a.driver == "bench" and a.stack:
        raise ConfigError("--stack is for --driver replay")
    if "--kv-dir" in shlex.split(a.stack):
        raise ConfigError("--stack: leave out --kv-dir; the sweep puts it on the throttled mount")
    _check_driver_args(a.driver, driver_args)
    for flag, d in (("--mount", a.mount), ("--backing", a.backing)):
        if d and not os.path.isdir(d):
            raise ConfigError(f"{flag} {d}: not a directory")
    if a.mount and os.listdir(a.mount):
        raise ConfigError(f"--mount {a.mount}: not empty (the mount would hide its files)")
    output = a.output or default_results_path()
    # A sweep's JSON and its runs directory go together: neither replaces an earlier sweep's.
    if os.path.lexists(runs_dir_of(output)):
        raise ConfigError(
            f"--output {output}: {runs_dir_of(output)} exists (an earlier sweep's runs); give a new --output"
        )
    claim = claim_outputs(
        {"--output": output, "--html-output": a.html_output},
        {"--plots": a.plots},
        replace=False,
        exists_hint="give a new --output (a sweep never replaces an earlier sweep's results)",
    )
    with claim, stop_signals_raise():
        return run(a, driver_args, output)


if __name__ == "__main__":  # as `kvtier ...`: logging and signals set up by the dispatcher (replay/cli.py)
    from replay.cli import main as kvtier

    sys.exit(kvtier(["sweep", *sys.argv[1:]]))
