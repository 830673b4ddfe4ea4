"""The fio rendering: a job model (tracing/distiller.py's `Distilled`) as the text of a .fio file, and fio's
own check of it.

The file follows fio's examples/*.fio: a comment block saying where the job
comes from (the trace, its window, its counters, what was kept and dropped),
``[global]`` then the job's section, one ``key=value`` per line with a
comment above each non-obvious key, the target from ``${TARGET}``. Every
line passes one gate: comments have their control characters escaped, every
other line must be a plain fio option (_JOB_LINE_RE), so nothing from the
trace or the command line can add a line (an option such as exec_prerun) to
the job. `validate_job` runs ``fio --parse-only`` on the text.

Standard library only.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile

from .distiller import Distilled, DistillError
from .histparse import Trace

__all__ = ["fio_size", "one_line", "render_job", "validate_job"]

_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]")


def one_line(text: str) -> str:
    """Control characters shown escaped: a comment or message stays one line."""
    return _CONTROL_RE.sub(lambda m: repr(m.group())[1:-1], str(text))


def fio_size(nbytes: int) -> str:
    for suffix, mult in (("m", 1 << 20), ("k", 1 << 10)):
        if nbytes >= mult and nbytes % mult == 0:
            return f"{nbytes // mult}{suffix}"
    return str(nbytes)


def _pct_split(split: list[tuple[int, int]]) -> str:
    return ":".join(f"{fio_size(s)}/{p}" for s, p in split)


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
