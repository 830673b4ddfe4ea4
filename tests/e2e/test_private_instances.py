"""End to end: deploy/run-stack.sh --instances 2 without --shared-dir (each instance its own kvtier disk tier) behind
the round-robin proxy: the private-tier baseline of the shared-vs-private comparison (benchmarks/shared_vs_private.py).

What could fail: `up` refusing N > 1 without a shared directory (it did: exit 2), the instances sharing a directory,
the proxy not alternating. The same prompt sent twice through the proxy lands on instance 0, then instance 1; with
private tiers instance 1 cannot hit what instance 0 stored, so it computes and stores its own copy in its own dir.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kvtier_stack import complete, down, kvtier_event, need_lmcache, prompt_text, up, vllm_external_hits, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

CHUNKS = 5  # 1300 tokens at LMCache's chunk size 256


def _entries(d):
    return [p for p in d.rglob("*") if p.is_file() and p.name != "kvtier-stats.json"]


def test_two_instances_with_private_disk_tiers_behind_the_proxy(tiny_model_dir, tmp_path_factory):
    need_lmcache()
    base = tmp_path_factory.mktemp("private-stack")
    state, kv = base / "state", base / "kv"
    s = up(state, tiny_model_dir, kv, "--instances", "2", "--disk-gb", "1", "--l1-gb", "0.5", timeout_s=420)
    try:
        assert s.endpoints["tiers"] == "private" and s.endpoints["shared_dir"] == ""
        a, b = s.inst(0), s.inst(1)
        assert a["kv_dir"] != b["kv_dir"]
        prompt = prompt_text(tiny_model_dir, 1300, "typing.py")
        hb = vllm_external_hits(b["vllm"])
        text0, _, h0 = complete(s.vllm, prompt)
        assert wait_for(lambda: kvtier_event(s, "store_ok", 0) >= CHUNKS), s.log("lmcache0")
        text1, _, h1 = complete(s.vllm, prompt)
        assert (h0.get("x-kvtier-backend"), h1.get("x-kvtier-backend")) == ("0", "1")
        assert text1 == text0
        # instance 1 found nothing of instance 0's: no external hit, it stored its own copy in its own directory
        assert vllm_external_hits(b["vllm"]) - hb == 0
        assert kvtier_event(s, "hits", 1) == 0
        assert wait_for(lambda: kvtier_event(s, "store_ok", 1) >= CHUNKS), s.log("lmcache1")
        ea, eb = _entries(Path(a["kv_dir"])), _entries(Path(b["kv_dir"]))
        assert len(ea) >= CHUNKS and len(eb) >= CHUNKS
        assert not any(str(p).startswith(b["kv_dir"]) for p in ea)
    finally:
        down(state)
