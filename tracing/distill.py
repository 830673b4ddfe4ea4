"""Distil a storage_latency_stack trace into a fio job that replays its I/O.

    python -m tracing.distill -i TRACE [--process NAME] [--window-s S] -o job.fio

What comes from where (all block-layer figures are per request as the
device saw it, after merging and splitting):

* ``bssplit``: exact request sizes (``@io_read_bytes``) when present, else
  the log2 size histogram (``@bs_read_bytes``), read and write separately;
* ``rwmixread``: completed block requests, reads vs writes (not app ops);
* ``iodepth``: the level the outstanding depth (insert to completion,
  sampled at each dispatch) fills up to (see plateau_edge), cross-checked
  by Little's law (outstanding time of reads plus writes over the real
  capture window = mean depth), which wins when the two disagree;
* ``rw``/``percentage_random``: the share of requests that started where
  the previous one of the same direction ended (sequential) vs elsewhere;
* ``thinktime``: only if the device was idle (nothing of ours in flight
  for >= 100 us) for at least 5% of the window;
* ``ioengine``: io_uring when the process submitted io_uring requests, else
  libaio; always ``direct=1``; the target is ``${TARGET}``.

Standard library only. User errors: one line on stderr, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .histparse import Hist, Stats, Trace, TraceParseError, parse_trace

__all__ = ["DistillError", "Distilled", "distill", "render_job", "validate_job", "main"]

SEQ_THRESHOLD = 0.8      # this share of sequential requests makes a direction sequential
MIN_SPLIT_PCT = 1        # bssplit entries rounding below this are dropped (and said so)
IDLE_MIN_SHARE = 0.05    # thinktime only when idle gaps cover this share of the window


class DistillError(Exception):
    """The trace cannot give a job (empty, cut before END without --window-s, ...)."""


@dataclass
class Distilled:
    job_name: str
    rw: str
    rwmixread: int | None
    bssplit_read: list[tuple[int, int]]
    bssplit_write: list[tuple[int, int]]
    iodepth: int
    ioengine: str
    runtime_s: int
    size: str
    percentage_random: tuple[int, int] | None = None
    thinktime_us: int | None = None
    thinktime_blocks: int | None = None
    notes: list[str] = field(default_factory=list)
    figures: dict = field(default_factory=dict)


# --- helpers -------------------------------------------------------------------

def _op_hist(tr: Trace, base: str, op: str, unit: str) -> Hist | None:
    """``@base_op_unit`` (ours) or ``@base_unit[op]`` (keyed form)."""
    return tr.hist(f"{base}_{op}_{unit}") or tr.hist(f"{base}_{unit}", op)


def _op_num(tr: Trace, base: str, op: str) -> int:
    return tr.number(f"{base}_{op}") or tr.number(base, op)


def fio_size(nbytes: int) -> str:
    for suffix, mult in (("m", 1 << 20), ("k", 1 << 10)):
        if nbytes >= mult and nbytes % mult == 0:
            return f"{nbytes // mult}{suffix}"
    return str(nbytes)


def _largest_remainder(weights: dict[int, float]) -> list[tuple[int, int]]:
    total = sum(weights.values())
    if total <= 0:
        return []
    raw = {k: 100.0 * w / total for k, w in weights.items()}
    floor = {k: int(math.floor(v)) for k, v in raw.items()}
    left = 100 - sum(floor.values())
    for k in sorted(raw, key=lambda k: raw[k] - floor[k], reverse=True)[:left]:
        floor[k] += 1
    return sorted(floor.items())


def size_split(tr: Trace, op: str) -> tuple[list[tuple[int, int]], list[str]]:
    """[(size_bytes, percent)] summing to 100, plus notes on what was dropped."""
    notes: list[str] = []
    exact = tr.maps.get(f"io_{op}_bytes")
    weights: dict[int, float] = {}
    if exact:
        for k, v in exact.items():
            try:
                size = int(k)
            except ValueError:
                continue
            if isinstance(v, int) and v > 0 and size > 0:
                weights[size] = weights.get(size, 0) + v
        source = f"@io_{op}_bytes (exact sizes)"
    else:
        h = _op_hist(tr, "bs", op, "bytes")
        if h is None:
            return [], []
        for b in h.buckets:
            if b.count <= 0:
                continue
            size = int(b.representative) if (b.hi is None or b.hi - (b.lo or 0) == 1) else int(b.lo or 0)
            if size <= 0:
                notes.append(f"{op}: {b.count} requests in a bucket below 1 byte dropped")
                continue
            weights[size] = weights.get(size, 0) + b.count
        source = f"@bs_{op}_bytes (log2 buckets, lower bounds)"
    # sector multiples only: fio with direct=1 needs them
    fixed: dict[int, float] = {}
    for size, w in weights.items():
        s = max(512, int(round(size / 512.0)) * 512)
        fixed[s] = fixed.get(s, 0) + w
    split = _largest_remainder(fixed)
    kept = [(s, p) for s, p in split if p >= MIN_SPLIT_PCT]
    dropped = [s for s, p in split if p < MIN_SPLIT_PCT]
    if dropped:
        share = 100.0 * sum(fixed[s] for s in dropped) / sum(fixed.values())
        notes.append(f"{op}: {len(dropped)} sizes under {MIN_SPLIT_PCT}% dropped ({share:.2f}% of requests)")
        kept = _largest_remainder({s: fixed[s] for s, _ in kept})
    notes.insert(0, f"{op} sizes from {source}")
    return kept, notes


def plateau_edge(qd: Hist) -> int:
    """The depth the process fills up to: from the most frequent sampled depth,
    the last depth still sampled at least half as often. A fio job with
    iodepth=N shows depths 1..N about evenly (it reaps and refills), an
    application holding N shows a peak at N: both give N. The few samples
    above it (a completion the kernel skipped leaves its request counted as
    outstanding) do not move it, as they would a high percentile."""
    bs = [b for b in qd.buckets if b.lo is not None and b.lo >= 0]
    if not bs:
        return 1
    peak = max(range(len(bs)), key=lambda i: bs[i].count)
    i = peak
    while i + 1 < len(bs) and bs[i + 1].count >= 0.5 * bs[peak].count:
        i += 1
    return max(1, int(bs[i].lo))


def _pct_split(split: list[tuple[int, int]]) -> str:
    return ":".join(f"{fio_size(s)}/{p}" for s, p in split)


# --- the distiller -------------------------------------------------------------

def distill(tr: Trace, *, process: str | None = None, window_s: float | None = None,
            runtime_s: int | None = None, size: str | None = None) -> Distilled:
    notes: list[str] = []
    if window_s is not None:
        if window_s <= 0:
            raise DistillError("--window-s must be positive")
        window = float(window_s)
        notes.append(f"capture window {window:.3f} s given by --window-s")
    elif tr.window_ns:
        window = tr.window_ns / 1e9
    else:
        raise DistillError("the trace has no capture window (cut before END?); give --window-s")
    missed = tr.meta.get("missed_events", "")
    if missed.isdigit() and int(missed) > 0:
        notes.append(f"the kernel skipped {missed} probe runs (BPF recursion guard): "
                     "counts are a sample and the sampled depth may drift; mix and sizes are still fair")
    if tr.truncated:
        notes.append("the trace is truncated: " + "; ".join(tr.problems[:3] or ["no END"]))

    reads = _op_num(tr, "completed", "read")
    writes = _op_num(tr, "completed", "write")
    if reads + writes == 0:  # a trace without completions: fall back on issues
        reads, writes = _op_num(tr, "issued", "read"), _op_num(tr, "issued", "write")
        if reads + writes:
            notes.append("no completions in trace: counts from issued requests")
    if reads + writes == 0:
        hr, hw = _op_hist(tr, "bs", "read", "bytes"), _op_hist(tr, "bs", "write", "bytes")
        reads, writes = (hr.total if hr else 0), (hw.total if hw else 0)
    if reads + writes == 0:
        raise DistillError("no block-layer I/O in the trace: nothing to distil "
                           "(wrong process or device filter, or a page-cache-only workload?)")
    figures: dict = {"window_s": round(window, 3), "reads": reads, "writes": writes}
    for key in ("requeue_reqs", "merged_reqs", "unmatched_reqs", "dup_issue_reqs", "lost_reqs", "other_reqs"):
        if tr.number(key):
            figures[key] = tr.number(key)
    issued = _op_num(tr, "issued", "read") + _op_num(tr, "issued", "write")
    figures["issued"] = issued

    split_r, nr = size_split(tr, "read") if reads else ([], [])
    split_w, nw = size_split(tr, "write") if writes else ([], [])
    notes += nr + nw
    if reads and not split_r:
        split_r = [(4096, 100)]
        notes.append("read sizes missing from trace: 4k assumed")
    if writes and not split_w:
        split_w = [(4096, 100)]
        notes.append("write sizes missing from trace: 4k assumed")
    if tr.number("other_reqs"):
        notes.append(f"{tr.number('other_reqs')} discard/other requests dropped (fio job has reads and writes only)")

    # queue depth: sampled at dispatch, and Little's law as a cross-check
    qd = None
    for op in ("read", "write"):
        h = tr.hist(f"qdepth_{op}") or tr.hist("qdepth", op)
        if h:
            qd = h if qd is None else qd.merged(h)
    # outstanding time (insert to complete) when traced, else device time
    busy_us = 0
    for op in ("read", "write"):
        st = tr.get(f"q2c_stats_{op}_usecs") or tr.get(f"d2c_stats_{op}_usecs") or tr.get("d2c_stats_usecs", op)
        if isinstance(st, Stats):
            busy_us += st.total
    # the span with I/O in it (first outstanding request to last completion)
    # when the trace has it, so idle time before and after does not dilute it
    span = tr.active_span_ns / 1e9 if tr.active_span_ns and window_s is None else window
    little = busy_us / (span * 1e6) if span > 0 else math.nan
    if busy_us:
        figures["iodepth_little"] = round(little, 2)
        figures["little_span_s"] = round(span, 3)
    if qd is not None and qd.total:
        qmean = qd.mean()
        edge = plateau_edge(qd)
        figures["iodepth_sampled_mean"] = round(qmean, 2)
        figures["iodepth_sampled_p50"] = qd.quantile(0.5)
        figures["iodepth_sampled_edge"] = edge
        iodepth = max(1, edge)
        if busy_us and not (0.6 <= edge / max(little, 1e-9) <= 3.0):
            iodepth = max(1, int(round(little)))
            notes.append(f"sampled depth (edge {edge}) and Little's law ({little:.1f}) disagree: "
                         "iodepth from Little's law")
    elif busy_us:
        iodepth = max(1, int(round(little)))
        notes.append("no sampled queue depth in trace: iodepth from Little's law")
    else:
        iodepth = 1
        notes.append("no queue depth or outstanding times in trace: iodepth=1 assumed")

    # sequential or random, per direction
    seq_share: dict[str, float | None] = {}
    for op, n in (("read", reads), ("write", writes)):
        s = tr.number(f"seq_{op}_reqs") or tr.number("seq_reqs", op)
        r = tr.number(f"rand_{op}_reqs") or tr.number("rand_reqs", op)
        seq_share[op] = s / (s + r) if (s + r) and n else None
        if n and seq_share[op] is not None:
            figures[f"seq_share_{op}"] = round(seq_share[op], 3)
    if all(seq_share[o] is None for o in ("read", "write")):
        notes.append("no sector pattern in trace: random access assumed")

    def is_seq(op: str) -> bool:
        v = seq_share[op]
        return v is not None and v >= SEQ_THRESHOLD

    def pct_random(op: str) -> int:
        v = seq_share[op]
        return 100 if v is None else int(round(100 * (1 - v)))

    percentage_random = None
    if reads and writes:
        rwmix = int(round(100.0 * reads / (reads + writes)))
        rwmix = min(99, max(1, rwmix))
        if is_seq("read") and is_seq("write"):
            rw = "rw"
        elif pct_random("read") >= 90 and pct_random("write") >= 90:
            rw = "randrw"
        else:
            rw = "randrw"
            percentage_random = (pct_random("read"), pct_random("write"))
    else:
        rwmix = None
        op = "read" if reads else "write"
        if is_seq(op):
            rw = op
        else:
            rw = "rand" + op
            if pct_random(op) < 90:
                percentage_random = (pct_random(op), pct_random(op))

    # thinktime from real idle gaps only
    thinktime_us = thinktime_blocks = None
    idle = tr.get("idle_stats_usecs")
    if isinstance(idle, Stats) and idle.count:
        share = idle.total / (window * 1e6)
        figures["idle_share"] = round(share, 3)
        if share >= IDLE_MIN_SHARE:
            thinktime_us = max(1, idle.average)
            thinktime_blocks = max(1, int(round((reads + writes) / idle.count)))
        else:
            notes.append(f"idle gaps cover {100 * share:.1f}% of the window: no thinktime")

    uring = sum(v for v in tr.maps.get("uring_sqes", {}).values() if isinstance(v, int))
    ioengine = "io_uring" if uring else "libaio"
    if uring:
        figures["io_uring_sqes"] = uring

    if size is None:
        size = _footprint(tr)
    name = re.sub(r"[^A-Za-z0-9]+", "-", (process or "traced")).strip("-") or "traced"
    return Distilled(
        job_name=f"{name}-distilled", rw=rw, rwmixread=rwmix, bssplit_read=split_r, bssplit_write=split_w,
        iodepth=iodepth, ioengine=ioengine, runtime_s=runtime_s or max(1, int(math.ceil(window))), size=size,
        percentage_random=percentage_random, thinktime_us=thinktime_us, thinktime_blocks=thinktime_blocks,
        notes=notes, figures=figures)


def _footprint(tr: Trace) -> str:
    """The span of LBA regions touched, in whole GiB (at least 1 GiB)."""
    m = re.search(r"region (\d+) GiB", " ".join(tr.lines))
    width = int(m.group(1)) if m else 0
    regions = 0
    for op in ("read", "write"):
        h = tr.hist(f"lba_region_{op}_gib")
        if h:
            regions = max(regions, sum(1 for b in h.buckets if b.count))
    gib = max(1, regions * width) if width else 1
    return f"{gib}g"


def render_job(d: Distilled, *, source: str, tr: Trace) -> str:
    out: list[str] = []
    c = out.append
    c(f"; {d.job_name}: fio job distilled from a storage_latency_stack trace.")
    c(f"; Source trace: {source}")
    c(f"; Capture window: {d.figures['window_s']} s; block requests completed: "
      f"{d.figures['reads']} reads, {d.figures['writes']} writes (issued {d.figures['issued']}).")
    if tr.meta:
        for k in ("layers_on", "layers_off", "filter", "filter_pid", "filter_comm", "dev", "missed_events"):
            if k in tr.meta:
                c(f"; {k}: {tr.meta[k]}")
    fig = d.figures
    depth = [f"sampled edge {fig['iodepth_sampled_edge']}" if "iodepth_sampled_edge" in fig else None,
             f"median {fig['iodepth_sampled_p50']:g}" if "iodepth_sampled_p50" in fig else None,
             f"mean {fig['iodepth_sampled_mean']}" if "iodepth_sampled_mean" in fig else None,
             f"Little's law {fig['iodepth_little']} over {fig['little_span_s']} s of I/O"
             if "iodepth_little" in fig else None]
    c("; Queue depth: " + (", ".join(x for x in depth if x) or "not in trace"))
    for k in ("requeue_reqs", "merged_reqs", "unmatched_reqs", "dup_issue_reqs", "lost_reqs"):
        if k in fig:
            c(f"; {k}: {fig[k]}")
    c("; Kept and dropped:")
    for n in d.notes:
        c(f";   {n}")
    c("; Run: TARGET=/path/to/file-or-device fio THIS_FILE")
    c("; (a device is overwritten by the write part; use a file to be safe)")
    c("")
    c("[global]")
    c("; the traced process's block I/O replayed on ${TARGET}")
    c("filename=${TARGET}")
    c("; bytes of ${TARGET} to spread I/O over (the traced LBA footprint)")
    c(f"size={d.size}")
    c(f"ioengine={d.ioengine}")
    c("; the block layer is what was traced: bypass the page cache")
    c("direct=1")
    c("time_based")
    c(f"runtime={d.runtime_s}")
    c("randrepeat=0")
    c("norandommap")
    c("group_reporting")
    c("")
    c(f"[{d.job_name}]")
    c(f"rw={d.rw}")
    if d.percentage_random is not None:
        c("; share of requests that did not continue the previous one, read,write")
        c(f"percentage_random={d.percentage_random[0]},{d.percentage_random[1]}")
    if d.rwmixread is not None:
        c("; from completed block requests, not application calls")
        c(f"rwmixread={d.rwmixread}")
    if d.bssplit_read and d.bssplit_write:
        c("; request sizes as the device saw them: reads,writes")
        c(f"bssplit={_pct_split(d.bssplit_read)},{_pct_split(d.bssplit_write)}")
    else:
        c("; request sizes as the device saw them")
        c(f"bssplit={_pct_split(d.bssplit_read or d.bssplit_write)}")
    c("; requests outstanding when one was dispatched: the level filled up to")
    c(f"iodepth={d.iodepth}")
    if d.thinktime_us is not None:
        c("; the device sat idle between bursts for this long, this often")
        c(f"thinktime={d.thinktime_us}")
        c(f"thinktime_blocks={d.thinktime_blocks}")
    return "\n".join(out) + "\n"


def validate_job(text: str) -> str | None:
    """fio --parse-only on the job; None when fine or fio is absent, else fio's complaint."""
    fio = shutil.which("fio")
    if not fio:
        return None
    with tempfile.NamedTemporaryFile("w", suffix=".fio", delete=False) as f:
        f.write(text)
        path = f.name
    try:
        env = dict(os.environ)
        env.setdefault("TARGET", "/tmp/kvtier-distill-parse-check")
        p = subprocess.run([fio, "--parse-only", path], capture_output=True, text=True, env=env, timeout=30)
        return None if p.returncode == 0 else (p.stderr or p.stdout).strip().splitlines()[0]
    finally:
        os.unlink(path)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tracing.distill",
        description="Turn a storage_latency_stack trace (bpftrace text or JSON) into a fio job.",
        epilog="examples:\n"
               "  python -m tracing.distill -i out/trace.txt -o job.fio\n"
               "  python -m tracing.distill -i trace.json --process vllm --window-s 30 -o vllm.fio\n"
               "  TARGET=/mnt/nvme/fio.dat fio job.fio",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-i", "--input", required=True, help="trace file (text or -f json output)")
    p.add_argument("-o", "--output", help="fio job to write (default: stdout)")
    p.add_argument("--process", help="name for the fio job section (the trace is already filtered at capture)")
    p.add_argument("--window-s", type=float, help="capture window in seconds, for traces cut before END")
    p.add_argument("--runtime-s", type=int, help="fio runtime (default: the capture window)")
    p.add_argument("--size", help="fio size= (default: the traced LBA footprint, at least 1g)")
    p.add_argument("--dump-json", metavar="FILE", help="also write the parsed histograms as JSON")
    p.add_argument("--no-validate", action="store_true", help="skip fio --parse-only")
    return p


class _ArgError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, no usage dump
        raise _ArgError(message)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    parser.__class__ = _Parser
    try:
        args = parser.parse_args(argv)
    except _ArgError as exc:
        print(f"distill: {exc}", file=sys.stderr)
        return 2
    try:
        path = Path(args.input)
        try:
            text = path.read_text(errors="replace")
        except OSError as exc:
            raise DistillError(f"cannot read {path}: {exc.strerror or exc}") from exc
        try:
            tr = parse_trace(text)
        except TraceParseError as exc:
            raise DistillError(f"{path}: {exc}") from exc
        if args.dump_json:
            Path(args.dump_json).write_text(json.dumps(tr.to_json(), indent=1) + "\n")
        if not args.output and args.dump_json:
            return 0
        if args.runtime_s is not None and args.runtime_s <= 0:
            raise DistillError("--runtime-s must be positive")
        d = distill(tr, process=args.process, window_s=args.window_s, runtime_s=args.runtime_s, size=args.size)
        job = render_job(d, source=str(path), tr=tr)
        if not args.no_validate:
            err = validate_job(job)
            if err:
                raise DistillError(f"fio rejects the generated job: {err}")
        if args.output:
            try:
                Path(args.output).write_text(job)
            except OSError as exc:
                raise DistillError(f"cannot write {args.output}: {exc.strerror or exc}") from exc
        else:
            sys.stdout.write(job)
    except DistillError as exc:
        print(f"distill: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
