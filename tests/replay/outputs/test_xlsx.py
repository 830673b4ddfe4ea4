"""The workbook reopened with openpyxl: the sheets are there and hold the document's numbers."""

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


def test_sample_workbook_sheets_and_numbers(tmp_path, sample_doc):
    path = tmp_path / "out" / "run.xlsx"
    write_xlsx(sample_doc, str(path))
    wb = openpyxl.load_workbook(path)
    assert tuple(wb.sheetnames) == SHEETS
    s = sample_doc["summary"]

    summary = _kv(wb["summary"])
    assert summary["status"] == "completed"
    assert summary["requests completed"] == s["total_requests"]
    assert summary["tokens per second"] == pytest.approx(s["avg_throughput_tokens_per_sec"])
    assert summary["cache_hit_rate"] == s["cache_stats"]["cache_hit_rate"]
    lat = next(r for r in _rows(wb["summary"]) if r[0] == "end to end")
    header = next(r for r in _rows(wb["summary"]) if r[0] == "latency")
    assert dict(zip(header, lat))["p99"] == s["end_to_end_latency_ms"]["p99"]

    params = _kv(wb["run parameters"])
    assert params["num_users"] == 100 and params["io_mode"] == "direct"
    assert params["user_profiles.coding.context_tokens"] == "[4096, 25000]"  # nested config flattened, one key a row

    tiers = {(r["tier"], r["op"]): r for r in _table(wb["per-tier performance"])}
    assert set(tiers) == {("cpu", "read"), ("cpu", "write"), ("disk", "read"), ("disk", "write")}
    disk_read, src = tiers[("disk", "read")], sample_doc["tiers"]["disk"]["read"]
    assert disk_read["ops"] == src["ops"]
    assert disk_read["GB"] == pytest.approx(src["bytes"] / 1e9)
    assert disk_read["GB/s"] == pytest.approx(s["cache_stats"]["tier_storage_read_bandwidth_gbps"], abs=1e-4)
    assert disk_read["p99.9 ms"] == src["latency_ms"]["p999"]
    assert disk_read["device p99 ms"] == src["device_ms"]["p99"] and disk_read["host p50 ms"] == src["host_ms"]["p50"]
    assert disk_read["hits (tier)"] == 76 and tiers[("cpu", "write")]["demotions_out (tier)"] == 62

    # sections the sample lacks: the sheets are there and say so
    assert _rows(wb["QoS"])[1][0] == "no QoS classes in this run"
    assert _rows(wb["autoscaling"])[1][0] == "no autoscaling in this run"
    timeline = _table(wb["timeline"])
    assert len(timeline) == len(sample_doc["timeline"])
    assert timeline[-1]["disk used GB"] == pytest.approx(
        sample_doc["timeline"][-1]["tiers"]["disk"]["used_bytes"] / 1e9
    )
    assert not [f for f in os.listdir(path.parent) if f != "run.xlsx"]  # the temp file was renamed, none left


def test_qos_autoscaling_clients_sheets(tmp_path, full_doc):
    path = tmp_path / "run.xlsx"
    write_xlsx(full_doc, path)
    wb = openpyxl.load_workbook(path)
    qos = {r["class"]: r for r in _table(wb["QoS"])}
    assert list(qos) == ["interactive", "standard", "batch"]  # highest priority first
    for name, c in full_doc["summary"]["qos_metrics"].items():
        row = qos[name]
        assert row["requests"] == c["requests"] and row["priority"] == c["priority"]
        assert row["service p95 ms"] == c["service_latency_ms"]["p95"]
        assert row["e2e p99 ms"] == c["end_to_end_latency_ms"]["p99"]
        assert row["target p99 ms"] == c["sla"]["target_p99_ms"]
        assert row["SLA"] == ("met" if c["sla"]["met"] else "missed")
    steps = _table(wb["autoscaling"])
    assert [r["users"] for r in steps] == [s["users"] for s in full_doc["autoscaling_stats"]]
    assert (
        steps[7]["action"] == "peak_found"
        and steps[0]["throughput_tokens_per_sec"] == full_doc["autoscaling_stats"][0]["throughput_tokens_per_sec"]
    )
    assert [r["client"] for r in _table(wb["clients"])] == ["client-0", "client-1"]
    summary = _kv(wb["summary"])
    assert summary["bytes_saved_gb"] == 3.25 and summary["chunk_hits"] == 150  # prefix cache and RAG sections
    assert "users" in _table(wb["timeline"])[0]


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
