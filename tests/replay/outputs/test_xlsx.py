"""The workbook reopened with openpyxl: the sheets are there and hold the numbers of the bench run it came from."""

import json
import os

import openpyxl
import pytest

from replay.outputs import write_xlsx
from replay.outputs.xlsx import SHEETS


def _rows(ws):
    return [list(r) for r in ws.iter_rows(values_only=True)]


def _table(ws):
    rows = _rows(ws)
    return [dict(zip(rows[0], r)) for r in rows[1:]]


def _kv(ws):
    return {r[0]: r[1] for r in _rows(ws) if r[0] is not None}


def _section(ws, title):
    """The metric/value rows under a bold section title of the summary sheet, up to the next blank row."""
    rows = _rows(ws)
    start = next(i for i, r in enumerate(rows) if r[0] == title) + 1
    out = {}
    for r in rows[start:]:
        if r[0] is None:
            break
        out[r[0]] = r[1]
    return out


def test_workbook_sheets_and_numbers(tmp_path, sample_doc):
    path = tmp_path / "out" / "run.xlsx"
    write_xlsx(sample_doc, str(path))
    wb = openpyxl.load_workbook(path)
    assert tuple(wb.sheetnames) == SHEETS
    s = sample_doc["summary"]

    summary = _kv(wb["summary"])
    assert summary["status"] == sample_doc["status"] == "completed"
    assert summary["requests completed"] == s["total_requests"] > 0
    assert summary["tokens per second"] == pytest.approx(s["avg_throughput_tokens_per_sec"])
    assert summary["elapsed"] == s["elapsed_time"]
    lat = next(r for r in _rows(wb["summary"]) if r[0] == "end to end")
    header = next(r for r in _rows(wb["summary"]) if r[0] == "latency")
    assert dict(zip(header, lat))["p99"] == s["end_to_end_latency_ms"]["p99"]
    # every other summary section, key by key
    assert _section(wb["summary"], "cache_stats")["cache_hit_rate"] == s["cache_stats"]["cache_hit_rate"]
    assert _section(wb["summary"], "prefix_cache_stats")["bytes_saved_gb"] == s["prefix_cache_stats"]["bytes_saved_gb"]
    rag = _section(wb["summary"], "rag_stats")
    assert rag["queries"] == s["rag_stats"]["queries"] > 0
    assert rag["burst_latency_ms.p99"] == s["rag_stats"]["burst_latency_ms"]["p99"]
    blk = _section(wb["summary"], "block_device (whole device, the run's window)")
    assert blk["read_bytes"] == sample_doc["block_device"]["read_bytes"]

    params = _kv(wb["run parameters"])
    cfg = sample_doc["config"]
    assert params["num_users"] == cfg["num_users"] and params["io_mode"] == cfg["io_mode"]
    # nested config flattened, one key a row; lists as JSON text
    ctx = cfg["user_templates"]["coding"]["context_tokens"]
    assert json.loads(params["user_templates.coding.context_tokens"]) == ctx
    assert params["autoscaler.interval_s"] == cfg["autoscaler"]["interval_s"]

    tiers = {(r["tier"], r["op"]): r for r in _table(wb["per-tier performance"])}
    assert set(tiers) == {(t, op) for t in sample_doc["tiers"] for op in ("read", "write")}
    disk_read, src = tiers[("disk", "read")], sample_doc["tiers"]["disk"]["read"]
    assert disk_read["ops"] == src["ops"] > 0
    assert disk_read["GB"] == pytest.approx(src["bytes"] / 1e9)
    assert disk_read["GB/s"] == pytest.approx(s["cache_stats"]["tier_storage_read_bandwidth_gbps"], abs=1e-4)
    assert disk_read["p999 ms"] == src["latency_ms"]["p999"]
    assert disk_read["device p99 ms"] == src["device_ms"]["p99"] and disk_read["host p50 ms"] == src["host_ms"]["p50"]
    events = sample_doc["tiers"]
    assert disk_read["hits (tier)"] == events["disk"]["events"]["hits"]
    assert tiers[("cpu", "write")]["demotions_out (tier)"] == events["cpu"]["events"]["demotions_out"] > 0

    qos = {r["class"]: r for r in _table(wb["QoS"])}
    classes = sample_doc["summary"]["qos_metrics"]
    assert list(qos) == sorted(classes, key=lambda c: -classes[c]["priority"])  # highest priority first
    for name, c in classes.items():
        row = qos[name]
        assert row["requests"] == c["requests"] and row["priority"] == c["priority"]
        assert row["service p95 ms"] == c["service_latency_ms"]["p95"]
        assert row["e2e p99 ms"] == c["end_to_end_latency_ms"]["p99"]
        assert row["target p99 ms"] == c["sla"]["target_p99_ms"]
        assert row["SLA"] == c["sla"]["verdict"]
    assert {r["SLA"] for r in qos.values()} == {"met", "missed"}  # the fixture's targets give both

    steps = _table(wb["autoscaling"])
    src_steps = sample_doc["autoscaling_stats"]
    assert len(steps) == len(src_steps) >= 2
    assert [r["users"] for r in steps] == [st["users"] for st in src_steps]
    assert [r["action"] for r in steps] == [st["action"] for st in src_steps]
    assert steps[0]["throughput_tokens_per_sec"] == src_steps[0]["throughput_tokens_per_sec"]

    timeline = _table(wb["timeline"])
    src_tl = sample_doc["timeline"]
    assert len(timeline) == len(src_tl) > 0
    assert [r["users"] for r in timeline] == [t["users"] for t in src_tl]
    assert timeline[-1]["disk used GB"] == pytest.approx(src_tl[-1]["tiers"]["disk"]["used_bytes"] / 1e9)
    assert _rows(wb["clients"])[1][0] == "single-client run"
    assert not [f for f in os.listdir(path.parent) if f != "run.xlsx"]  # the temp file was renamed, none left


def test_sections_a_run_lacks_say_so(tmp_path, sample_doc):
    del sample_doc["summary"]["qos_metrics"], sample_doc["autoscaling_stats"]
    write_xlsx(sample_doc, tmp_path / "run.xlsx")
    wb = openpyxl.load_workbook(tmp_path / "run.xlsx")
    assert _rows(wb["QoS"])[1][0] == "no QoS classes in this run"
    assert _rows(wb["autoscaling"])[1][0] == "no autoscaling in this run"


@pytest.mark.slow
def test_clients_sheet(tmp_path, full_doc):
    write_xlsx(full_doc, tmp_path / "run.xlsx")
    wb = openpyxl.load_workbook(tmp_path / "run.xlsx")
    rows = _table(wb["clients"])
    assert [r["client"] for r in rows] == list(range(len(full_doc["clients"]))) == [0, 1]  # clients name no id
    for row, c in zip(rows, full_doc["clients"]):
        assert row["requests"] == c["summary"]["total_requests"] > 0
        assert row["e2e p99 ms"] == c["summary"]["end_to_end_latency_ms"]["p99"]
    assert sum(r["requests"] for r in rows) == _kv(wb["summary"])["requests completed"]


def test_minimal_document(tmp_path):
    """An old or cut-short file with almost nothing in it still gives a workbook."""
    write_xlsx({"status": "interrupted", "summary": {"elapsed_time": 0.0}}, tmp_path / "r.xlsx")
    wb = openpyxl.load_workbook(tmp_path / "r.xlsx")
    assert _kv(wb["summary"])["status"] == "interrupted"
    assert _rows(wb["per-tier performance"])[1][0] == "no tiers in this results file"


def test_failed_write_leaves_no_file(tmp_path, sample_doc, monkeypatch):
    import openpyxl.workbook.workbook as wbmod

    def boom(self, filename):
        open(filename, "wb").write(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(wbmod.Workbook, "save", boom)
    with pytest.raises(OSError):
        write_xlsx(sample_doc, tmp_path / "r.xlsx")
    assert os.listdir(tmp_path) == []
