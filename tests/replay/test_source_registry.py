"""One registry of workload sources (replay/sources/registry.py): both drivers' choices, checks and loading."""

import pydantic
import pytest

from replay.openai.config import ReplayConfig
from replay.sources.block_traces import FORMATS
from replay.sources.registry import SOURCES, block_trace_names, check_source, source_names
from replay.synthetic.config import BenchConfig


def test_the_registry_holds_every_source_and_each_block_trace_format():
    # hit-rate: a block-hash trace made to a target hit rate (replay/sources/target_hit_rate.py), in vLLM's blocks
    assert set(source_names()) == {"sharegpt", "burstgpt", "synthetic", *FORMATS, "hit-rate"}
    assert block_trace_names() == (*FORMATS, "hit-rate")
    assert {n: s.block_tokens for n, s in SOURCES.items() if s.block_trace} == {**FORMATS, "hit-rate": 16}


@pytest.mark.parametrize(
    ("name", "inputs", "kw", "line"),
    [
        ("sharegpt", {}, {}, "--source sharegpt needs --dataset-path FILE"),
        ("burstgpt", {"--dataset-path": "x"}, {}, "--source burstgpt needs --trace-path FILE|DIR|GLOB"),
        ("weka", {}, {}, "--source weka needs --dataset-path FILE (a weka trace)"),
        ("synthetic", {"--trace-path": "t.csv"}, {}, "--trace-path is not read by --source synthetic"),
        ("sharegpt", {"--dataset-path": "x"}, {"block_tokens": 16}, "--trace-block-tokens rescales a block-hash"),
        ("nope", {}, {}, "--source nope: not a known source (known: sharegpt, burstgpt, synthetic, mooncake"),
        ("sharegpt", {}, {"choices": block_trace_names()}, "--source sharegpt: not a block-hash trace format (known: "),
    ],
)
def test_a_source_without_what_it_needs_is_one_line(name, inputs, kw, line):
    with pytest.raises(ValueError) as exc:
        check_source(name, inputs, **kw)
    assert str(exc.value).startswith(line) and "\n" not in str(exc.value)


def test_both_drivers_refuse_a_trace_without_its_file_alike():
    replay_kw = {"base_url": "http://127.0.0.1:1", "model": "m", "output": "o.json"}
    with pytest.raises(pydantic.ValidationError, match=r"--source mooncake needs --dataset-path FILE \(a mooncake"):
        ReplayConfig(source="mooncake", **replay_kw)
    with pytest.raises(pydantic.ValidationError, match=r"--source mooncake needs --dataset-path FILE \(a mooncake"):
        BenchConfig(source="mooncake")
    with pytest.raises(pydantic.ValidationError, match="not a block-hash trace format"):
        BenchConfig(source="sharegpt", dataset_path="x.json")


def test_a_block_trace_loads_through_the_registry(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]}\n'
        '{"timestamp": 5, "input_length": 100, "output_length": 4, "hash_ids": [1]}\n'
    )
    trace = SOURCES["mooncake"].load(str(path), block_tokens=16)
    assert len(trace.requests) == 2 and trace.block_tokens == 16
