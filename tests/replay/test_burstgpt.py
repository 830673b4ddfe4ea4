"""BurstGPT loader: both CSV layouts by column name, sessions, failed rows, errors naming file and line."""

from __future__ import annotations

import pytest

from replay.sources.base import WorkloadError
from replay.sources.burstgpt import load_burstgpt

OLD = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
0,ChatGPT,100,50,150,Conversation log
12.5,GPT-4,1000,0,1000,API log
20,GPT-4,30,300,330,API log
"""

NEW = """Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type
0.0,s1,1.2,ChatGPT,100,20,120,Conversation log
1.0,s2,0.8,ChatGPT,50,10,60,Conversation log
4.0,s1,2.0,ChatGPT,150,30,180,Conversation log
6.0,s1,1.0,ChatGPT,40,5,45,Conversation log
7.0,s3,1.0,GPT-4,10,0,10,Conversation log
"""


def test_old_layout_single_turns_in_time_order(tmp_path):
    p = tmp_path / "old.csv"
    p.write_text(OLD)
    convs, report = load_burstgpt(p)
    assert [c.turns[0].arrival_s for c in convs] == [0.0, 5.0, 20.0]
    assert [(c.turns[0].input_tokens, c.turns[0].output_tokens) for c in convs] == [(100, 50), (472, 18), (30, 300)]
    assert report.skipped == {"failed_request": 1}
    assert report.conversations == 3 and report.turns == 3


def test_new_layout_sessions_become_conversations(tmp_path):
    p = tmp_path / "new.csv"
    p.write_text(NEW)
    convs, report = load_burstgpt(p)
    assert [c.conversation_id for c in convs] == ["session-s1", "session-s2"]
    s1 = convs[0]
    assert [t.arrival_s for t in s1.turns] == [0.0, 4.0, 6.0]
    # turn 2 adds 150 - (100 + 20) = 30 tokens; turn 3's 40 < 180 so the context was reset: full 40
    assert [t.input_tokens for t in s1.turns] == [100, 30, 40]
    assert report.skipped == {"failed_request": 1, "context_reset": 1}


def test_dir_glob_filters_and_limits(tmp_path):
    (tmp_path / "a.csv").write_text(OLD)
    (tmp_path / "b.csv").write_text(NEW)
    convs, _ = load_burstgpt(tmp_path)
    assert len(convs) == 5
    convs, _ = load_burstgpt(str(tmp_path / "a*.csv"), max_requests=2)
    assert sum(len(c.turns) for c in convs) == 2
    convs, report = load_burstgpt(tmp_path / "a.csv", models=("GPT-4",))
    assert len(convs) == 1 and report.skipped["filtered_model"] == 2


@pytest.mark.parametrize(
    "body, match",
    [
        ("Timestamp,Model\n1,x\n", "missing column"),
        (OLD + "oops,ChatGPT,1,1,2,API log\n", r"bad\.csv:6: .*not numeric"),
        (OLD + "1,ChatGPT,1\n", r"bad\.csv:6: expected 6 fields"),
        ("", "empty file"),
    ],
)
def test_malformed_input_names_file_and_line(tmp_path, body, match):
    p = tmp_path / "bad.csv"
    p.write_text(body)
    with pytest.raises(WorkloadError, match=match):
        load_burstgpt(p)


def test_missing_inputs(tmp_path):
    with pytest.raises(WorkloadError, match="not found"):
        load_burstgpt(tmp_path / "nope.csv")
    with pytest.raises(WorkloadError, match="matches no file"):
        load_burstgpt(str(tmp_path / "*.csv"))
    with pytest.raises(WorkloadError, match=r"no \*\.csv"):
        load_burstgpt(tmp_path)
