"""Distil a storage_latency_stack trace into a fio job that replays its I/O.

    kvtier distill -i TRACE [--process NAME] [--window-s S] -o job.fio
    python -m tracing.distill ...      (the same, where only tracing/ is copied)

What comes from where (all block-layer figures are per request as the
device saw it, after merging and splitting):

* ``bssplit``: exact request sizes (``@io_read_bytes``) when present, else
  the log2 size histogram (``@bs_read_bytes``), read and write separately;
* ``rwmixread``: completed block requests, reads vs writes (not app ops);
* ``iodepth``: the level the outstanding depth (insert to completion,
  sampled at each dispatch) fills up to (see plateau_edge). Little's law
  (dispatch rate times mean outstanding time over the span with I/O = mean
  depth) is printed beside it and replaces it, rounded up, only when the
  samples cannot be right: a fill level under 0.6x the mean, or a sampled
  mean over 1.5x Little's law + 1 (requests whose completion was never
  seen still counted: a trace from a tracer that did not drop them);
* ``rw``/``percentage_random``: the share of requests that started where
  the previous one of the same direction ended (sequential) vs elsewhere;
* ``thinktime``: only if the device was idle (nothing of ours in flight
  for >= 100 us) for at least 5% of the window;
* ``ioengine``: io_uring when the process submitted io_uring requests, else
  libaio; always ``direct=1``; the target is ``${TARGET}``.

Bad input (tracing/README.md has the table): a user's mistake
(bad flag or value, a file that is not a trace, an output that cannot be
written) is one line on stderr naming the command and exit status 2. A
truncated trace (see histparse: END line, end marker, a histogram or line
cut off) is refused the same way, since the job would silently lack what
was cut; ``--allow-truncated`` distils what is there, with a warning line
and the cuts in the job's comments. Every value written into the job is
checked against fio's syntax and a plausible range, and comments carry no
control characters: nothing from the trace or the command line can add a
line (an option such as exec_prerun) to the job.

Standard library only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .histparse import Hist, Stats, Trace, TraceParseError, parse_trace, read_trace

__all__ = [
    "DistillError",
    "Distilled",
    "distill",
    "lost_completions",
    "main",
    "parse_fio_size",
    "render_job",
    "validate_job",
]

SEQ_THRESHOLD = 0.8  # this share of sequential requests makes a direction sequential
MIN_SPLIT_PCT = 1  # bssplit entries rounding below this are dropped (and said so)
IDLE_MIN_SHARE = 0.05  # thinktime only when idle gaps cover this share of the window
# The sampled depth's mean may exceed Little's law by this factor (plus one
# request) before it is taken to carry requests whose completion was never
# seen (fio's steady queues read 0.8-1.1x here, 2.2x on a loaded VM).
SAMPLED_MEAN_SLACK = 1.5
# Issued requests whose completion was never seen: over this share the job
# says so, over LOST_REFUSE_SHARE the trace is refused (--allow-lossy).
LOST_WARN_SHARE = 0.02
LOST_REFUSE_SHARE = 0.5
# Bounds of a real capture; a trace beyond them is not one (or was edited),
# and its numbers must not reach the job.
MAX_WINDOW_S = 366 * 86400  # a capture (and a replay) of at most a year
MAX_REQUEST_BYTES = 1 << 32  # a block request's length is a 32-bit field
MAX_IODEPTH = 65536  # far above any device queue (nr_requests)
MAX_JOB_NAME = 64


class DistillError(Exception):
    """The trace cannot give a job (empty, truncated, implausible numbers, ...)."""


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


def _num(tr: Trace, name: str, key: str = "") -> int:
    """A count from the trace; a negative one is not bpftrace's (counts only grow)."""
    v = tr.number(name, key)
    if not 0 <= v < 1 << 64:
        raise DistillError(
            f"@{name}{f'[{key}]' if key else ''} is {v}: not a count (bpftrace counts are 64-bit, never negative)"
        )
    return v


def _stats(tr: Trace, name: str, key: str = "") -> Stats | None:
    v = tr.get(name, key)
    if not isinstance(v, Stats):
        return None
    if min(v.count, v.average, v.total) < 0:
        raise DistillError(f"@{name} is {v.count}/{v.average}/{v.total}: durations cannot be negative")
    return v


def _op_num(tr: Trace, base: str, op: str) -> int:
    return _num(tr, f"{base}_{op}") or _num(tr, base, op)


_FIO_SIZE_RE = re.compile(r"(?P<n>\d+(?:\.\d+)?)(?P<unit>[kmgtp]?)(?:i?b)?|(?P<pct>\d+(?:\.\d+)?)%", re.IGNORECASE)


def parse_fio_size(text: str) -> str:
    """A value for fio's size=: a number with an optional k/m/g/t/p suffix
    (powers of 1024, as fio reads them) or a percentage of the target.
    ValueError otherwise: fio --parse-only itself takes "-1", "1x" and
    "1g 2", and a newline would add any option to the job."""
    m = _FIO_SIZE_RE.fullmatch(text)
    if not m:
        raise ValueError(
            f"{text!r} is not a fio size: a number with an optional k/m/g/t/p suffix (64m, 1.5g) or a percentage (50%)"
        )
    if m.group("pct") is not None:
        if not 0 < float(m.group("pct")) <= 100:
            raise ValueError(f"{text!r}: a percentage of the target must be over 0 and at most 100")
        return text
    unit = m.group("unit").lower()
    nbytes = float(m.group("n")) * (1024 ** ("kmgtp".index(unit) + 1) if unit else 1)
    if not 1 <= nbytes < 2**63:
        raise ValueError(f"{text!r}: a size must be at least 1 byte and under 8 EiB")
    return text


_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]")


def one_line(text: str) -> str:
    """Control characters shown escaped: a comment or message stays one line."""
    return _CONTROL_RE.sub(lambda m: repr(m.group())[1:-1], str(text))


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
            if isinstance(v, int) and v < 0:
                raise DistillError(f"@io_{op}_bytes[{k}] is {v}: a count cannot be negative")
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
    too_big = [s for s in weights if s > MAX_REQUEST_BYTES]
    if too_big:
        raise DistillError(
            f"{op} request size {max(too_big)} bytes in {source.split()[0]}: over 4 GiB, "
            "more than a block request can hold"
        )
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


def distill(
    tr: Trace,
    *,
    process: str | None = None,
    window_s: float | None = None,
    runtime_s: int | None = None,
    size: str | None = None,
    allow_truncated: bool = False,
    allow_lossy: bool = False,
) -> Distilled:
    """The job for a parsed trace. DistillError when the trace is truncated
    (unless allow_truncated), holds no block I/O or numbers no capture has."""
    notes: list[str] = []
    if tr.truncated and not allow_truncated:
        raise DistillError(
            "the trace is truncated (" + "; ".join(tr.cuts[:3] or ["no END"]) + "): its job would "
            "silently lack what was cut; --allow-truncated distils what is there"
        )
    if window_s is not None:
        if not 0 < window_s <= MAX_WINDOW_S:  # NaN fails this too
            raise DistillError(f"--window-s must be over 0 and at most {MAX_WINDOW_S} (a year), not {window_s}")
        window = float(window_s)
        notes.append(f"capture window {window:.3f} s given by --window-s")
    elif tr.window_ns is None:
        raise DistillError("the trace has no capture window (cut before END); give --window-s")
    elif not 0 < tr.window_ns <= MAX_WINDOW_S * 1e9:
        raise DistillError(
            f"capture_window_ns is {tr.window_ns}: not a capture's length (over 0 and at most a year); give --window-s"
        )
    else:
        window = tr.window_ns / 1e9
    if runtime_s is not None and not 0 < runtime_s <= MAX_WINDOW_S:
        raise DistillError(f"--runtime-s must be over 0 and at most {MAX_WINDOW_S} (a year), not {runtime_s}")
    if size is not None:
        try:
            size = parse_fio_size(size)
        except ValueError as exc:
            raise DistillError(f"--size: {exc}") from None
    missed = tr.meta.get("missed_events", "")
    if missed.isdigit() and int(missed) > 0:
        notes.append(
            f"the kernel skipped {missed} probe runs (BPF recursion guard): "
            "counts are a sample and the sampled depth may drift; mix and sizes are still fair"
        )
    if tr.truncated:
        notes.append("TRUNCATED trace (--allow-truncated), what was cut is missing: " + "; ".join(tr.cuts[:3]))

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
        raise DistillError(
            "no block-layer I/O in the trace: nothing to distil "
            "(wrong process or device filter, or a page-cache-only workload?)"
        )
    figures: dict = {"window_s": round(window, 3), "reads": reads, "writes": writes}
    for key in ("requeue_reqs", "merged_reqs", "unmatched_reqs", "dup_issue_reqs", "lost_reqs", "other_reqs"):
        if _num(tr, key):
            figures[key] = _num(tr, key)
    issued = _op_num(tr, "issued", "read") + _op_num(tr, "issued", "write")
    figures["issued"] = issued
    _check_loss(tr, issued, reads + writes, figures, notes, allow_lossy)

    split_r, nr = size_split(tr, "read") if reads else ([], [])
    split_w, nw = size_split(tr, "write") if writes else ([], [])
    notes += nr + nw
    if reads and not split_r:
        split_r = [(4096, 100)]
        notes.append("read sizes missing from trace: 4k assumed")
    if writes and not split_w:
        split_w = [(4096, 100)]
        notes.append("write sizes missing from trace: 4k assumed")
    if _num(tr, "other_reqs"):
        notes.append(f"{_num(tr, 'other_reqs')} discard/other requests dropped (fio job has reads and writes only)")

    # queue depth: sampled at dispatch, and Little's law as a cross-check
    qd = None
    for op in ("read", "write"):
        h = tr.hist(f"qdepth_{op}") or tr.hist("qdepth", op)
        if h:
            qd = h if qd is None else qd.merged(h)
    # Little's law: the rate requests were dispatched times their mean
    # outstanding time (insert to completion when traced, else device time).
    # Means over the requests whose completion was seen, rates from issues:
    # a completion the probe never saw (see LOST_WARN_SHARE) then lowers
    # neither, where a sum of outstanding times would lose its share.
    busy_n = 0
    busy_us = 0
    for op in ("read", "write"):
        st = (
            _stats(tr, f"q2c_stats_{op}_usecs")
            or _stats(tr, f"d2c_stats_{op}_usecs")
            or _stats(tr, "d2c_stats_usecs", op)
        )
        if st is not None:
            busy_n += st.count
            busy_us += st.total
    # the span with I/O in it (first outstanding request to last completion)
    # when the trace has it, so idle time before and after does not dilute it
    span = tr.active_span_ns / 1e9 if tr.active_span_ns and 0 < tr.active_span_ns and window_s is None else window
    rate_n = max(issued, busy_n)
    little = rate_n * (busy_us / busy_n) / (span * 1e6) if busy_n and span > 0 else math.nan
    if busy_us:
        figures["iodepth_little"] = round(little, 2)
        figures["little_span_s"] = round(span, 3)
    if qd is not None and qd.total:
        qmean = qd.mean()
        edge = plateau_edge(qd)
        figures["iodepth_sampled_mean"] = round(qmean, 2)
        figures["iodepth_sampled_p50"] = qd.quantile(0.5)
        figures["iodepth_sampled_p95"] = qd.quantile(0.95)
        figures["iodepth_sampled_edge"] = edge
        iodepth = max(1, edge)
        if busy_us and (edge < 0.6 * little or qmean > SAMPLED_MEAN_SLACK * little + 1):
            # Little's law (means over the completions seen) is not moved by
            # a completion the probe missed, the sampled depth is until the
            # tracer drops the request as lost; a fill level is at least the
            # mean. Either way the samples are not the process's queue.
            iodepth = max(1, math.ceil(little - 0.05))
            why = "under" if edge < 0.6 * little else "above"
            notes.append(
                f"sampled depth (edge {edge}, mean {qmean:.1f}) is {why} Little's law ({little:.1f}): "
                "iodepth from Little's law, rounded up"
            )
    elif busy_us:
        iodepth = max(1, math.ceil(little - 0.05))
        notes.append("no sampled queue depth in trace: iodepth from Little's law, rounded up")
    else:
        iodepth = 1
        notes.append("no queue depth or outstanding times in trace: iodepth=1 assumed")

    # sequential or random, per direction
    seq_share: dict[str, float | None] = {}
    for op, n in (("read", reads), ("write", writes)):
        s = _num(tr, f"seq_{op}_reqs") or _num(tr, "seq_reqs", op)
        r = _num(tr, f"rand_{op}_reqs") or _num(tr, "rand_reqs", op)
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
    idle = _stats(tr, "idle_stats_usecs")
    if idle is not None and idle.count:
        share = idle.total / (window * 1e6)
        figures["idle_share"] = round(share, 3)
        if share >= IDLE_MIN_SHARE:
            thinktime_us = max(1, idle.average)
            thinktime_blocks = max(1, int(round((reads + writes) / idle.count)))
        else:
            notes.append(f"idle gaps cover {100 * share:.1f}% of the window: no thinktime")

    uring = sum(v for v in tr.maps.get("uring_sqes", {}).values() if isinstance(v, int) and v > 0)
    ioengine = "io_uring" if uring else "libaio"
    if uring:
        figures["io_uring_sqes"] = uring

    if size is None:
        size = _footprint(tr)
        if size is None:
            size = "1g"
            notes.append("no LBA regions in trace: size=1g assumed (--size sets it)")
    name = re.sub(r"[^A-Za-z0-9]+", "-", (process or "traced")).strip("-")[:MAX_JOB_NAME].strip("-") or "traced"
    d = Distilled(
        job_name=f"{name}-distilled",
        rw=rw,
        rwmixread=rwmix,
        bssplit_read=split_r,
        bssplit_write=split_w,
        iodepth=iodepth,
        ioengine=ioengine,
        runtime_s=runtime_s or max(1, int(math.ceil(window))),
        size=size,
        percentage_random=percentage_random,
        thinktime_us=thinktime_us,
        thinktime_blocks=thinktime_blocks,
        notes=notes,
        figures=figures,
    )
    _check_plausible(d, window)
    return d


def lost_completions(tr: Trace) -> tuple[int, int]:
    """(issued block requests whose completion the trace lacks, issued):
    completions counted against issues, less those seen without their issue
    (@unmatched_reqs: issued before the capture). A whole capture ends with
    at most a queue's worth still in flight."""
    issued = _op_num(tr, "issued", "read") + _op_num(tr, "issued", "write")
    completed = _op_num(tr, "completed", "read") + _op_num(tr, "completed", "write")
    if not completed:  # no completion probe in the trace: nothing to tell
        return 0, issued
    return max(0, issued - completed - max(0, _num(tr, "unmatched_reqs"))), issued


def _check_loss(tr: Trace, issued: int, completed: int, figures: dict, notes: list[str], allow: bool) -> None:
    """Events the probes never saw. Completions: issued requests whose
    completion was not seen (a whole capture ends with at most a queue's
    worth in flight). Probe runs the kernel skipped (missed_events, with
    syscall probes on): against the block requests seen. Counts are then a
    sample: the mix, sizes and Little's law (rates from issues, means over
    seen completions) stay fair, the sampled depth does not. Past
    LOST_REFUSE_SHARE the sample is mostly holes: refused unless allow."""
    lost = lost_completions(tr)[0]
    lost_share = lost / issued if issued else 0.0
    missed = tr.meta.get("missed_events", "")
    missed_n = int(missed) if missed.isdigit() else 0
    # a request passes 3 block probes at least (insert or issue, issue, completion)
    missed_share = missed_n / (missed_n + 3 * (issued + completed)) if missed_n else 0.0
    if lost:
        figures["lost_completions"] = lost
    if missed_n:
        figures["missed_share"] = round(missed_share, 3)
    worst = max(lost_share, missed_share)
    if worst > LOST_REFUSE_SHARE and not allow:
        raise DistillError(
            f"{100 * lost_share:.0f}% of issued requests have no completion in the trace and the kernel skipped "
            f"{missed_n} probe runs ({100 * missed_share:.0f}% of block events): more holes than sample; "
            "capture with --no-syscalls, or --allow-lossy distils what is there"
        )
    if worst > LOST_WARN_SHARE:
        notes.append(
            f"{lost} of {issued} issued requests ({100 * lost_share:.1f}%) have no completion in the trace"
            + (f", {missed_n} probe runs skipped" if missed_n else "")
            + ": counts are a sample; the sampled depth is not used unless Little's law agrees"
        )


def _check_plausible(d: Distilled, window_s: float) -> None:
    """Numbers a real capture cannot give (a trace with huge or edited
    values) are refused here rather than written into a job that fio
    --parse-only would take: it checks syntax, not sense."""
    bounds = [
        ("iodepth", d.iodepth, 1, MAX_IODEPTH, "deeper than any device queue"),
        ("runtime", d.runtime_s, 1, MAX_WINDOW_S, "longer than a year"),
    ]
    if d.thinktime_us is not None:
        bounds.append(
            ("thinktime", d.thinktime_us, 1, max(1, int(window_s * 1e6)), "an idle gap longer than the capture window")
        )
        bounds.append(("thinktime_blocks", d.thinktime_blocks, 1, (1 << 31) - 1, "more than fio can count"))
    for key, value, lo, hi, why in bounds:
        if not lo <= value <= hi:
            raise DistillError(f"the trace gives {key}={value}: {why}; not a real capture")


def _footprint(tr: Trace) -> str | None:
    """The span of LBA regions touched, in whole GiB (at least 1 GiB); None
    when the trace has no regions to tell."""
    m = re.search(r"region (\d+) GiB", " ".join(tr.lines))
    width = int(m.group(1)) if m else 0
    regions = 0
    for op in ("read", "write"):
        h = tr.hist(f"lba_region_{op}_gib")
        if h:
            regions = max(regions, sum(1 for b in h.buckets if b.count))
    if not (width and regions):
        return None
    return f"{max(1, regions * width)}g"


# What a job line may be: a comment, a section, an option with or without a
# value. Values hold no space, "=", ";", "#" or control character, so no
# field (from the trace or the command line) can add an option or a section.
_JOB_LINE_RE = re.compile(r"\[[A-Za-z0-9-]+\]|[a-z_]+(?:=[A-Za-z0-9_.,:/%${}+-]+)?|")


def render_job(d: Distilled, *, source: str, tr: Trace) -> str:
    """The job text. Every line passes one gate: comments have their control
    characters escaped, other lines must match _JOB_LINE_RE (DistillError)."""
    out: list[str] = []

    def c(line: str) -> None:
        if line.startswith(";"):
            out.append(one_line(line))
        elif _JOB_LINE_RE.fullmatch(line):
            out.append(line)
        else:
            raise DistillError(f"refusing to write the job line {one_line(line)!r}: not a plain fio option")

    c(f"; {d.job_name}: fio job distilled from a storage_latency_stack trace.")
    c(f"; Source trace: {source}")
    c(
        f"; Capture window: {d.figures['window_s']} s; block requests completed: "
        f"{d.figures['reads']} reads, {d.figures['writes']} writes (issued {d.figures['issued']})."
    )
    if tr.meta:
        for k in ("layers_on", "layers_off", "filter", "filter_pid", "filter_comm", "dev", "missed_events"):
            if k in tr.meta:
                c(f"; {k}: {tr.meta[k]}")
    fig = d.figures
    depth = [
        f"sampled edge {fig['iodepth_sampled_edge']}" if "iodepth_sampled_edge" in fig else None,
        f"median {fig['iodepth_sampled_p50']:g}" if "iodepth_sampled_p50" in fig else None,
        f"mean {fig['iodepth_sampled_mean']}" if "iodepth_sampled_mean" in fig else None,
        f"Little's law {fig['iodepth_little']} over {fig['little_span_s']} s of I/O"
        if "iodepth_little" in fig
        else None,
    ]
    c("; Queue depth: " + (", ".join(x for x in depth if x) or "not in trace"))
    for k in ("requeue_reqs", "merged_reqs", "unmatched_reqs", "dup_issue_reqs", "lost_reqs", "lost_completions"):
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


def _seconds(kind):
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a {'whole ' if kind is int else ''}number of seconds"
            ) from None
        if not 0 < v <= MAX_WINDOW_S:  # NaN and inf fail this too
            raise argparse.ArgumentTypeError(f"{text!r}: seconds over 0 and at most {MAX_WINDOW_S} (a year)")
        return v

    return parse


def _fio_size_arg(text: str) -> str:
    try:
        return parse_fio_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class _ArgError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, no usage dump
        raise _ArgError(message)


def _parser(prog: str) -> argparse.ArgumentParser:
    p = _Parser(
        prog=prog,
        description="Turn a storage_latency_stack trace (bpftrace text or JSON) into a fio job.",
        epilog="bad input: a user's mistake (bad flag or value, a file that is not a trace, an output\n"
        "that cannot be written) is one line on stderr and exit status 2, nothing written;\n"
        "so is a truncated trace (END line, end marker, a histogram or a line cut off),\n"
        "unless --allow-truncated. Every value in the job is checked (fio syntax, range).\n"
        "Outputs are written only once the job is made. As `kvtier distill`, SIGINT/SIGTERM\n"
        "answer one line and exit 130/143.\n\n"
        "examples:\n"
        "  %(prog)s -i out/trace.txt -o job.fio\n"
        "  %(prog)s -i trace.json --process vllm -o vllm.fio\n"
        "  TARGET=/mnt/nvme/fio.dat fio job.fio",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-i", "--input", required=True, help="trace file (text or -f json output)")
    p.add_argument("-o", "--output", help="fio job to write (default: stdout)")
    p.add_argument("--process", help="name for the fio job section (the trace is already filtered at capture)")
    p.add_argument("--window-s", type=_seconds(float), help="capture window in seconds, for traces cut before END")
    p.add_argument("--runtime-s", type=_seconds(int), help="fio runtime (default: the capture window)")
    p.add_argument(
        "--size", type=_fio_size_arg, help="fio size=: 64m, 1.5g, 50%% (default: the traced LBA footprint, at least 1g)"
    )
    p.add_argument(
        "--allow-truncated",
        action="store_true",
        help="distil a truncated trace (cut before its end) from what it has, with a warning",
    )
    p.add_argument(
        "--allow-lossy",
        action="store_true",
        help="distil a trace that lost over half its block events (see missed_events), with a note",
    )
    p.add_argument("--dump-json", metavar="FILE", help="also write the parsed histograms as JSON")
    p.add_argument("--no-validate", action="store_true", help="skip fio --parse-only")
    return p


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _same_path(a: str, b: str) -> bool:
    """One file, existing or not: through a symlink, `./`, `..` or a hard link."""
    return _same_file(a, b) or os.path.realpath(a) == os.path.realpath(b)


def _check_writable(path: str) -> None:
    """Before any work, so one bad output path does not leave the other written."""
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise DistillError(f"cannot write {path}: Is a directory")
    if not os.path.isdir(parent):
        raise DistillError(f"cannot write {path}: No such directory {parent}")
    if not os.access(path if os.path.exists(path) else parent, os.W_OK):
        raise DistillError(f"cannot write {path}: Permission denied")


@contextlib.contextmanager
def whole_file(path: str | os.PathLike, suffix: str = ".tmp") -> Iterator[str]:
    """Yield a temp path beside `path`; once the caller has written it, one rename makes it `path` (mode from the
    umask, as a plain open would give), so a job or plot being read, or a run cut short, never leaves half a file. On
    failure the temp file is removed and the user's previous file stays as it was. tracing/ imports nothing from the
    rest of kvtier (it runs under sudo from a bare checkout), hence its own copy of this small helper."""
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=".kvtier-", suffix=suffix, dir=os.path.dirname(os.path.abspath(path)))
        os.close(fd)
        yield tmp
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except OSError as exc:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise DistillError(f"cannot write {path}: {exc.strerror or exc}") from exc
    except BaseException:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise


def write_whole(path: str | os.PathLike, text: str) -> None:
    """`text` into `path`, whole or not at all (see whole_file)."""
    with whole_file(path) as tmp, open(tmp, "w") as f:
        f.write(text)


def main(argv: list[str] | None = None, prog: str = "kvtier distill") -> int:
    """``kvtier distill`` (replay/cli.py calls main(rest)); ``python -m
    tracing.distill`` passes the command line it was started with as prog."""
    parser = _parser(prog)
    try:
        args = parser.parse_args(argv)
    except _ArgError as exc:
        print(one_line(f"{prog}: {exc} (see '{prog} --help')"), file=sys.stderr)
        return 2
    try:
        path = args.input
        for out in (args.output, args.dump_json):
            if out and _same_file(out, path):
                raise DistillError(f"{out} is the input trace: refusing to overwrite it")
        if args.output and args.dump_json and _same_path(args.output, args.dump_json):
            raise DistillError("-o and --dump-json name the same file")
        for out in (args.output, args.dump_json):
            if out:
                _check_writable(out)
        try:
            tr = parse_trace(read_trace(path))
        except OSError as exc:
            raise DistillError(f"cannot read {path}: {exc.strerror or exc}") from exc
        except TraceParseError as exc:
            raise DistillError(f"{path}: {exc}") from exc
        cuts = "; ".join(tr.cuts[:3])
        if tr.truncated and not args.allow_truncated:
            raise DistillError(
                f"{path} is truncated ({cuts}): its job would silently lack what was cut; "
                "--allow-truncated distils what is there"
            )
        # said once the job is made, so a failure after it stays one line
        warn = f"{prog}: warning: {path} is truncated ({cuts}): distilled what is there" if tr.truncated else ""
        job = None
        if args.output or not args.dump_json:
            try:
                d = distill(
                    tr,
                    process=args.process,
                    window_s=args.window_s,
                    runtime_s=args.runtime_s,
                    size=args.size,
                    allow_truncated=args.allow_truncated,
                    allow_lossy=args.allow_lossy,
                )
            except DistillError as exc:
                raise DistillError(f"{path}: {exc}") from exc
            job = render_job(d, source=str(path), tr=tr)
            if not args.no_validate:
                err = validate_job(job)
                if err:
                    raise DistillError(f"fio rejects the generated job: {err}")
        # written only once everything is made: a refused trace leaves no file
        if args.dump_json:
            write_whole(args.dump_json, json.dumps(tr.to_json(), indent=1) + "\n")
        if job is not None:
            if args.output:
                write_whole(args.output, job)
            else:
                sys.stdout.write(job)
        if warn:
            print(one_line(warn), file=sys.stderr)
    except DistillError as exc:
        print(one_line(f"{prog}: {exc}"), file=sys.stderr)
        return 2
    return 0


def _module_prog() -> str:
    """What the user typed to start this module: "python3 -m tracing.distill"."""
    exe = os.path.basename(getattr(sys, "orig_argv", [sys.executable])[0] or "python")
    return f"{exe} -m tracing.distill"


if __name__ == "__main__":
    sys.exit(main(prog=_module_prog()))
