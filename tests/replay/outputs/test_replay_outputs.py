"""`kvtier replay`'s files, written by replay/outputs/ from a real short replay in rounds (against the fake server):
the per-request CSV and JSONL agree row for row, the per-round CSV is the summary's rounds, the figures are real PNGs,
and the closing tables show the run. Expected values are read from the run's own results, not typed in."""

from __future__ import annotations

import csv
import json
import logging

import pytest
from rich.console import Console

from replay.openai.cli import main
from replay.openai.fake_server import FakeServer, FakeServerConfig
from replay.outputs import replay_tables, write_replay_plots
from replay.outputs.csv_out import REQUEST_COLUMNS
from replay.outputs.plots import REPLAY_FIGURES, cdf_points

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("replay")
    with FakeServer(FakeServerConfig(block_size=4)) as srv:
        rc = main(
            [
                "--base-url",
                srv.base_url,
                "--model",
                "fake",
                "--quiet",
                "--source",
                "synthetic",
                "--rounds",
                "3",
                "--concurrency",
                "3",
                "--output-len",
                "4",
                "--input-len",
                "12",
                "--warmup",
                "2",
                "--metrics-url",
                srv.base_url + "/metrics",
                "--output",
                str(d / "out.json"),
                "--detail",
                str(d / "detail.jsonl"),
                "--csv",
                str(d / "req.csv"),
                "--plots",
                str(d / "plots"),
            ]
        )
    assert rc == 0
    return d, json.loads((d / "out.json").read_text())


def _csv(path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="", encoding="utf-8") as fh:
        r = csv.DictReader(fh)
        return list(r.fieldnames or []), list(r)


def _cell(v) -> str:
    return "" if v is None else str(v)


@pytest.mark.slow
def test_request_csv_matches_the_detail_jsonl(run):
    d, s = run
    detail = [json.loads(line) for line in (d / "detail.jsonl").read_text().splitlines()]
    assert sum(r["warmup"] for r in detail) == s["warmup_requests"] == 2  # the JSONL has the warm-up requests
    measured = [r for r in detail if not r["warmup"]]
    assert len(measured) == s["completed"] + s["failed"] == 9
    cols, rows = _csv(d / "req.csv")
    assert tuple(cols) == REQUEST_COLUMNS  # the CSV does not: only the run's requests, these columns in this order
    assert rows == [{c: _cell(r[c]) for c in REQUEST_COLUMNS} for r in measured]


def test_rounds_csv_is_the_summarys_rounds(run):
    d, s = run
    cols, rows = _csv(d / "req.rounds.csv")
    assert cols == list(s["rounds"][0])
    assert rows == [{k: _cell(v) for k, v in r.items()} for r in s["rounds"]]
    assert [int(r["round"]) for r in rows] == [1, 2, 3]


def test_replay_figures_are_pngs(run):
    d, s = run
    names = sorted(p.name for p in (d / "plots").iterdir())
    # round_bytes.png needs KV bytes in /metrics (kvtier's exporter, LMCache): the fake server has none
    assert names == sorted(set(REPLAY_FIGURES) - {"round_bytes.png"})
    for name in names:
        data = (d / "plots" / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 10_000, name
    # the CDF panels are drawn from the summary's histograms, which hold every completed request
    assert cdf_points(s["histograms"]["ttft_ms"])[2] == s["completed"]


@pytest.mark.slow
def test_figures_without_their_data_are_skipped_and_said(tmp_path, run, caplog):
    _, s = run
    flat = {k: v for k, v in s.items() if k != "rounds"}
    with caplog.at_level(logging.INFO, logger="kvtier.outputs"):
        paths = write_replay_plots(flat, iter(()), tmp_path)
    assert [p.rsplit("/", 1)[1] for p in paths] == ["latency_cdf.png"]
    assert "skipped timeline.png (no request was sent)" in caplog.text
    assert "skipped rounds.png (not a run in rounds)" in caplog.text


def test_tables_show_the_run_and_its_rounds(run):
    _, s = run
    console = Console(record=True, width=140)
    tables = replay_tables(s)
    for t in tables:
        console.print(t)
    text = console.export_text()
    # the fake server exports no kvtier tiers; its prompt tokens come from its own cache or are computed
    assert [t.title for t in tables] == [
        "kvtier replay",
        "per round",
        "prompt tokens by where they came from (server /metrics)",
    ]
    parts = s["server_metrics"]["prompt_tokens_by_tier"]
    assert set(parts) == {"vllm_prefix_cache", "recomputed"} and f"{sum(parts.values()):,} prompt tokens" in text
    assert f"completed {s['completed']}" in text and "TTFT p50 ms" in text
    assert f"{s['ttft_ms']['p50']:.2f}" in text and f"{s['rounds'][-1]['ttft_p50_ms']:.4f}" in text
