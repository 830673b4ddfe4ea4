"""The distiller proper: a parsed storage_latency_stack trace to a fio job model (`Distilled`).

tracing/fio_job.py writes the model as a .fio file, tracing/distill.py is the command (`kvtier distill`).
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

`distill` runs one named step per item above, in that order, each adding
its notes (what was kept, dropped or assumed) and figures (what the job's
comments quote). A truncated trace is refused unless allow_truncated, a
trace with more holes than sample unless allow_lossy, and numbers no real
capture has (a year-long window, a 4 GiB request, a depth past any device
queue) always: DistillError, one line.

Standard library only.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from .histparse import Hist, Stats, Trace

__all__ = [
    "LOST_WARN_SHARE",
    "MAX_WINDOW_S",
    "DistillError",
    "Distilled",
    "distill",
    "lost_completions",
    "parse_fio_size",
    "plateau_edge",
    "size_split",
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


# --- counts and histograms of the trace ----------------------------------------


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


# --- the distiller: one step per part of the job ---------------------------------


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
    window = _window(tr, window_s, notes)
    if runtime_s is not None and not 0 < runtime_s <= MAX_WINDOW_S:
        raise DistillError(f"--runtime-s must be over 0 and at most {MAX_WINDOW_S} (a year), not {runtime_s}")
    if size is not None:
        try:
            size = parse_fio_size(size)
        except ValueError as exc:
            raise DistillError(f"--size: {exc}") from None
    _capture_notes(tr, notes)
    reads, writes = _request_counts(tr, notes)
    figures = _counter_figures(tr, window, reads, writes)
    issued = figures["issued"]
    _check_loss(tr, issued, reads + writes, figures, notes, allow_lossy)
    split_r, split_w = _size_splits(tr, reads, writes, notes)
    span = _active_span(tr, window, window_s)
    iodepth = _iodepth(tr, issued, span, figures, notes)
    seq_share = _seq_shares(tr, reads, writes, figures, notes)
    rw, rwmix, percentage_random = _access_pattern(reads, writes, seq_share)
    thinktime_us, thinktime_blocks = _thinktime(tr, window, reads + writes, figures, notes)
    ioengine = _ioengine(tr, figures)
    d = Distilled(
        job_name=_job_name(process),
        rw=rw,
        rwmixread=rwmix,
        bssplit_read=split_r,
        bssplit_write=split_w,
        iodepth=iodepth,
        ioengine=ioengine,
        runtime_s=runtime_s or max(1, int(math.ceil(window))),
        size=size if size is not None else _job_size(tr, notes),
        percentage_random=percentage_random,
        thinktime_us=thinktime_us,
        thinktime_blocks=thinktime_blocks,
        notes=notes,
        figures=figures,
    )
    _check_plausible(d, window)
    return d


def _window(tr: Trace, window_s: float | None, notes: list[str]) -> float:
    """The capture window in seconds: --window-s, else the trace's own (refused when absent or implausible)."""
    if window_s is not None:
        if not 0 < window_s <= MAX_WINDOW_S:  # NaN fails this too
            raise DistillError(f"--window-s must be over 0 and at most {MAX_WINDOW_S} (a year), not {window_s}")
        window = float(window_s)
        notes.append(f"capture window {window:.3f} s given by --window-s")
        return window
    if tr.window_ns is None:
        raise DistillError("the trace has no capture window (cut before END); give --window-s")
    if not 0 < tr.window_ns <= MAX_WINDOW_S * 1e9:
        raise DistillError(
            f"capture_window_ns is {tr.window_ns}: not a capture's length (over 0 and at most a year); give --window-s"
        )
    return tr.window_ns / 1e9


def _capture_notes(tr: Trace, notes: list[str]) -> None:
    """What the capture itself lost: probe runs the kernel skipped, and the cuts of a truncated trace."""
    missed = tr.meta.get("missed_events", "")
    if missed.isdigit() and int(missed) > 0:
        notes.append(
            f"the kernel skipped {missed} probe runs (BPF recursion guard): "
            "counts are a sample and the sampled depth may drift; mix and sizes are still fair"
        )
    if tr.truncated:
        notes.append("TRUNCATED trace (--allow-truncated), what was cut is missing: " + "; ".join(tr.cuts[:3]))


def _request_counts(tr: Trace, notes: list[str]) -> tuple[int, int]:
    """(reads, writes): completed block requests, else issued ones, else the size histograms' totals."""
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
    return reads, writes


def _counter_figures(tr: Trace, window: float, reads: int, writes: int) -> dict:
    """The figures the job's comments open with: window, requests, the tracer's odd-request counters, issued."""
    figures: dict = {"window_s": round(window, 3), "reads": reads, "writes": writes}
    for key in ("requeue_reqs", "merged_reqs", "unmatched_reqs", "dup_issue_reqs", "lost_reqs", "other_reqs"):
        if _num(tr, key):
            figures[key] = _num(tr, key)
    figures["issued"] = _op_num(tr, "issued", "read") + _op_num(tr, "issued", "write")
    return figures


def _size_splits(tr: Trace, reads: int, writes: int, notes: list[str]) -> tuple[list, list]:
    """bssplit for reads and for writes (4k when the trace has no sizes for a direction it has requests in)."""
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
    return split_r, split_w


def _sampled_depth(tr: Trace) -> Hist | None:
    """The outstanding depth sampled at each dispatch, reads and writes together."""
    qd = None
    for op in ("read", "write"):
        h = tr.hist(f"qdepth_{op}") or tr.hist("qdepth", op)
        if h:
            qd = h if qd is None else qd.merged(h)
    return qd


def _outstanding(tr: Trace) -> tuple[int, int]:
    """(requests, their summed outstanding microseconds): insert to completion when traced, else device time."""
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
    return busy_n, busy_us


def _active_span(tr: Trace, window: float, window_s: float | None) -> float:
    """The span with I/O in it (first outstanding request to last completion) when the trace has it, so idle time
    before and after does not dilute Little's law; the window otherwise (and when --window-s overrides it)."""
    return tr.active_span_ns / 1e9 if tr.active_span_ns and 0 < tr.active_span_ns and window_s is None else window


def _iodepth(tr: Trace, issued: int, span: float, figures: dict, notes: list[str]) -> int:
    """The queue depth: sampled at dispatch (plateau_edge), with Little's law as a cross-check."""
    qd = _sampled_depth(tr)
    # Little's law: the rate requests were dispatched times their mean
    # outstanding time (insert to completion when traced, else device time).
    # Means over the requests whose completion was seen, rates from issues:
    # a completion the probe never saw (see LOST_WARN_SHARE) then lowers
    # neither, where a sum of outstanding times would lose its share.
    busy_n, busy_us = _outstanding(tr)
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
        return iodepth
    if busy_us:
        notes.append("no sampled queue depth in trace: iodepth from Little's law, rounded up")
        return max(1, math.ceil(little - 0.05))
    notes.append("no queue depth or outstanding times in trace: iodepth=1 assumed")
    return 1


def _seq_shares(tr: Trace, reads: int, writes: int, figures: dict, notes: list[str]) -> dict[str, float | None]:
    """Per direction, the share of requests that continued the previous one (None: not traced, or no requests)."""
    seq_share: dict[str, float | None] = {}
    for op, n in (("read", reads), ("write", writes)):
        s = _num(tr, f"seq_{op}_reqs") or _num(tr, "seq_reqs", op)
        r = _num(tr, f"rand_{op}_reqs") or _num(tr, "rand_reqs", op)
        seq_share[op] = s / (s + r) if (s + r) and n else None
        if n and seq_share[op] is not None:
            figures[f"seq_share_{op}"] = round(seq_share[op], 3)
    if all(seq_share[o] is None for o in ("read", "write")):
        notes.append("no sector pattern in trace: random access assumed")
    return seq_share


def _access_pattern(
    reads: int, writes: int, seq_share: dict[str, float | None]
) -> tuple[str, int | None, tuple[int, int] | None]:
    """(rw, rwmixread, percentage_random): the direction mix and how sequential each direction is."""

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
        return rw, rwmix, percentage_random
    op = "read" if reads else "write"
    if is_seq(op):
        return op, None, None
    if pct_random(op) < 90:
        percentage_random = (pct_random(op), pct_random(op))
    return "rand" + op, None, percentage_random


def _thinktime(
    tr: Trace, window: float, requests: int, figures: dict, notes: list[str]
) -> tuple[int | None, int | None]:
    """(thinktime_us, thinktime_blocks) from real idle gaps only, when they cover IDLE_MIN_SHARE of the window."""
    idle = _stats(tr, "idle_stats_usecs")
    if idle is None or not idle.count:
        return None, None
    share = idle.total / (window * 1e6)
    figures["idle_share"] = round(share, 3)
    if share < IDLE_MIN_SHARE:
        notes.append(f"idle gaps cover {100 * share:.1f}% of the window: no thinktime")
        return None, None
    return max(1, idle.average), max(1, int(round(requests / idle.count)))


def _ioengine(tr: Trace, figures: dict) -> str:
    """io_uring when the process submitted io_uring requests, else libaio."""
    uring = sum(v for v in tr.maps.get("uring_sqes", {}).values() if isinstance(v, int) and v > 0)
    if uring:
        figures["io_uring_sqes"] = uring
    return "io_uring" if uring else "libaio"


def _job_size(tr: Trace, notes: list[str]) -> str:
    """size= when --size is not given: the traced LBA footprint, else 1g."""
    size = _footprint(tr)
    if size is None:
        size = "1g"
        notes.append("no LBA regions in trace: size=1g assumed (--size sets it)")
    return size


def _job_name(process: str | None) -> str:
    """The job section's name: the process name in letters, digits and hyphens."""
    name = re.sub(r"[^A-Za-z0-9]+", "-", (process or "traced")).strip("-")[:MAX_JOB_NAME].strip("-") or "traced"
    return f"{name}-distilled"


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
