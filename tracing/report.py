"""Per-layer latency breakdown of a storage_latency_stack trace.

    python -m tracing.report TRACE [--matched matched.tsv] [--plots DIR]
    python -m tracing.report TRACE --health     (only the warnings below)

Prints what was traced, by process and by instance (block bytes each
process submitted, from matched.tsv beside the trace: pid, instance, why it
was matched), then one table: syscall (VFS) time, block Q2D (insert to dispatch), D2C
(dispatch to completion), fsync/fdatasync, and the gaps between calls, with
count and percentiles per row (percentiles are bucket upper edges: an upper
bound, as bpftrace's log2 buckets allow). With --plots, writes PNG
histograms. matplotlib is imported only for --plots.

Then one line each when the capture is not what it seems: block requests
issued whose completion the trace lacks (over LOST_WARN_SHARE: counts are a
sample), and file bytes the syscalls moved that the block layer did not
see (page cache: buffered reads served from memory, buffered writes left
to the kernel's flusher threads, which are not the traced process).
storage_latency_stack.sh prints these at the end of a capture.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

from .distill import whole_file
from .distiller import LOST_WARN_SHARE, DistillError, lost_completions
from .histparse import Hist, Trace, TraceParseError, parse_trace, read_trace

__all__ = [
    "format_processes",
    "format_table",
    "health_lines",
    "layer_rows",
    "main",
    "process_rows",
    "read_matched",
    "write_plots",
]

READS = ("read", "pread64", "readv", "preadv", "preadv2")
WRITES = ("write", "pwrite64", "writev", "pwritev", "pwritev2")
URING_OPS = {1: "readv", 2: "writev", 4: "read_fixed", 5: "write_fixed", 22: "read", 23: "write"}


def _merge(hists: list[Hist | None]) -> Hist | None:
    out = None
    for h in hists:
        if h is not None and h.total:
            out = h if out is None else out.merged(h)
    return out


def layer_rows(tr: Trace) -> list[tuple[str, str, Hist]]:
    """(layer, what, histogram in microseconds), top of the stack first."""
    rows: list[tuple[str, str, Hist | None]] = [
        ("syscall", "read family", _merge([tr.hist(f"sys_{n}_usecs") for n in READS])),
        ("syscall", "write family", _merge([tr.hist(f"sys_{n}_usecs") for n in WRITES])),
        ("syscall", "io_submit", tr.hist("sys_io_submit_usecs")),
    ]
    for key, h in sorted(tr.maps.get("uring_usecs", {}).items()):
        if isinstance(h, Hist):
            op = URING_OPS.get(int(key), f"op {key}") if key.lstrip("-").isdigit() else key
            rows.append(("io_uring", f"{op} sqe->cqe", h))
    rows += [
        ("block", "Q2D read", tr.hist("q2d_read_usecs")),
        ("block", "Q2D write", tr.hist("q2d_write_usecs")),
        ("device", "D2C read", tr.hist("d2c_read_usecs")),
        ("device", "D2C write", tr.hist("d2c_write_usecs")),
        ("flush", "fsync", tr.hist("fsync_usecs")),
        ("flush", "fdatasync", tr.hist("fdatasync_usecs")),
        ("gap", "write -> fsync", tr.hist("write_fsync_gap_usecs")),
        ("gap", "fadvise -> read", tr.hist("fadvise_read_gap_usecs")),
        ("gap", "device idle", tr.hist("idle_usecs")),
    ]
    return [(layer, what, h) for layer, what, h in rows if h is not None and h.total]


def read_matched(path: str | Path) -> dict[int, dict]:
    """matched.tsv (written by the wrapper): pid -> {group, comm, why, cmdline}."""
    out: dict[int, dict] = {}
    for line in Path(path).read_text(errors="replace").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        f = line.split("\t")
        if len(f) >= 4 and f[0].isdigit():
            out[int(f[0])] = {
                "group": int(f[1]) if f[1].isdigit() else 0,
                "comm": f[2],
                "why": f[3],
                "cmdline": f[4] if len(f) > 4 else "",
            }
    return out


def process_rows(tr: Trace, matched: dict[int, dict] | None = None) -> list[dict]:
    """One row per traced process that matched or did block I/O: pid,
    instance, task name, block bytes it submitted (read, write), why."""
    matched = matched or {}
    rows: dict[int, dict] = {}
    for op in ("read", "write"):
        for key, v in tr.maps.get(f"proc_{op}_bytes", {}).items():
            pid_s, _, comm = key.partition(",")
            if not pid_s.strip().isdigit() or not isinstance(v, int):
                continue
            pid = int(pid_s)
            r = rows.setdefault(pid, {"pid": pid, "comm": comm.strip().strip('"'), "read_bytes": 0, "write_bytes": 0})
            r[f"{op}_bytes"] += v
    for pid, m in matched.items():
        rows.setdefault(pid, {"pid": pid, "comm": m["comm"], "read_bytes": 0, "write_bytes": 0})
    for pid, r in rows.items():
        m = matched.get(pid, {})
        r["group"] = m.get("group", 0)
        r["why"] = m.get("why", "not in matched.tsv")
    return sorted(rows.values(), key=lambda r: (r["group"], r["pid"]))


def _fmt_bytes(n: int) -> str:
    for unit, m in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= m:
            return f"{n / m:.1f} {unit}"
    return f"{n} B"


def issued_bytes(tr: Trace, op: str) -> int:
    """Block bytes issued to the device, from @io_<op>_bytes[size] counts."""
    total = 0
    for key, v in tr.maps.get(f"io_{op}_bytes", {}).items():
        if key.strip().isdigit() and isinstance(v, int):
            total += int(key) * v
    return total


# the block layer saw "clearly less" than the syscalls moved: under this share
PAGE_CACHE_SHARE = 0.8
PAGE_CACHE_MIN_BYTES = 1 << 20  # and at least this much unseen: a few cached reads are no news


def health_lines(tr: Trace) -> list[str]:
    """One line per way the capture under-reports the storage I/O (none: [])."""
    out = []
    lost, issued = lost_completions(tr)
    if issued and lost / issued > LOST_WARN_SHARE:
        out.append(
            f"WARNING: {lost} of {issued} block requests issued ({100 * lost / issued:.1f}%) have no completion "
            "in the trace (probe runs lost): counts and latencies are a sample"
        )
    for op, past, cached in (
        ("read", "read", "served from the page cache"),
        ("write", "wrote", "left in the page cache (written back later by kernel threads, not the traced process)"),
    ):
        sys_b = tr.number(f"file_{op}_bytes")
        blk_b = issued_bytes(tr, op)
        if sys_b and blk_b < PAGE_CACHE_SHARE * sys_b and sys_b - blk_b >= PAGE_CACHE_MIN_BYTES:
            out.append(
                f"block layer {past} {_fmt_bytes(blk_b)} of the {_fmt_bytes(sys_b)} the syscalls {past} to files: "
                f"{100 * (1 - blk_b / sys_b):.0f}% {cached}"
            )
    return out


def format_processes(tr: Trace, matched: dict[int, dict] | None = None) -> str:
    rows = process_rows(tr, matched)
    # a --per-instance capture holds one instance: the others' rows (all zero) are not its
    inst = re.search(r"\binstance (\d+)\b", tr.meta.get("filter", ""))
    if inst:
        rows = [r for r in rows if r["group"] == int(inst.group(1))]
    if not rows:
        return ""
    # one traced process: the tracer keeps no per-process counts (the totals are its)
    counted = any(tr.maps.get(f"proc_{op}_bytes") for op in ("read", "write"))

    def b(n: int) -> str:
        return _fmt_bytes(n) if counted else "-"

    lines = ["block I/O by process (bytes submitted; instance from matched.tsv):"]
    head = f"{'inst':>4} {'pid':>8} {'task':<16}{'read':>11}{'write':>11}  why"
    lines += [head, "-" * 78]
    for r in rows:
        lines.append(
            f"{r['group'] or '-':>4} {r['pid']:>8} {r['comm'][:15]:<16}{b(r['read_bytes']):>11}"
            f"{b(r['write_bytes']):>11}  {r['why'][:40]}"
        )
    groups = sorted({r["group"] for r in rows})
    if len(groups) > 1:
        lines.append("")
        lines.append("by instance:")
        for g in groups:
            rs = [r for r in rows if r["group"] == g]
            rd, wr = sum(r["read_bytes"] for r in rs), sum(r["write_bytes"] for r in rs)
            n = f"{len(rs)} process{'' if len(rs) == 1 else 'es'}"
            lines.append(f"  instance {g or '-'}: {n}, read {b(rd)}, write {b(wr)}")
    rd, wr = issued_bytes(tr, "read"), issued_bytes(tr, "write")
    if rd or wr:
        lines.append(f"issued to the device: read {_fmt_bytes(rd)}, write {_fmt_bytes(wr)} (after merges)")
    return "\n".join(lines) + "\n\n"


def _fmt_us(v: float) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if v >= 1_000_000:
        return f"{v / 1e6:.1f}s"
    if v >= 1000:
        return f"{v / 1000:.1f}ms"
    return f"{v:.0f}us"


def format_table(tr: Trace) -> str:
    lines = []
    win = f"{tr.window_ns / 1e9:.2f} s" if tr.window_ns else "unknown (cut before END)"
    lines.append(f"capture window: {win}")
    if tr.meta.get("layers_on"):
        lines.append(f"layers traced:  {tr.meta['layers_on']}")
    if tr.meta.get("layers_off") and tr.meta["layers_off"] != "none":
        lines.append(f"NOT traced:     {tr.meta['layers_off']}")
    if tr.meta.get("missed_events", "0") not in ("0", ""):
        lines.append(f"kernel skipped: {tr.meta['missed_events']} probe runs (counts are a sample)")
    for op in ("read", "write"):
        iss, comp = tr.number(f"issued_{op}"), tr.number(f"completed_{op}")
        if iss or comp:
            lines.append(f"{'block ' + op + 's:':<16}issued {iss}, completed {comp}")
    lines.append("")
    head = f"{'layer':<9}{'what':<18}{'count':>9}{'mean':>9}{'p50':>9}{'p90':>9}{'p99':>9}"
    lines += [head, "-" * len(head)]
    rows = layer_rows(tr)
    for layer, what, h in rows:
        lines.append(
            f"{layer:<9}{what:<18}{h.total:>9}{_fmt_us(h.mean()):>9}{_fmt_us(h.quantile(0.5)):>9}"
            f"{_fmt_us(h.quantile(0.9)):>9}{_fmt_us(h.quantile(0.99)):>9}"
        )
    if not rows:
        lines.append("(no latency histograms in this trace)")
    lines.append("")
    lines.append("percentiles are bucket upper edges (log2 buckets): upper bounds")
    return "\n".join(lines) + "\n"


def _label(b) -> str:
    def short(v):
        for s, m in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
            if v and abs(v) >= m and v % m == 0:
                return f"{v // m}{s}"
        return str(v)

    if b.lo is None:
        return f"<{short(b.hi)}"
    if b.hi is None:
        return f">={short(b.lo)}"
    return short(b.lo)


def write_plots(tr: Trace, out_dir: str | Path) -> list[Path]:
    import matplotlib  # lazily: only --plots needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def grid(name: str, title: str, panels: list[tuple[str, Hist]], xlabel: str):
        panels = [(t, h) for t, h in panels if h is not None and h.total]
        if not panels:
            return
        n = len(panels)
        cols = 2 if n > 1 else 1
        rows = math.ceil(n / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 3.2 * rows), squeeze=False)
        for ax, (t, h) in zip(axes.flat, panels):
            # trim empty buckets at both ends
            bs = h.buckets
            first = next(i for i, b in enumerate(bs) if b.count)
            last = max(i for i, b in enumerate(bs) if b.count)
            bs = bs[first : last + 1]
            ax.bar(range(len(bs)), [b.count for b in bs], color="#3b6ea5")
            ax.set_xticks(range(len(bs)))
            ax.set_xticklabels([_label(b) for b in bs], rotation=60, fontsize=7)
            ax.set_title(f"{t} (n={h.total})", fontsize=9)
            ax.set_xlabel(xlabel, fontsize=8)
            ax.set_ylabel("count", fontsize=8)
        for ax in list(axes.flat)[n:]:
            ax.axis("off")
        fig.suptitle(title, fontsize=10)
        fig.tight_layout()
        path = out / f"{name}.png"
        with whole_file(path, suffix=".png") as tmp:  # a plot being viewed is replaced whole
            fig.savefig(tmp, dpi=110)
        plt.close(fig)
        written.append(path)

    grid(
        "latency_by_layer",
        "Latency by layer (bucket lower edges, microseconds)",
        [(f"{layer}: {what}", h) for layer, what, h in layer_rows(tr)],
        "usecs",
    )
    grid(
        "request_sizes",
        "Block request sizes",
        [("read", tr.hist("bs_read_bytes")), ("write", tr.hist("bs_write_bytes"))],
        "bytes",
    )
    grid(
        "queue_depth",
        "Outstanding requests at dispatch",
        [("read", tr.hist("qdepth_read")), ("write", tr.hist("qdepth_write"))],
        "requests",
    )
    grid(
        "lba_regions",
        "Where requests landed (LBA region index)",
        [("read", tr.hist("lba_region_read_gib")), ("write", tr.hist("lba_region_write_gib"))],
        "region",
    )
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tracing.report", description="Per-layer latency table (and PNG histograms) of a trace."
    )
    p.add_argument("trace", help="storage_latency_stack output (text or JSON)")
    p.add_argument("--plots", metavar="DIR", help="write PNG histograms into DIR")
    p.add_argument("--health", action="store_true", help="print only the warnings (lost completions, page cache)")
    p.add_argument(
        "--matched", metavar="TSV", help="the matched processes (default: matched.tsv beside TRACE, or one folder up)"
    )
    try:
        args = p.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0) and 2
    try:
        tr = parse_trace(read_trace(args.trace))  # refuses a FIFO, a binary file; reads past a BOM
    except OSError as exc:
        print(f"report: cannot read {args.trace}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except TraceParseError as exc:
        print(f"report: {args.trace}: {exc}", file=sys.stderr)
        return 2
    if tr.truncated:  # the table holds only what came before the cut
        print(f"report: warning: {args.trace} is truncated (" + "; ".join(tr.cuts[:3]) + ")", file=sys.stderr)
    if args.health:
        for line in health_lines(tr):
            print(line)
        return 0
    matched_path = Path(args.matched) if args.matched else Path(args.trace).parent / "matched.tsv"
    if not args.matched and not matched_path.is_file():  # --per-instance: DIR/group<N>/trace.txt, DIR/matched.tsv
        matched_path = Path(args.trace).parent.parent / "matched.tsv"
    matched = None
    if matched_path.is_file():
        try:
            matched = read_matched(matched_path)
        except OSError as exc:
            print(f"report: cannot read {matched_path}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    elif args.matched:
        print(f"report: --matched {args.matched}: no such file", file=sys.stderr)
        return 2
    sys.stdout.write(format_processes(tr, matched))
    sys.stdout.write(format_table(tr))
    for line in health_lines(tr):
        print(line)
    if args.plots:
        try:
            paths = write_plots(tr, args.plots)
        except ImportError:
            print("report: --plots needs matplotlib (pip install matplotlib)", file=sys.stderr)
            return 2
        except DistillError as exc:
            print(f"report: {exc}", file=sys.stderr)
            return 2
        except OSError as exc:  # the folder itself cannot be made
            print(f"report: cannot write plots to {args.plots}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        for path in paths:
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
