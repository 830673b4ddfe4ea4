import random

from kvconnector.histogram import LatencyHistogram


def test_percentiles_match_sorted_samples_within_hdr_precision():
    rng = random.Random(1)
    samples = [rng.lognormvariate(13, 1.0) for _ in range(20_000)]  # ~0.4 ms median, long tail
    hist = LatencyHistogram()
    for s in samples:
        hist.record_ns(int(s))
    samples.sort()
    for pct in (50, 95, 99, 99.9):
        exact = samples[min(len(samples) - 1, int(len(samples) * pct / 100))] / 1e6
        assert abs(hist.percentile_ms(pct) - exact) <= exact * 0.01 + 1e-6


def test_merge_of_parts_equals_pooled_histogram_and_survives_encoding():
    rng = random.Random(2)
    parts = [[rng.randint(1_000, 50_000_000 * (i + 1)) for _ in range(3_000)] for i in range(3)]
    pooled, merged = LatencyHistogram(), LatencyHistogram()
    for part in parts:
        h = LatencyHistogram()
        for v in part:
            h.record_ns(v)
            pooled.record_ns(v)
        merged.merge(LatencyHistogram.decode(h.encode()))
    assert merged.count == pooled.count == 9_000
    for pct in (50, 99, 99.9):
        assert merged.percentile_ms(pct) == pooled.percentile_ms(pct)


def test_summary_keys_and_empty_histogram():
    empty = LatencyHistogram().summary_ms()
    assert empty["count"] == 0 and empty["p99"] == 0.0 and empty["p999"] == 0.0
    h = LatencyHistogram()
    h.record_ns(0)  # clamped, still counted
    assert h.count == 1


def test_recorded_buckets_are_hdrh_recorded_iterator():
    from hdrh.histogram import HdrHistogram

    rng = random.Random(3)
    values = [rng.randint(1, 10**10) for _ in range(2_000)] + [1, 1, 7]
    h, ref = LatencyHistogram(), HdrHistogram(1, 3_600 * 1_000_000_000, 3)
    for v in values:
        h.record_ns(v)
        ref.record_value(v)
    high_ns, counts = h.recorded_buckets()
    expected = [(it.value_iterated_to, it.count_at_value_iterated_to) for it in ref.get_recorded_iterator()]
    assert list(zip(high_ns.tolist(), counts.tolist())) == expected
    assert h.max_ns == ref.get_max_value() and LatencyHistogram().max_ns == 0
