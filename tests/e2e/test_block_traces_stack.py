"""Every block-hash trace format replayed by `kvtier replay` on the real CPU stack (vLLM + LMCache + kvtier).

The prompts are checked as vLLM received them: its request log (`--enable-log-requests` at DEBUG level) holds the
token ids of each prompt after vLLM's own tokenizer, and two prompts whose trace ids agree on their first k blocks
share exactly k blocks of those tokens (after the completion template's few leading tokens) and differ right after.
vLLM's external prefix-cache hits (LMCache, whose memory holds the whole window) are then what `kvtier plan --trace`
predicts for an unbounded cache.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from kvtier_stack import down, metric, metrics, need_lmcache, up

from deploy import make_tiny_model
from replay.openai.cli import main
from replay.plan.trace import reuse_profile
from replay.sources.block_traces import load_block_trace

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

DATA = Path(__file__).resolve().parents[1] / "replay" / "data"
BLOCK = 32  # the trace block after rescaling = LMCache's chunk = vLLM's block (CPU attention: a multiple of 32)
MAX_LEN = 16384  # the longest sample prompt at 32-token blocks is 8,170 tokens
SAMPLES = {  # format: (file or directory, requests replayed, prompt seed: each format its own texts)
    "mooncake": (DATA / "mooncake" / "synthetic_trace_lines3801-3993.jsonl", 80, 1),
    "bailian": (DATA / "bailian" / "bailian_format_example.jsonl", None, 2),
    "weka": (DATA / "weka", None, 3),
    "azure": (DATA / "azure" / "AzureLLMInferenceTrace_conv_head300.csv", 40, 4),
}
LOGGED = re.compile(r"Request cmpl-\S+ details: prompt: .*, prompt_token_ids: \[([0-9, ]*)\]")  # not /tokenize's


@pytest.fixture(scope="module")
def stack(tiny_model_dir, tmp_path_factory):
    need_lmcache()
    tmp = tmp_path_factory.mktemp("block-traces")
    # the tiny model's shape with a longer context (its RoPE positions), built once beside the tiny model
    model = str(Path(tiny_model_dir).parent / "kvtier-tiny-model-16k")
    make_tiny_model.ensure(model, max_len=MAX_LEN)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_LOGGING_LEVEL", "DEBUG")  # the request log's token ids are logged at DEBUG
        s = up(
            tmp / "state", model, tmp / "kv", "--chunk-size", str(BLOCK), "--block-size", str(BLOCK),
            "--max-model-len", str(MAX_LEN), "--disk-gb", "1", "--vllm-arg", "--enable-log-requests",
            "--vllm-arg", "--max-log-len", "--vllm-arg", "1000000",
        )  # fmt: skip
    try:
        yield s
    finally:
        down(tmp / "state")


def _shared(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


@pytest.mark.parametrize("fmt", list(SAMPLES))
def test_the_server_receives_the_trace_s_prefixes_and_hits_what_the_plan_says(stack, tmp_path, fmt):
    path, n, seed = SAMPLES[fmt]
    trace = load_block_trace(path, fmt, block_tokens=BLOCK, max_requests=n)
    log = stack.state_dir / "vllm0.log"
    offset = log.stat().st_size
    before = metrics(stack.vllm + "/metrics")
    out = tmp_path / "r.json"
    argv = ["--base-url", stack.vllm, "--model", "tiny", "--endpoint", "completions", "--quiet", "--source", fmt]
    argv += ["--dataset-path", str(path), "--trace-block-tokens", str(BLOCK), "--trace-speedup", "1000"]
    argv += ["--max-concurrency", "1", "--max-tokens", "8", "--ignore-eos", "--seed", str(seed), "--output", str(out)]
    argv += ["--num-requests", str(n)] if n else []
    assert main(argv) == 0
    after = metrics(stack.vllm + "/metrics")
    doc = json.loads(out.read_text())
    assert doc["completed"] == len(trace.requests) and doc["failed"] == 0
    assert doc["prompt_text_from"] == "server:/tokenize"

    with open(log, errors="replace") as fh:
        fh.seek(offset)
        received = [[int(t) for t in m.group(1).split(",")] for m in LOGGED.finditer(fh.read())]
    assert len(received) == len(trace.requests)  # one at a time, in trace order
    # each prompt is as long as the trace says, plus the completion template's few tokens
    template = [len(toks) - r.input_tokens for toks, r in zip(received, trace.requests)]
    assert 0 < min(template) <= 16 and max(template) - min(template) <= 2, template
    # two prompts share exactly the blocks of their common leading ids (after the template's leading tokens, the
    # same for every pair) and differ right after them
    beyond = []  # tokens shared beyond the k common blocks
    sharing = 0
    for i in range(len(trace.requests)):
        for j in range(i + 1, len(trace.requests), max(1, len(trace.requests) // 20)):
            a, b = trace.requests[i].hash_ids, trace.requests[j].hash_ids
            k = _shared(list(a), list(b))
            if k and k == min(len(a), len(b)):
                continue  # one's ids are a prefix of the other's: the shorter one's last block may be partial
            beyond.append(_shared(received[i], received[j]) - k * BLOCK)
            sharing += k > 0
    lead = min(beyond)
    assert len(beyond) >= 5 and 0 < lead <= 16, beyond
    assert max(beyond) - lead < 4, beyond  # a word may match by chance right after the blocks
    assert (sharing > 0) == (fmt != "azure"), sharing

    # LMCache's memory holds the whole window, so every reusable block hits: the plan's unbounded cache
    def delta(name: str) -> float:
        return metric(after, name) - metric(before, name)

    # over the trace's prompt tokens, as the plan counts: vLLM's queries also count the template's tokens
    assert delta("vllm:external_prefix_cache_queries_total") == sum(map(len, received))
    measured = delta("vllm:external_prefix_cache_hits_total") / sum(r.input_tokens for r in trace.requests)
    predicted = reuse_profile(trace).max_hit_rate
    print(f"{fmt}: {len(trace.requests)} requests, hit rate measured {measured:.4f}, plan {predicted:.4f}")
    assert measured == pytest.approx(predicted, abs=0.01)  # equal to 4 digits when measured
    assert (measured > 0.1) == (fmt != "azure")
