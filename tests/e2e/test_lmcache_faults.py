"""Faults against the real stack (vLLM + LMCache MP + kvtier), with the disk tier on a small tmpfs:
1. kill -9 the LMCache server during a burst of stores, restart: every entry left on disk verifies (header and
   payload checksum), prompts stored before the crash are served from kvtier with the uncached output, nothing
   corrupt is ever served;
2. the filesystem under the disk tier fills up: stores are refused and counted, vLLM keeps answering, nothing dies.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from pathlib import Path

import pytest
from kvtier_stack import (
    alive,
    clear_l1,
    complete,
    down,
    group_pids,
    kvtier_event,
    need_lmcache,
    prompt_text,
    up,
    vllm_external_hits,
    wait_for,
)

from kvconnector.timed_io import IOMode, read_entry, read_header

pytestmark = [pytest.mark.e2e, pytest.mark.root, pytest.mark.timeout(900)]

SOURCES = [
    "argparse.py",
    "typing.py",
    "inspect.py",
    "pathlib.py",
    "subprocess.py",
    "threading.py",
    "logging/__init__.py",
    "tarfile.py",
    "zipfile.py",
    "datetime.py",
    "shutil.py",
    "tempfile.py",
    "configparser.py",
    "ftplib.py",
]


@pytest.fixture(scope="module")
def tmpfs_kv(tmp_path_factory):  # the module is marked root: it mounts a small tmpfs
    need_lmcache()
    mnt = tmp_path_factory.mktemp("kvfs")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def verify_all(directory: Path) -> int:
    n = 0
    for f in directory.glob("*.kv"):
        hdr = read_header(str(f))
        read_entry(str(f), hdr.key, hdr.payload_nbytes, IOMode.BUFFERED)  # raises on any corruption
        n += 1
    return n


def test_kill9_during_stores_then_full_disk(tiny_model_dir, tmp_path_factory, tmpfs_kv):
    state = tmp_path_factory.mktemp("faults-state")
    prompts = [prompt_text(tiny_model_dir, 1300, src) for src in SOURCES]
    stored, burst, fill = prompts[:2], prompts[2:6], prompts[6:]
    stack = up(state, tiny_model_dir, tmpfs_kv, "--disk-gb", "1")  # the tier believes 1 GB; the fs has 4 MiB
    pids = set(group_pids(state))
    try:
        ref = [complete(stack.vllm, p)[0] for p in stored]
        assert wait_for(lambda: kvtier_event(stack, "store_ok") >= 10), stack.log("lmcache0")

        # A burst of new prompts (each stores 5 chunks); kill -9 the LMCache server while it stores.
        threads = [threading.Thread(target=lambda p=p: _quietly(complete, stack.vllm, p, timeout_s=20)) for p in burst]
        for t in threads:
            t.start()
        wait_for(lambda: kvtier_event(stack, "store_ok") > 10, timeout_s=10, interval_s=0.02)
        lmcache_pid = int(
            next(line.split()[1] for line in (state / "pids").read_text().splitlines() if line.startswith("lmcache0 "))
        )
        os.killpg(lmcache_pid, signal.SIGKILL)
        for t in threads:
            t.join(30)
        down(state)  # vLLM loses its LMCache server for good: restart the pair, on the same kv dir

        stack = up(state, tiny_model_dir, tmpfs_kv, "--disk-gb", "1")
        pids.update(group_pids(state))
        n_files = verify_all(tmpfs_kv)
        assert n_files >= 10 and kvtier_event(stack, "adopted", tier="disk") == n_files
        for p, r in zip(stored, ref):
            h0 = vllm_external_hits(stack.vllm)
            assert complete(stack.vllm, p)[0] == r
            assert vllm_external_hits(stack.vllm) - h0 >= 1280
        for p in burst:  # whatever of the burst survived is served, and only if it verifies
            complete(stack.vllm, p)
        assert kvtier_event(stack, "corrupt_dropped", tier="disk") == 0 and kvtier_event(stack, "load_errors") == 0

        # Fill the 4 MiB filesystem: stores are refused and counted; vLLM keeps answering (recompute or L1).
        for p in fill:
            text, _, _ = complete(stack.vllm, p)
            assert isinstance(text, str)
        assert wait_for(lambda: kvtier_event(stack, "store_refused_full") >= 1, timeout_s=20), stack.log("lmcache0")
        assert kvtier_event(stack, "enospc", tier="disk") >= 1
        clear_l1(stack)
        assert complete(stack.vllm, stored[0])[0] == ref[0]  # still correct after the disk filled up
        assert all(alive(p) for p in group_pids(state)), "a server died"
        assert verify_all(tmpfs_kv) >= n_files  # every entry still verifies
        assert not [f for f in os.listdir(tmpfs_kv) if ".tmp" in f]  # refused writes leave no temp file
    finally:
        down(state)
    assert not [p for p in pids if alive(p)]


def _quietly(fn, *a, **kw):
    try:
        fn(*a, **kw)
    except Exception:
        pass
