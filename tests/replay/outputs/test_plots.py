"""Figures: the expected PNGs, non-empty and real images; absent sections skip their figure and say so."""

import logging

import pytest

from replay.outputs import write_plots
from replay.outputs.plots import cdf_points

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
BASE = ["latency_cdf.png", "request_latency_cdf.png", "throughput.png", "tier_occupancy.png"]


def _check_pngs(paths):
    for p in paths:
        with open(p, "rb") as fh:
            data = fh.read()
        assert data.startswith(PNG_MAGIC) and len(data) > 10_000, p


@pytest.mark.slow
def test_base_figures_and_skips(tmp_path, sample_doc, caplog):
    del sample_doc["autoscaling_stats"], sample_doc["summary"]["qos_metrics"]
    with caplog.at_level(logging.INFO, logger="kvtier.outputs"):
        paths = write_plots(sample_doc, tmp_path / "plots")
    assert [p.rsplit("/", 1)[1] for p in paths] == BASE
    _check_pngs(paths)
    assert "skipped autoscaling.png (no autoscaling_stats" in caplog.text
    assert "skipped qos_latency.png (no qos_metrics" in caplog.text


@pytest.mark.slow
def test_qos_and_autoscaling_figures(tmp_path, full_doc):
    # the four others are drawn from the same sections as in the test above; only these two here (speed)
    paths = write_plots(full_doc, tmp_path, figures=("autoscaling.png", "qos_latency.png"))
    assert [p.rsplit("/", 1)[1] for p in paths] == ["autoscaling.png", "qos_latency.png"]
    _check_pngs(paths)
    with pytest.raises(ValueError, match="unknown figures"):
        write_plots(full_doc, tmp_path, figures=("nope.png",))


def test_old_document_without_histograms_or_timeline(tmp_path, sample_doc, caplog):
    for t in sample_doc["tiers"].values():
        for op in ("read", "write"):
            del t[op]["histograms"]
    del sample_doc["request_histograms"], sample_doc["timeline"]
    del sample_doc["autoscaling_stats"], sample_doc["summary"]["qos_metrics"]  # sections old runs did not have
    with caplog.at_level(logging.INFO, logger="kvtier.outputs"):
        assert write_plots(sample_doc, tmp_path) == []
    assert caplog.text.count("skipped") == 7  # rounds.png too: not a run in rounds


def test_cdf_points_follow_the_histogram(sample_doc):
    assert sample_doc["config"]["generation_mode"] == "none"  # so the generation histogram holds only zeros
    read = sample_doc["tiers"]["disk"]["read"]
    xs, ys, n = cdf_points(read["histograms"]["total"])
    assert n == read["ops"] and ys[-1] == 1.0
    assert xs == sorted(xs) and ys == sorted(ys)
    # the point where the CDF first reaches 50% is the histogram's p50
    assert next(x for x, y in zip(xs, ys) if y >= 0.5) == pytest.approx(read["latency_ms"]["p50"], rel=1e-3)
    assert cdf_points(sample_doc["request_histograms"]["generation"])[0] == []  # all zero: nothing to draw
