"""`kvtier compare`: ratios against the first run are right, labels and --json work, user errors exit 2 in one line."""

import copy
import html
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from replay.outputs._common import default_labels
from replay.outputs.html.cli import main as report_main
from replay.synthetic.compare import build_table, main

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def two_runs(tmp_path, sample_doc):
    """A bench run, and a copy that moved twice the bytes through every tier and took half the p99."""
    fast = copy.deepcopy(sample_doc)
    for t in fast["tiers"].values():
        for op in ("read", "write"):
            t[op]["bytes"] *= 2
            t[op]["latency_ms"]["p99"] /= 2
    fast["summary"]["requests_per_second"] *= 2
    fast["summary"]["end_to_end_latency_ms"]["p99"] /= 2
    a, b = tmp_path / "slow.json", tmp_path / "fast.json"
    a.write_text(json.dumps(sample_doc))
    b.write_text(json.dumps(fast))
    return a, b


def _rows(table):
    return {r["metric"]: r for r in table["rows"]}


def test_ratios_and_json(tmp_path, two_runs, sample_doc, capsys):
    a, b = two_runs
    out = tmp_path / "cmp" / "table.json"
    assert main([str(a), str(b), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    table = json.loads(out.read_text())
    assert [r["label"] for r in table["runs"]] == ["slow", "fast"]
    rows = _rows(table)
    for tier in ("cpu", "disk"):
        for op in ("read", "write"):
            assert rows[f"{tier} {op} GB/s"]["ratios"] == [None, pytest.approx(2.0)]
            assert rows[f"{tier} {op} p99"]["ratios"] == [None, pytest.approx(0.5)]
    assert rows["requests/s"]["ratios"][1] == pytest.approx(2.0)
    assert rows["end-to-end p99"]["ratios"][1] == pytest.approx(0.5)
    assert rows["tokens/s"]["ratios"][1] == pytest.approx(1.0)
    assert rows["status"]["values"] == ["completed", "completed"] and rows["status"]["ratios"] == [None, None]
    gbps = rows["disk read GB/s"]["values"]
    read_gbps = sample_doc["summary"]["cache_stats"]["tier_storage_read_bandwidth_gbps"]
    assert gbps[0] == pytest.approx(read_gbps, abs=1e-4) and gbps[1] == pytest.approx(2 * read_gbps, abs=1e-3)
    # the printed table says the same
    assert "2.00x" in text and "0.50x" in text and "slow" in text and "fast" in text
    disk_line = next(line for line in text.splitlines() if "disk read GB/s" in line)
    assert "2.00x" in disk_line


@pytest.mark.slow
def test_labels_three_runs_and_qos_rows(tmp_path, two_runs, full_doc, capsys):
    """The third run has QoS classes and a prefix cache, the first two not: their cells are empty."""
    a, b = two_runs
    for path in two_runs:
        doc = json.loads(path.read_text())
        del doc["summary"]["qos_metrics"], doc["summary"]["prefix_cache_stats"]
        path.write_text(json.dumps(doc))
    c = tmp_path / "qos.json"
    c.write_text(json.dumps(full_doc))
    assert main([str(a), str(b), str(c), "--labels", "base, 2x ,qos"]) == 0
    text = capsys.readouterr().out
    assert "base" in text and "2x" in text and "qos" in text
    classes = full_doc["summary"]["qos_metrics"]
    assert all(f"QoS {name} service p99" in text for name in classes)
    table = build_table([json.loads(p.read_text()) for p in (a, b, c)], ["a", "b", "c"], ["a", "b", "c"])
    rows = _rows(table)
    for name, q in classes.items():
        assert rows[f"QoS {name} SLA"]["values"] == [None, None, q["sla"]["verdict"]]
        assert rows[f"QoS {name} service p99"]["values"] == [None, None, q["service_latency_ms"]["p99"]]
    hit_rate = full_doc["summary"]["prefix_cache_stats"]["hit_rate"]
    assert rows["prefix cache hit rate"]["values"] == [None, None, hit_rate]


def test_default_labels_disambiguate():
    assert default_labels(["x/run.json", "y/other.json"]) == ["run", "other"]
    assert default_labels(["nvme/result.json", "sata/result.json"]) == ["nvme/result", "sata/result"]


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "no such file"),
        ("not json at all", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"summary": {"requests": 3}}', "not a kvtier bench result"),
        ('{"request_throughput": 1.0, "ttft_ms": {}}', "a `kvtier replay` summary"),
    ],
)
def test_bad_file_exit_2_one_line(tmp_path, two_runs, capsys, content, message):
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_text(content)
    assert main([str(two_runs[0]), str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvtier compare: ") and message in err and "bad.json" in err
    assert len(err.strip().splitlines()) == 1


def test_label_count_mismatch(two_runs, capsys):
    assert main([*map(str, two_runs), "--labels", "only-one"]) == 2
    assert "--labels has 1 names for 2 files" in capsys.readouterr().err


@pytest.mark.slow
def test_through_the_kvtier_command(tmp_path, two_runs):
    """As a person runs it: no traceback on a bad file, exit 2."""
    proc = subprocess.run(
        [sys.executable, "-m", "replay.cli", "compare", str(two_runs[0]), str(tmp_path / "missing.json")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "missing.json: no such file" in proc.stderr


@pytest.mark.parametrize(
    "labels, said",
    [
        ("a,", "name 2 is empty"),
        (",b", "name 1 is empty"),
        (" ,b", "name 1 is empty"),
        ("a,a", "'a' names two files"),
        ("a, a", "'a' names two files"),
        ("a,b,", "has 3 names for 2 files"),
    ],
)
def test_labels_that_do_not_name_each_column_once_are_refused(two_runs, capsys, tmp_path, labels, said):
    out = tmp_path / "t.json"
    rc = main([*map(str, two_runs), "--labels", labels, "--json", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and said in err[0], err
    assert not out.exists()


def _compare_cells(text: str) -> dict[str, list[str]]:
    """kvtier compare's printed table: per row, the metric's label and then its cells as shown."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if len(cells) > 1 and cells[0] and cells[0] != "metric":
            rows[cells[0]] = cells[1:]
    return rows


def _report_cells(page: str) -> dict[str, list[str]]:
    """The report's summary table: per row, the metric's label and then its cells' text."""
    table = re.search(r'<table class="summary">(.*?)</table>', page, re.S).group(1)
    rows = {}
    for tr in re.findall(r"<tr>(.*?)</tr>", table, re.S):
        cells = [html.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", tr, re.S)]
        if cells:
            rows[cells[0]] = cells[1:]
    return rows


def test_compare_and_the_report_show_each_figure_alike(tmp_path, two_runs, monkeypatch, capsys):
    """One figure, one text: every row the report's summary shows reads the same in `kvtier compare`'s table, values
    and ratios, with figures where the two once differed (under 1 ms, over 100 ms, a share)."""
    a, b = two_runs
    for path, p50, p99, hit_rate in ((a, 0.01234, 123.456, 0.2537), (b, 0.5, 99.99, 0.5)):
        doc = json.loads(path.read_text())
        doc["summary"]["end_to_end_latency_ms"].update(p50=p50, p99=p99)
        doc["summary"]["cache_stats"]["cache_hit_rate"] = hit_rate
        path.write_text(json.dumps(doc))
    monkeypatch.setenv("COLUMNS", "200")  # rich folds cells narrower than the table
    assert main([str(a), str(b)]) == 0
    shown = _compare_cells(capsys.readouterr().out)
    page = tmp_path / "r.html"
    assert report_main([str(a), str(b), "-o", str(page)]) == 0
    reported = _report_cells(page.read_text())
    assert reported["end-to-end p50 (ms)"][:2] == ["0.01234", "0.5"]
    assert reported["end-to-end p99 (ms)"][:2] == ["123.5", "99.99"]
    assert reported["cache hit rate"][:2] == ["25.37%", "50.00%"]
    assert len(reported) > 10
    for label, cells in reported.items():
        assert shown.get(label) == cells, label


def test_one_file_given_twice_is_refused(two_runs, capsys, tmp_path):
    a = two_runs[0]
    (tmp_path / "link.json").symlink_to(a)
    for twice, said in [(str(a), "is given twice"), (str(tmp_path / "link.json"), "are the same file")]:
        assert main([str(a), twice]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("kvtier compare: ") and said in err[0], err
