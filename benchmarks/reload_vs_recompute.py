#!/usr/bin/env python3
"""reload_vs_recompute.py	TTFT per prompt length: recompute (uncached) vs reload from LMCache L1, kvtier's disk tier
and the disk tier under throttlefs latencies; the reload/recompute ratio and the break-even per-operation latency.

usage: benchmarks/reload_vs_recompute.py [--models tiny,big] [--lengths 1024,2048,4000] [--lat-ms 5,30,100]
                                         [--repeats 4] [--dir DIR] [--json OUT] [--plot PNG]
                                         [--big-layers 4] [--big-hidden 512] [--big-heads 8] [--big-kv-heads 4]
                                         [--big-intermediate 1408]

The JGU Mainz storage-tiering case study ("Wo der KV-Cache liegt: Storage-Tiering für LLM-Inferenz unter realem
Traffic", 2026; vLLM 0.19 + LMCache) found reloading an evicted prefix beat recomputing it 3.5-4.6x on an A100. Here,
per model, one stack is started by deploy/run-stack.sh (vLLM on CPU, LMCache MP server, kvtier's L2 adapter with its
disk tier, O_DIRECT) whose --kv-dir is a throttlefs mount (deploy/throttle) over a directory on the disk; the mount
starts with no throttle. For each prompt length and repeat, with a prompt never sent before:
  1. uncached: the prompt, computed in full (recompute), its chunks stored to L1 and to the disk tier;
  2. L1: the same prompt again (LMCache's memory);
  3. disk: POST /cache/clear (L1 empty), page cache dropped, the prompt again: read back from kvtier's disk tier;
  4. disk +L ms for each --lat-ms: the mount adds L ms to every read, write, fsync and open; L1 cleared, caches
     dropped, the prompt again. The mount goes back to no added latency afterwards.
Steps 3-4 run in increasing latency on even repeats and decreasing on odd ones, so drift (other people's load, a
warming server) does not line up with the latency axis.
TTFT is client-side (request sent -> first token event, streaming, max_tokens 1). Per length the medians, the ratio
reload/recompute (< 1: reloading wins) and the break-even latency, the per-op latency a tier may add before reload
stops beating recompute, two ways: `interp`, linear interpolation between the two measured latencies whose median disk
TTFTs bracket the uncached median (the first crossing; '>L' when none crosses up to the largest L, '<=0' when reload
already loses unthrottled); `fit`, where a least-squares line through the disk medians vs added latency (0 and each
--lat-ms) meets the uncached median (it uses every point, so one noisy median moves it less). The mount's own counters
say how many operations a reload cost (open + read ops per hit): the line's slope (ms of TTFT per ms added)
equals it if they run one after another, less where they overlap. Hits are checked with vLLM's external prefix-cache
counter; a reload that was not a hit is reported and left out.

Models: `tiny` is deploy/make_tiny_model.py's (2 layers, hidden 128, 512 B of KV per token): it recomputes fast.
`big` is built by the same script with its size options, offline, random weights: by default 4 layers of 512, 8 heads
and 4 KV heads of 64, MLP 1408 (16M parameters, 4 KiB of KV per token), so prefill costs more (a 4k prompt takes
hundreds of ms on this CPU). vLLM runs with --max-model-len 4096 for both. Needs root (drop_caches, FUSE).

examples:
  sudo .venv/bin/python benchmarks/reload_vs_recompute.py --json reload.json --plot reload.png
  sudo .venv/bin/python benchmarks/reload_vs_recompute.py --models big --lengths 1024,4000 --lat-ms 5,50 --repeats 4
  .venv/bin/python benchmarks/reload_vs_recompute.py --from-json reload.json --plot reload.png   # table and plot again
  sudo .venv/bin/python benchmarks/reload_vs_recompute.py --models big --big-layers 8 --big-hidden 768 --big-heads 12
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

from deploy import make_tiny_model
from replay.outputs.provenance import write_run_json

ROOT = Path(__file__).resolve().parents[1]

MAX_MODEL_LEN = 4096


def fresh_prompts(model_dir: str, n_tokens: int, n: int, salt: int) -> list[str]:
    """n prompts of n_tokens never sent before: windows of the standard library's sources, shifted by salt."""
    import sysconfig

    from deploy.stack import tokenizer

    tok = tokenizer(model_dir)
    ids: list[int] = []
    for name in ("typing.py", "argparse.py", "inspect.py", "pathlib/_local.py", "pathlib.py", "tarfile.py"):
        p = Path(sysconfig.get_paths()["stdlib"], name)
        if p.exists():
            ids += tok(p.read_text())["input_ids"]
    step = 101
    need = salt * step + n * step + n_tokens
    if len(ids) < need:
        raise SystemExit(f"reload_vs_recompute: not enough source text for {n} prompts of {n_tokens} tokens")
    return [tok.decode(ids[(salt + i) * step : (salt + i) * step + n_tokens]) for i in range(n)]


def interp_break_even(points: list[tuple[float, float]], uncached: float) -> tuple[float | None, str]:
    """(latency, how): the first crossing of the disk TTFT curve over the uncached TTFT, linear between the two
    measured latencies around it. how: 'interp', 'below' (reload loses at the first point), 'above' (never crosses;
    latency is the largest measured) or 'none'."""
    pts = sorted(points)
    if not pts:
        return None, "none"
    if pts[0][1] >= uncached:
        return pts[0][0], "below"
    for (x0, y0), (x1, y1) in itertools.pairwise(pts):
        if y1 >= uncached:
            return x0 + (uncached - y0) * (x1 - x0) / (y1 - y0), "interp"
    return pts[-1][0], "above"


def fit_break_even(points: list[tuple[float, float]], uncached: float) -> tuple[float | None, float | None]:
    """(slope ms of TTFT per ms added, added latency where the line meets the uncached TTFT), None where undefined."""
    if len(points) < 2:
        return None, None
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None, None
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    a = my - b * mx
    if b <= 0:
        return b, None
    return b, (uncached - a) / b


def run_model(a, name: str, model_dir: str, log) -> dict:
    from ttft_kvtier_vs_lmcache import stream_ttft

    from deploy.host import drop_caches
    from deploy.stack import clear_l1_at, down, up, vllm_external_hits
    from deploy.throttle import Mount

    work = Path(a.dir) / name
    shutil.rmtree(work, ignore_errors=True)
    backing, mnt, state = work / "backing", work / "mnt", work / "state"
    backing.mkdir(parents=True)
    mnt.mkdir()
    res: dict = {"model": name, "model_dir": model_dir, "lengths": {}}
    with Mount(str(mnt), str(backing), ["--bw", "0", "--lat-ms", "0"]) as m:
        t0 = time.monotonic()
        stack = up(state, model_dir, mnt, "--disk-gb", "4", "--l1-gb", "2", "--max-model-len", str(MAX_MODEL_LEN),
                   timeout_s=900)  # fmt: skip
        res["start_s"] = round(time.monotonic() - t0, 1)
        log(f"{name}: stack up in {res['start_s']:.0f} s; {len(a.lengths)} lengths x {a.repeats} repeats x "
            f"{3 + len(a.lat_ms)} requests")  # fmt: skip
        base, lm = stack.vllm, stack.inst(0)["lmcache_http"]
        try:
            for w in fresh_prompts(model_dir, 256, 2, 900):  # warm-up: first requests pay one-off costs
                stream_ttft(base, w, 1, timeout_s=300)
            for li, length in enumerate(a.lengths):
                rows: dict[str, list[float]] = {"uncached": [], "l1": [], "disk": []}
                for lat in a.lat_ms:
                    rows[f"disk+{lat:g}"] = []
                ops_per_hit: list[float] = []
                failed: list[str] = []
                for k, prompt in enumerate(fresh_prompts(model_dir, length, a.repeats, 40 * li)):
                    log(f"{name}: {length} tokens, repeat {k + 1}/{a.repeats} (length {li + 1}/{len(a.lengths)}, "
                        f"load {os.getloadavg()[0]:.1f})")  # fmt: skip

                    def timed(label: str, check_hit: bool = True, prompt=prompt, k=k, rows=rows, failed=failed,
                              length=length) -> None:  # fmt: skip
                        h0 = vllm_external_hits(base)
                        r = stream_ttft(base, prompt, 1, timeout_s=600, label=label)
                        hit = vllm_external_hits(base) - h0
                        if not r["ok"] or (check_hit and hit < 256):
                            failed.append(f"{label} #{k}: {r['error'] or f'{hit:.0f} hit tokens'}")
                            return
                        rows[label].append(r["ttft_ms"])
                        log(f"  {name} {length:>5} tok  {label:<10} {r['ttft_ms']:8.1f} ms  ({hit:.0f} hit tokens)")

                    timed("uncached", check_hit=False)
                    time.sleep(1.0)  # let the L2 stores of the computed chunks finish before reading them back
                    timed("l1")
                    order = [0.0, *a.lat_ms] if k % 2 == 0 else [*reversed(a.lat_ms), 0.0]
                    for lat in order:
                        m.client.set(lat_ms=lat)
                        clear_l1_at(lm)
                        drop_caches()
                        before = m.client.stats()
                        timed("disk" if lat == 0 else f"disk+{lat:g}")
                        after = m.client.stats()
                        if lat == 0:
                            ops_per_hit.append(
                                sum(after["ops"][o]["ops"] - before["ops"][o]["ops"] for o in ("read", "open"))
                            )
                    m.client.set(lat_ms=0)
                med = {k: (statistics.median(v) if v else None) for k, v in rows.items()}
                unc = med["uncached"]
                pts = [(0.0, med["disk"])] + [(lat, med[f"disk+{lat:g}"]) for lat in a.lat_ms]
                pts = [p for p in pts if p[1] is not None]
                slope, be = fit_break_even(pts, unc) if unc else (None, None)
                be_i, be_how = interp_break_even(pts, unc) if unc else (None, "none")
                res["lengths"][str(length)] = {
                    "samples_ms": rows,
                    "median_ms": med,
                    "min_ms": {k: (min(v) if v else None) for k, v in rows.items()},
                    "reload_over_recompute": {
                        k: (v / unc if v is not None and unc else None) for k, v in med.items() if k != "uncached"
                    },
                    "slope_ms_per_ms": slope,
                    "break_even_lat_ms": be,
                    "break_even_interp_ms": be_i,
                    "break_even_interp": be_how,
                    "ops_per_disk_hit": statistics.median(ops_per_hit) if ops_per_hit else None,
                    "failed": failed,
                }
        finally:
            down(state)
    return res


def report(results: list[dict], lats: list[float]) -> None:
    head = f"{'model':<6} {'tokens':>6} {'uncached':>9} {'L1':>7} {'disk':>7}"
    head += "".join(f" {'+' + format(lat, 'g') + 'ms':>8}" for lat in lats)
    head += f" {'disk/unc':>9} {'L1/unc':>7} {'ops/hit':>7} {'break-even':>10} {'break-even':>10}"
    print(head)
    print(
        f"{'':<6} {'':>6} {'ms p50':>9} {'ms p50':>7} {'ms p50':>7}"
        + " " * (9 * len(lats))
        + f" {'':>9} {'':>7} {'':>7} {'interp ms':>10} {'fit ms':>10}"
    )

    def f(v, w, fmt=".1f"):
        return f"{'-':>{w}}" if v is None else f"{v:>{w}{fmt}}"

    for r in results:
        for length, d in r["lengths"].items():
            m, rr = d["median_ms"], d["reload_over_recompute"]
            line = f"{r['model']:<6} {length:>6} {f(m['uncached'], 9)} {f(m['l1'], 7)} {f(m['disk'], 7)}"
            line += "".join(f" {f(m[f'disk+{lat:g}'], 8)}" for lat in lats)
            line += f" {f(rr['disk'], 9, '.2f')} {f(rr['l1'], 7, '.2f')} {f(d['ops_per_disk_hit'], 7, '.0f')}"
            how, bi = d.get("break_even_interp", "none"), d.get("break_even_interp_ms")
            cell = {"interp": f"{bi:.2f}" if bi is not None else "-", "below": "<=0", "none": "-"}.get(
                how, f">{bi:g}" if bi is not None else "-"
            )
            fit = d["break_even_lat_ms"]  # a line meeting recompute below 0: reload already loses unthrottled
            line += f" {cell:>10} {'<=0' if fit is not None and fit < 0 else f(fit, 10, '.2f'):>10}"
            print(line + (f"  ({len(d['failed'])} failed)" if d["failed"] else ""))


def plot(results: list[dict], lats: list[float], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 4), squeeze=False)
    for ax, r in zip(axes[0], results, strict=True):
        for i, (length, d) in enumerate(r["lengths"].items()):
            m = d["median_ms"]
            xs = [0.0, *lats]
            ys = [m["disk"], *[m[f"disk+{lat:g}"] for lat in lats]]
            c = f"C{i}"
            ax.plot([x for x, y in zip(xs, ys, strict=True) if y], [y for y in ys if y], "o-", color=c,
                    label=f"{length} tok: disk reload")  # fmt: skip
            for x, key in zip(xs, ["disk", *[f"disk+{lat:g}" for lat in lats]], strict=True):
                samples = d.get("samples_ms", {}).get(key, [])  # each sample, faint: the spread is the load's
                ax.plot([x] * len(samples), samples, ".", color=c, alpha=0.3, ms=4)
            if m["uncached"]:
                ax.axhline(m["uncached"], color=c, ls="--", lw=1, label=f"{length} tok: recompute")
                if d.get("break_even_interp") == "interp":  # where reload stops beating recompute
                    ax.plot([d["break_even_interp_ms"]], [m["uncached"]], "x", color=c, ms=9, mew=2)
            if m["l1"]:
                ax.plot([0], [m["l1"]], "s", color=c, mfc="none")
        ax.set_xlabel("latency added per operation by throttlefs (ms)")
        ax.set_ylabel("TTFT p50 (ms)")
        ax.set_title(
            f"{r['model']} model: reload vs recompute\n(squares: L1, x: break-even, dots: samples)", fontsize=10
        )
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.text(0.995, 0.005, "benchmarks/reload_vs_recompute.py", ha="right", va="bottom", fontsize=7, color="0.45")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--models", default="tiny,big", help="tiny, big or both, in order")
    ap.add_argument("--lengths", default="1024,2048,4000", help="prompt lengths in tokens (<= 4095)")
    ap.add_argument("--lat-ms", default="5,30,100", help="latencies added per operation for the disk reloads (ms)")
    ap.add_argument("--repeats", type=int, default=4, help="fresh prompts per length (default 4)")
    ap.add_argument(
        "--dir",
        default="/var/tmp/reload-vs-recompute",
        help="work dir: models/ (kept), <model>/ (backing, mnt, state: wiped per run)",
    )
    ap.add_argument("--big-layers", type=int, default=4, help="layers of the big model (default 4)")
    ap.add_argument("--big-hidden", type=int, default=512, help="its hidden size (default 512)")
    ap.add_argument("--big-heads", type=int, default=8, help="its attention heads (default 8)")
    ap.add_argument("--big-kv-heads", type=int, default=4, help="its KV heads (default 4)")
    ap.add_argument("--big-intermediate", type=int, default=1408, help="its MLP width (default 1408)")
    ap.add_argument("--json", help="write every sample, median, ratio and break-even here")
    ap.add_argument("--plot", help="PNG: TTFT vs added latency per length, recompute as dashed lines")
    ap.add_argument("--from-json", metavar="JSON", help="no run: the table (and --plot) from an earlier run's --json")
    a = ap.parse_args(argv)
    prog = "reload_vs_recompute"
    if a.from_json:
        try:
            doc = json.loads(Path(a.from_json).read_text())
            lats = sorted({float(k[5:]) for r in doc["results"] for d in r["lengths"].values() for k in d["median_ms"]
                           if k.startswith("disk+")})  # fmt: skip
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"{prog}: --from-json {a.from_json}: {exc}", file=sys.stderr)
            return 2
        report(doc["results"], lats)
        print(f"run of {doc.get('date')}: wall {doc.get('wall_s')} s; load average {doc['loadavg_start'][0]:.1f} -> "
              f"{doc['loadavg_end'][0]:.1f} (2 vCPUs)")  # fmt: skip
        if a.plot:
            plot(doc["results"], lats, a.plot)
        return 0
    try:
        a.lengths = [int(x) for x in a.lengths.split(",")]
        a.lat_ms = [float(x) for x in a.lat_ms.split(",")]
    except ValueError:
        print(f"{prog}: --lengths and --lat-ms are comma-separated numbers", file=sys.stderr)
        return 2
    models = a.models.split(",")
    if set(models) - {"tiny", "big"} or any(not 256 <= n < MAX_MODEL_LEN for n in a.lengths):
        print(f"{prog}: --models from tiny,big; --lengths between 256 and {MAX_MODEL_LEN - 1}", file=sys.stderr)
        return 2
    if a.repeats < 1 or any(lat <= 0 for lat in a.lat_ms):
        print(f"{prog}: --repeats at least 1; --lat-ms positive (0, no throttle, is always measured)", file=sys.stderr)
        return 2
    for name in models:  # a model's work dir is wiped before its run: only one this script made
        work = Path(a.dir) / name
        if work.exists() and (not work.is_dir() or set(os.listdir(work)) - {"backing", "mnt", "state"}):
            print(f"{prog}: {work} holds something this benchmark did not make; choose another --dir", file=sys.stderr)
            return 2
    big_shape = {"layers": a.big_layers, "hidden": a.big_hidden, "heads": a.big_heads, "kv_heads": a.big_kv_heads,
                 "intermediate": a.big_intermediate, "max_len": MAX_MODEL_LEN}  # fmt: skip
    try:
        make_tiny_model.check_shape(big_shape)
    except ValueError as exc:
        print(f"{prog}: {str(exc).replace('--', '--big-')}", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print(f"{prog}: needs root (drop_caches, FUSE)", file=sys.stderr)
        return 2
    tiny = Path(a.dir) / "models" / "tiny"
    dirs = {"tiny": str(tiny)}
    info = {"tiny": make_tiny_model.ensure(str(tiny))}
    if "big" in models:
        big = Path(a.dir) / "models" / "big-{layers}x{hidden}-h{heads}-kv{kv_heads}-i{intermediate}".format(**big_shape)
        print(f"{prog}: big model {big.name} (built once, offline)", file=sys.stderr, flush=True)
        info["big"] = make_tiny_model.ensure(str(big), **big_shape)
        dirs["big"] = str(big)
    for name in models:
        i = info[name]
        print(f"{prog}: {name}: {i['layers']} layers x {i['hidden']}, {i['parameters'] / 1e6:.1f}M parameters, "
              f"{i['kv_bytes_per_token']} B of KV per token", file=sys.stderr)  # fmt: skip
    t0 = time.monotonic()
    load0 = os.getloadavg()
    results = []
    for name in models:
        print(f"{prog}: {name} model, stack starting", file=sys.stderr, flush=True)
        results.append(run_model(a, name, dirs[name], lambda s: print(s, file=sys.stderr, flush=True)))
    wall = time.monotonic() - t0
    doc = {"results": results, "models": info, "wall_s": round(wall, 1), "loadavg_start": load0,
           "loadavg_end": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}  # fmt: skip
    report(results, a.lat_ms)
    print(f"wall {wall:.0f} s; load average {load0[0]:.1f} -> {os.getloadavg()[0]:.1f} (2 vCPUs)")
    if a.json:
        write_run_json(a.json, doc, argv=argv)
    if a.plot:
        plot(results, a.lat_ms, a.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
