"""The public traces' other shapes: Azure's three column sets told apart by their header (the 2023 sample is the
published file's first rows; the 2024 and 2025 samples are hand-made, tests/replay/data/azure/README.md), and
Bailian's real request types."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replay.plan.trace import reuse_profile
from replay.sources.base import WorkloadError
from replay.sources.block_traces import load_block_trace

AZURE = Path(__file__).parent / "data" / "azure"
A2023 = AZURE / "AzureLLMInferenceTrace_conv_head300.csv"
A2024 = AZURE / "AzureLLMInferenceTrace_2024_handmade.csv"
A2025 = AZURE / "AzureLMMInferenceTrace_multimodal_handmade.csv"


def test_the_2023_sample_reads_its_rows():
    trace = load_block_trace(A2023, "azure")
    rows = A2023.read_text().splitlines()[1:]
    assert len(trace.requests) == len(rows) == 300
    assert [(r.input_tokens, r.output_tokens) for r in trace.requests] == [
        (int(c), int(g)) for _, c, g in (row.split(",") for row in rows)
    ]


def test_the_2024_week_s_times_carry_a_zone():
    trace = load_block_trace(A2024, "azure")
    assert [r.arrival_s for r in trace.requests] == pytest.approx([0, 0.024934, 0.70041, 1.092281, 2.49007])
    assert [r.input_tokens for r in trace.requests] == [4808, 3180, 110, 7433, 1]


def test_the_2025_multimodal_trace_is_picked_by_its_header():
    trace = load_block_trace(A2025, "azure")
    assert [r.arrival_s for r in trace.requests] == pytest.approx([0, 0.243, 0.735, 2.981])
    assert [(r.input_tokens, r.output_tokens) for r in trace.requests] == [(2417, 112), (873, 45), (6120, 230),
                                                                           (4096, 18)]  # fmt: skip
    assert reuse_profile(trace).max_hit_rate == 0  # no prefix information: nothing is claimed


@pytest.mark.parametrize(
    "header",
    [
        "TIMESTAMP,NumImages,ContextTokens",
        "timestamp,ContextTokens,GeneratedTokens",
        "TIMESTAMP,ContextTokens,NumImages,GeneratedTokens",
        "TIMESTAMP,ContextTokens,GeneratedTokens,NumImages",
        "Timestamp,Request tokens,Response tokens",
        "",
    ],
)
def test_an_unknown_column_set_names_what_it_found_and_what_is_expected(tmp_path, header):
    path = tmp_path / "a.csv"
    path.write_text(header + "\n2024-10-15T12:00:00,1,2,3\n")
    with pytest.raises(WorkloadError) as exc:
        load_block_trace(path, "azure")
    line = str(exc.value)
    assert line.startswith(f"{path}:1: not an Azure LLM inference trace") and "\n" not in line
    assert f"found {header!r}" in line if header else "found nothing" in line
    assert "TIMESTAMP,ContextTokens,GeneratedTokens or TIMESTAMP,NumImages,ContextTokens,GeneratedTokens" in line


@pytest.mark.parametrize(
    ("row", "says"),
    [
        ("2024-10-15T12:00:01,1,5", ":3: expected 4 fields, found 3"),
        ("2024-10-15T12:00:01,-1,5,5", ":3: NumImages '-1'"),
        ("2024-10-15T12:00:01,two,5,5", ":3: NumImages 'two' is not numeric"),
        ("2024-10-15T12:00:01+00:00,1,5,5", ":3: TIMESTAMP '2024-10-15T12:00:01+00:00' has a time zone"),
        ("2024-10-15T11:59:59,1,5,5", ":3: timestamp -1 s is earlier"),
    ],
)
def test_bad_rows_of_the_2025_trace(tmp_path, row, says):
    path = tmp_path / "m.csv"
    path.write_text(f"TIMESTAMP,NumImages,ContextTokens,GeneratedTokens\n2024-10-15T12:00:00,0,3,4\n{row}\n")
    with pytest.raises(WorkloadError) as exc:
        load_block_trace(path, "azure")
    assert str(exc.value).startswith(str(path)) and says in str(exc.value), str(exc.value)


def test_bailian_s_real_request_types_are_read(tmp_path):
    # Bailian's published files carry type values beyond the four its README documents; a child request shares all
    # but the last block of its parent (the parent's partial last block is new text in the child)
    rows = [
        {"chat_id": 1, "parent_chat_id": -1, "timestamp": 0.0, "input_length": 40, "output_length": 5, "type": "api",
         "turn": 1, "hash_ids": [1, 2, 3]},
        {"chat_id": 2, "parent_chat_id": 1, "timestamp": 1.0, "input_length": 70, "output_length": 5,
         "type": "thinking", "turn": 2, "hash_ids": [1, 2, 4, 5, 6]},
        {"chat_id": 3, "parent_chat_id": -1, "timestamp": 2.0, "input_length": 20, "output_length": 5, "type": "coder",
         "turn": 1, "hash_ids": [7, 8]},
        {"chat_id": 4, "parent_chat_id": -1, "timestamp": 3.0, "input_length": 20, "output_length": 5, "type": "text",
         "turn": 1, "hash_ids": [9, 10]},
    ]  # fmt: skip
    path = tmp_path / "b.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    trace = load_block_trace(path, "bailian")
    assert [r.input_tokens for r in trace.requests] == [40, 70, 20, 20]
    assert reuse_profile(trace).hit_tokens(1e9) == 16 * 2  # the child hits its parent's two whole blocks


VALUES = ["1" * 5000, "1e400", "nan", "-1", "1.5", "", '"', "\x00", "x" * 200_000, "2023-02-30T00:00:00", " 12 "]


def test_every_value_in_every_column_of_the_2025_trace_is_read_or_one_line(tmp_path):
    head, first = "TIMESTAMP,NumImages,ContextTokens,GeneratedTokens\n", "2024-10-15T12:00:00.269,1,2417,112"
    for col in range(4):
        for j, value in enumerate(VALUES):
            bad = ",".join(value if k == col else f for k, f in enumerate(first.split(",")))
            path = tmp_path / f"{col}-{j}.csv"
            path.write_text(f"{head}{first}\n{bad}\n")
            try:
                load_block_trace(path, "azure")
            except WorkloadError as exc:
                assert "\n" not in str(exc) and len(str(exc)) < 400 and f"{path}:" in str(exc), (col, value, exc)
