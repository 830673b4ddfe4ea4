"""End to end: page-cache I/O on the real stack, `storage_latency_stack.sh vllm` with the syscall layer on, against
vLLM on CPU + the LMCache MP server with LMCache's own fs L2 adapter in buffered mode (`run-stack.sh --l2 lmcache-fs
--io-mode buffered`).

That adapter writes and reads its chunk files through the page cache, so the KV server's loads are read() calls the
syscall layer sees while the block layer sees (almost) nothing: the capture must say so, in the report's health lines
and at the end of the capture, rather than pass off an empty block trace as the stack's storage I/O.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from kvtier_stack import (
    TRACE_STACK_MARKS,
    clear_l1,
    complete,
    down,
    need_lmcache,
    pid_of,
    prompt_text,
    start_tracer,
    stop_tracer,
    up,
    vllm_external_hits,
    wait_attached,
    wait_for,
)

from tracing.histparse import parse_trace
from tracing.report import health_lines, process_rows, read_matched

ROOT = Path(__file__).resolve().parents[2]

pytestmark = TRACE_STACK_MARKS


@pytest.fixture(scope="module")
def fs_stack(tiny_model_dir, tmp_path_factory):
    need_lmcache()
    base = tmp_path_factory.mktemp("trace-pagecache")
    kv = Path(os.environ.get("KVTIER_TRACE_TMP", "/var/tmp")) / f"kvtier-trace-pagecache-{os.getpid()}"
    kv.mkdir(parents=True, exist_ok=True)
    state = base / "state"
    try:
        s = up(state, tiny_model_dir, kv, "--l2", "lmcache-fs", "--io-mode", "buffered", timeout_s=600)
        yield s, base, kv, tiny_model_dir
    finally:
        down(state)
        shutil.rmtree(kv, ignore_errors=True)


def _stored_bytes(kv: Path) -> int:
    return sum(p.stat().st_size for p in kv.rglob("*") if p.is_file())


def test_buffered_l2_loads_are_said_to_come_from_the_page_cache(fs_stack):
    s, base, kv, model = fs_stack
    out = base / "trace"
    prompts = [prompt_text(model, 1300, src) for src in ("argparse.py", "typing.py", "inspect.py", "pathlib.py")]
    server = pid_of(s.state_dir, "lmcache0")
    tracer = start_tracer(out, "--dev", str(kv))  # the syscall layer on (the default): it sees the read() calls
    try:
        wait_attached(tracer, out)
        for p in prompts:
            complete(s.vllm, p, max_tokens=4)
        # LMCache's fs adapter writes its files in the background: wait until every prompt's chunks are there
        assert wait_for(lambda: len([p for p in kv.rglob("*") if p.is_file()]) >= 5 * len(prompts), 60), s.log(
            "lmcache0"
        )
        stored = _stored_bytes(kv)
        hits0 = vllm_external_hits(s.vllm)
        for _ in range(2):
            clear_l1(s)  # the next requests load every chunk from the L2 files, which the page cache still holds
            for p in prompts:
                complete(s.vllm, p, max_tokens=4)
        assert wait_for(lambda: vllm_external_hits(s.vllm) > hits0, 30), "no prefix hit came from LMCache"
    finally:
        err = stop_tracer(tracer)
    assert tracer.returncode == 0, err
    assert "Traceback" not in err, err

    tr = parse_trace((out / "trace.txt").read_text())
    matched = read_matched(out / "matched.tsv")
    rows = {r["pid"]: r for r in process_rows(tr, matched)}
    sys_read = tr.number("file_read_bytes")
    blk_read = rows.get(server, {}).get("read_bytes", 0)
    figures = (
        f"stored {stored} B in {kv}; syscalls read {sys_read} B from files; block reads of the KV server {blk_read} B"
    )
    print(figures)
    assert stored > 0, figures
    # the two rounds of loads read the stored files (at least once over) through read(), the block layer not
    assert sys_read >= stored, figures
    assert blk_read <= 0.2 * stored, figures
    # ... and the capture says so: in the report and at the end of the capture, one line
    lines = [line for line in health_lines(tr) if "served from the page cache" in line]
    assert len(lines) == 1, (health_lines(tr), figures)
    assert "served from the page cache" in err, err
