"""`kvtier report RUN_DIR` (or a run summary): the page of a run of the MLPerf KV cache harness, over run trees built
as each harness writes them (mlperf_helpers.py). Fast: the document the page draws (replay/mlperf/report_doc.py)
and its tables; slow: the page written by the command, and opened in headless chromium."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from html import unescape
from pathlib import Path

import pytest
from mlperf_helpers import edit_rank, finish, harness_tree, rank_file

from replay.mlperf.report_doc import report_doc
from replay.mlperf.rules import RULES
from replay.outputs.compare_rows import value_at
from replay.outputs.html.kinds import run_from_doc
from replay.outputs.html.sections import VIEWS

ROOT = Path(__file__).resolve().parents[2]
HEADLINE = (
    "aggregated_read_bandwidth_gbps",
    "aggregated_device_read_p95_ms",
    "aggregated_device_write_p95_ms",
    "aggregated_storage_throughput_tokens_per_sec",
)


def tree(tmp_path: Path, mode: str = "open", ranks: int = 2, trials: int = 2, summary: bool = True) -> Path:
    run = tmp_path / "run"
    harness_tree(run, tmp_path / "cache", tmp_path / "results", mode=mode, ranks=ranks, trials=trials)
    # rank figures that differ per rank and trial, so a sum, a mean or a maximum taken wrong shows
    for o in (1, 2, 3):
        for t in range(trials):
            for r in range(ranks):

                def change(doc, o=o, t=t, r=r):
                    c = doc["summary"]["cache_stats"]
                    c["tier_storage_read_bandwidth_gbps"] = 0.5 * o + 0.25 * t + 0.125 * r
                    c["storage_read_device_p95_ms"] = 1.0 + o + 3 * t + r
                    c["storage_write_device_p95_ms"] = 2.0 + o * r + t
                    doc["summary"]["storage_throughput_tokens_per_sec"] = 1000 * o + 10 * t + r

                edit_rank(run, o, t, r, change)
    if summary:
        finish(run, ranks, trials)
    return run


def rows(doc: dict) -> dict[str, object]:
    """The summary table's rows as the page shows them: metric -> (value, path)."""
    run = run_from_doc(doc, doc["run_dir"], "run")
    view = VIEWS[run.kind]
    return {r.metric: (value_at(doc, r.get), r.get if isinstance(r.get, tuple) else None) for r in view.rows([run])}


def test_the_headline_is_the_summary_s_and_every_rule_has_its_verdict(tmp_path):
    run = tree(tmp_path)
    doc = report_doc(str(run))
    summary = json.loads(next(run.glob("kvcache_run_summary_*.json")).read_text())
    assert doc["summary"] == summary and not doc["summary_computed"]
    shown = rows(doc)
    for o in ("1", "2", "3"):
        for key, words in zip(HEADLINE, ("read GB/s", "device read p95", "device write p95", "storage tokens/s")):
            value, path = shown[f"Option {o}: {words}"]
            assert path == ("summary", "options", o, key) and value == summary["options"][o][key]
    assert shown["total ranks"][0] == summary["total_ranks"] == 2
    # the verdicts: every rule of rules.py, by ID and section, as `kvtier check` gives them
    assert {f["rule"] for f in doc["findings"]} == set(RULES)
    assert all(f["section"] == RULES[f["rule"]] for f in doc["findings"])
    assert doc["failing"] == []
    page = VIEWS["mlperf"].tables([run_from_doc(doc, str(run), "run")])
    for rule in RULES:
        assert re.search(rf'data-rule="{rule}" data-verdict="(PASS|SKIP)"', page), rule
    # Options x trials x ranks: 3 x 2 x 2 rank rows and 6 trial rows, each rank's figure carried with its path
    assert page.count('<tr class="rank">') == 12 and page.count('<tr class="trial-total">') == 6
    i = next(i for i, r in enumerate(doc["ranks"]) if (r["option"], r["trial"], r["rank"]) == (3, 1, 1))
    assert f'data-value="{0.5 * 3 + 0.25 + 0.125!r}" data-path="ranks/{i}/read_gbps"' in page


@pytest.mark.parametrize(
    "alter, rule",
    [
        ("missing", "kvcacheClientDefinition"),
        ("cpu_tier", "kvcacheLatencyValidity"),
        ("shared_cache", "kvcachePerClientIsolation"),
        ("two_trials", "kvcacheClosedSequenceLocks"),
        ("changed_option", "kvcacheFixedWorkloadPerOption"),
    ],
)
def test_a_failing_rule_is_named_on_the_page(tmp_path, alter, rule):
    run = tree(tmp_path, mode="closed", trials=3 if alter != "two_trials" else 2, summary=False)
    if alter == "missing":
        rank_file(run, 2, 1, 1).unlink()
    elif alter == "cpu_tier":
        for t in range(3):
            for r in range(2):
                edit_rank(run, 1, t, r, lambda d: d["summary"]["cache_stats"].update(storage_entries=0))
    elif alter == "shared_cache":
        edit_rank(run, 1, 0, 1, lambda d: d["config"].update(cache_dir=str(tmp_path / "cache" / "rank_0")))
    elif alter == "changed_option":
        edit_rank(run, 3, 0, 0, lambda d: d["config"].update(num_users=7))
    finish(run, 2, 3 if alter != "two_trials" else 2)
    doc = report_doc(str(run))
    assert rule in doc["failing"]
    r = run_from_doc(doc, str(run), "run")
    page = VIEWS["mlperf"].tables([r])
    assert re.search(rf'data-rule="{rule}" data-verdict="FAIL"', page)
    assert any(level == "error" and rule in text for level, text in VIEWS["mlperf"].banners(r))
    if alter == "missing":  # the summary's partial failure, the rank named, and its row in the table
        assert any("partial failure" in text and "rank_1" in text for _, text in VIEWS["mlperf"].banners(r))
        assert re.search(r"no results file</td><td>option_2/trial_1/rank_1/</td>", page)


def test_a_summary_given_is_the_one_shown_and_device_p95s_it_lacks_come_from_the_ranks(tmp_path):
    run = tree(tmp_path)
    path = next(run.glob("kvcache_run_summary_*.json"))
    summary = json.loads(path.read_text())
    for entry in summary["options"].values():  # mlpstorage's summary: no device p95s
        del entry["aggregated_device_read_p95_ms"], entry["aggregated_device_write_p95_ms"]
    mine = run / "kvcache_run_summary_20260101_130000.json"
    mine.write_text(json.dumps(summary))
    doc = report_doc(str(mine))
    assert doc["summary_path"] == str(mine) and doc["other_summaries"] == [path.name]
    shown = rows(doc)
    value, where = shown["Option 2: device read p95 (from the rank files)"]
    assert where is None and value == max(1.0 + 2 + 3 * t + r for t in range(2) for r in range(2))
    assert shown["Option 2: read GB/s"][0] == summary["options"]["2"]["aggregated_read_bandwidth_gbps"]


def test_a_run_without_its_summary_is_aggregated_here_and_says_so(tmp_path):
    run = tree(tmp_path, summary=False)
    doc = report_doc(str(run))
    assert doc["summary_computed"] and set(doc["summary"]["options"]) == {"1", "2", "3"}
    # the mean over trials of the ranks' sums, as mlpstorage aggregates
    want = sum(sum(0.5 * 2 + 0.25 * t + 0.125 * r for r in range(2)) for t in range(2)) / 2
    assert doc["summary"]["options"]["2"]["aggregated_read_bandwidth_gbps"] == pytest.approx(want)
    r = run_from_doc(doc, str(run), "run")
    assert any(level == "warn" and "no run summary" in text for level, text in VIEWS["mlperf"].banners(r))


def test_an_unreadable_rank_file_is_a_row_that_says_so(tmp_path):
    run = tree(tmp_path)
    rank_file(run, 1, 0, 1).write_text("{not json")
    doc = report_doc(str(run))
    bad = [r for r in doc["ranks"] if "error" in r]
    assert [(r["option"], r["trial"], r["rank"]) for r in bad] == [(1, 0, 1)]
    assert "unreadable: " in VIEWS["mlperf"].tables([run_from_doc(doc, str(run), "run")])


def kvtier(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "replay.cli", "report", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


@pytest.mark.slow
def test_the_command_writes_the_page_of_a_run_dir_and_of_its_summary(tmp_path):
    run = tree(tmp_path)
    summary = json.loads(next(run.glob("kvcache_run_summary_*.json")).read_text())
    for given in (run, next(run.glob("kvcache_run_summary_*.json"))):
        page = tmp_path / f"{given.name}.html"
        r = kvtier(str(given), "-o", str(page))
        assert r.returncode == 0, r.stderr
        text = page.read_text()
        assert 'data-kind="mlperf"' in text
        for o in ("1", "2", "3"):
            for key in HEADLINE:
                value = summary["options"][o][key]
                assert f'data-value="{value!r}" data-path="summary/options/{o}/{key}"' in text, (o, key)
        assert 'data-value="2" data-path="summary/total_ranks"' in text
        lines = re.findall(r'<tr class="finding" data-rule="(\w+)" data-verdict="(\w+)">', text)
        assert {rule for rule, _ in lines} == set(RULES)
        assert "kvcacheHeadlineResult" in unescape(text)


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, said",
    [
        (["{run}", "{run}"], "reported alone"),
        (["{run}", "{plan}"], "reported alone"),
        (["{summary}", "{plan}"], "reported alone"),
        (["{empty}"], "not a run directory"),
        (["{run}", "--labels", "a,b"], "one name"),
    ],
)
def test_refusals_are_one_line(tmp_path, args, said):
    run = tree(tmp_path)
    (tmp_path / "empty").mkdir()
    (tmp_path / "plan.json").write_text("{}")
    paths = {
        "run": str(run),
        "plan": str(tmp_path / "plan.json"),
        "summary": str(next(run.glob("kvcache_run_summary_*.json"))),
        "empty": str(tmp_path / "empty"),
    }
    r = kvtier(*(a.format(**paths) for a in args), "-o", str(tmp_path / "p.html"))
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(err) == 1 and err[0].startswith("kvtier report: ") and said in err[0], err
    assert not (tmp_path / "p.html").exists()


@pytest.mark.slow
@pytest.mark.skipif(not (shutil.which("chromium") and shutil.which("chromedriver")), reason="needs chromium")
def test_the_page_draws_its_plots_in_chromium_without_errors(tmp_path):
    from helpers import wait_for
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    run = tree(tmp_path, ranks=3)
    page = tmp_path / "page.html"
    assert kvtier(str(run), "-o", str(page)).returncode == 0
    opts = Options()
    opts.binary_location = shutil.which("chromium")
    # --no-sandbox: chromium's sandbox refuses to run as root (the test machines run as root)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,900"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)
    try:
        driver.get(page.as_uri())
        wait_for(
            lambda: driver.execute_script(
                "return document.readyState === 'complete' && Array.from(document.querySelectorAll("
                "'.plotly-graph-div')).every(g => g._fullLayout !== undefined)"
            ),
            timeout_s=60,
            what="every plot drawn",
        )
        plots = driver.execute_script(
            "return Array.from(document.querySelectorAll('.plotly-graph-div')).map(g => ({"
            "title: g.layout.title.text || g.layout.title, traces: g.data.map(t => [t.type || 'scatter', t.name,"
            " (t.y || []).length]), bars: g.querySelectorAll('.bars .point').length}))"
        )
        verdicts = driver.execute_script(
            "return Array.from(document.querySelectorAll('tr.finding')).map(tr => tr.dataset.rule)"
        )
        log = driver.get_log("browser")
    finally:
        driver.quit()
    assert [e for e in log if e["level"] == "SEVERE"] == []
    assert len(plots) == 4
    read = next(p for p in plots if p["title"].startswith("Read bandwidth"))
    # one bar trace per rank, one bar per Option and trial, each drawn
    assert [t for t in read["traces"] if t[0] == "bar"] == [["bar", f"rank {r}", 6] for r in range(3)]
    assert read["bars"] == 18
    assert set(verdicts) == set(RULES)
