"""`kvtier report` without a browser: what it refuses (one line, exit 2, nothing written) and what the file holds.
The pages themselves are checked in a real browser by test_html_browser.py.

The documents are made by `kvtier plan` (instant) and read back; the altered ones are those documents with one field
changed, as a hand-edited or truncated file would be."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from replay.cli import main as kvtier_main
from replay.outputs.html.cli import main
from replay.plan.cli import main as plan_main

ROOT = Path(__file__).resolve().parents[3]
TRACE = ROOT / "tests" / "tracing" / "fixtures" / "python_pwrite_fsync_pread.json"
MOONCAKE = ROOT / "tests" / "replay" / "data" / "mooncake" / "conversation_trace_head300.jsonl"
PLAN = ["--concurrency", "4", "--rounds", "4", "--first-input-len", "200", "--input-len", "20", "--output-len", "50"]
PLAN += ["--block-size", "16", "--kv-bytes-per-token", "1KB", "--tier", "dram=400KB", "--quiet"]


@pytest.fixture
def plan(tmp_path) -> Path:
    out = tmp_path / "plan.json"
    assert plan_main([*PLAN, "--output", str(out)]) == 0
    return out


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("kvtier report: ")
    return err[0]


@pytest.mark.slow
def test_page_is_one_file_with_plotly_inside_and_the_numbers_of_the_run(plan, tmp_path, capsys):
    page = tmp_path / "r.html"
    assert main([str(plan), "-o", str(page)]) == 0
    text = page.read_text()
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", text)  # nothing to fetch when it is opened
    assert "Plotly.newPlot" in text and len(text) > 3_000_000  # plotly's bundle inlined
    doc = json.loads(plan.read_text())
    collapse = doc["configurations"][0]["collapse_round"]
    assert f'data-value="{collapse!r}" data-path="configurations/0/collapse_round"' in text
    assert page.stat().st_mode & 0o777 == 0o644  # as every output of kvtier (umask 022)


@pytest.mark.slow
def test_a_storage_trace_is_a_kind_too(tmp_path):
    assert main([str(TRACE), "-o", str(tmp_path / "t.html")]) == 0
    assert 'data-kind="trace"' in (tmp_path / "t.html").read_text()


def _altered(plan: Path, change) -> Path:
    doc = json.loads(plan.read_text())
    change(doc)
    plan.write_text(json.dumps(doc))
    return plan


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d.update(kind="kvtier something"), "not a kvtier result the report knows (kind 'kvtier something')"),
        (lambda d: d["configurations"][0].update(collapse_round="soon"), "configurations[0].collapse_round"),
        (lambda d: d["configurations"][0]["rounds"][1].pop("predicted_hit_rate"), "predicted_hit_rate"),
        (lambda d: d.pop("workload"), "workload"),
    ],
)
def test_an_altered_document_is_one_line(plan, tmp_path, capsys, change, message):
    path = _altered(plan, change)
    assert main([str(path), "-o", str(tmp_path / "r.html")]) == 2
    assert message in one_line(capsys)
    assert not (tmp_path / "r.html").exists()


@pytest.mark.slow
def test_a_bench_histogram_that_does_not_decode_is_one_line(tmp_path, capsys):
    from bench_helpers import run

    doc = run(tmp_path, duration=0.3)
    doc["tiers"]["disk"]["read"]["histograms"]["total"] = "HISTFAAAAVF4nC2RMUsDQRCFb97u"  # cut short
    (tmp_path / "cut.json").write_text(json.dumps(doc))
    assert main([str(tmp_path / "cut.json"), "-o", str(tmp_path / "r.html")]) == 2
    assert "disk read histogram cannot be decoded" in one_line(capsys)


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "not a JSON object, nor a storage trace"),
        ("[1, 2]", "not a JSON object, nor a storage trace"),
        ('{"a": 1}', "not a kvtier result the report knows (keys a)"),
        ('{"status": "completed", "summary": {"elapsed_time": "long"}}', "summary.elapsed_time"),
        ('{"kind": "kvtier plan", "status": "done", "workload": {"rounds": NaN}}', "NaN"),
    ],
)
def test_files_that_are_not_results(tmp_path, capsys, content, message):
    (tmp_path / "x.json").write_text(content)
    assert main([str(tmp_path / "x.json"), "-o", str(tmp_path / "r.html")]) == 2
    assert message in one_line(capsys)


def test_user_mistakes_are_one_line_and_write_nothing(plan, tmp_path, capsys):
    trace_plan = tmp_path / "trace-plan.json"
    assert plan_main(["--trace", str(MOONCAKE), "--tier", "a=1e4", "--quiet", "--output", str(trace_plan)]) == 0
    out = tmp_path / "r.html"
    cases = [
        ([str(tmp_path / "missing.json")], "missing.json: no such file"),
        ([str(tmp_path)], "is a directory"),
        ([str(plan), str(trace_plan)], "cannot overlay results of different kinds"),
        ([str(plan), "--labels", "a,b"], "--labels has 2 names for 1 files"),
    ]
    for args, message in cases:
        assert main([*args, "-o", str(out)]) == 2
        assert message in one_line(capsys)
    assert main([str(plan), "-o", str(plan)]) == 2  # the output would replace its input
    assert "is also an input" in one_line(capsys)
    assert main([str(plan), "-o", str(tmp_path)]) == 2
    assert "is a directory; give a file name" in one_line(capsys)
    with pytest.raises(SystemExit) as exc:
        main([str(plan)])
    assert exc.value.code == 2 and "-o/--output" in one_line(capsys)
    assert not out.exists()


def test_help_has_examples_and_the_subcommand_is_listed(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "examples:" in capsys.readouterr().out
    assert kvtier_main(["--help"]) == 0
    assert "kvtier report a.json b.json -o report.html" in capsys.readouterr().out


def test_plan_html_output_is_checked_before_the_run(plan, tmp_path, capsys):
    out = tmp_path / "p.json"
    assert plan_main([*PLAN, "--output", str(out), "--html-output", str(out)]) == 2
    assert "also given to --output" in capsys.readouterr().err
    assert plan_main([*PLAN, "--html-output", str(tmp_path)]) == 2
    assert "--html-output" in capsys.readouterr().err and not out.exists()
    assert plan_main([*PLAN, "--output", str(out), "--html-output", str(tmp_path / "p.html")]) == 0
    assert "plan.json" not in (tmp_path / "p.html").read_text() and "p.json" in (tmp_path / "p.html").read_text()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--labels", ""], "--labels is empty"),
        (["--labels", "  "], "--labels is empty"),
        (["--labels", "a,"], "name 2 is empty"),
        (["--labels", ",b"], "name 1 is empty"),
        (["--labels", " ,b"], "name 1 is empty"),
        (["--labels", "a,a"], "'a' names two files"),
        (["--labels", "a, a "], "'a' names two files"),
        (["--labels", "a,b,c"], "--labels has 3 names for 2 files"),
        (["--title", ""], "--title is empty"),
        (["--title", " \t"], "--title is empty"),
    ],
)
def test_labels_and_a_title_that_name_nothing_are_refused(plan, tmp_path, capsys, args, message):
    other = tmp_path / "other.json"
    other.write_bytes(plan.read_bytes())
    out = tmp_path / "r.html"
    assert main([str(plan), str(other), *args, "-o", str(out)]) == 2
    assert message in one_line(capsys)
    assert not out.exists()


def test_one_file_given_twice_is_refused(plan, tmp_path, capsys):
    """By the same name, by another spelling of it, through a symbolic or a hard link: a run beside itself."""
    (tmp_path / "sym.json").symlink_to(plan)
    os.link(plan, tmp_path / "hard.json")
    out = tmp_path / "r.html"
    for twice, said in [
        (str(plan), "is given twice"),
        (f"{tmp_path}/./{plan.name}", "are the same file"),
        (str(tmp_path / "sym.json"), "are the same file"),
        (str(tmp_path / "hard.json"), "are the same file"),
    ]:
        assert main([str(plan), twice, "-o", str(out)]) == 2
        assert said in one_line(capsys)
    assert not out.exists()
