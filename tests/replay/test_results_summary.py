"""One summary for single and multi-client runs: `multiclient.merge` builds it with the same function over merged
request stats as `Bench.results` over live ones, so a merged document has the same shape as a client's, its counts
are the clients' sums, and one client merged alone is that client."""

import json

import pytest
from bench_helpers import run

from kvconnector import tiers as tiers_mod
from kvconnector.histogram import LatencyHistogram
from replay.synthetic.config import BenchConfig
from replay.synthetic.multiclient import merge

pytestmark = pytest.mark.slow  # two real bench runs


@pytest.fixture(scope="module")
def clients(tmp_path_factory):
    """Two real short runs (seeds 11 and 12) whose disk tier could not use O_DIRECT, each counting the fallback.
    The filesystem refusing O_DIRECT is simulated (the machine's filesystems accept it): `probe_direct` says no."""
    mp = pytest.MonkeyPatch()
    mp.setattr(tiers_mod, "probe_direct", lambda directory: False)
    try:
        docs = []
        for seed in (11, 12):
            d = run(tmp_path_factory.mktemp(f"client-{seed}"), seed=seed, io_mode="direct")
            assert d.pop("_rc") == 0
            docs.append(d)
    finally:
        mp.undo()
    return docs


def _merged(docs: list[dict]) -> dict:
    cfg = BenchConfig.model_validate(docs[0]["config"])
    return json.loads(json.dumps(merge(docs, cfg, None, None, None, 2.0)))  # as written to disk


# Maps keyed by data (profile and class names a seed happens to draw), not by the document's schema.
_DATA_KEYED = {"requests_by_profile", "qos_metrics"}


def _key_paths(obj, prefix="") -> set[str]:
    if not isinstance(obj, dict):
        return set()
    out = set()
    for k, v in obj.items():
        name = "*" if prefix.rstrip(".").rpartition(".")[2] in _DATA_KEYED else k
        out.add(f"{prefix}{name}")
        out |= _key_paths(v, f"{prefix}{name}.")
    return out


def test_fallbacks_of_clients_are_summed(clients):
    assert [c["fallbacks"] for c in clients] == [{"disk.o_direct_unavailable": 1}] * 2
    doc = _merged(clients)
    assert doc["fallbacks"] == {"disk.o_direct_unavailable": 2}
    assert doc["tiers"]["disk"]["fallbacks"] == {"o_direct_unavailable": 2}


def test_merged_summary_has_the_keys_of_a_single_run(clients):
    doc = _merged(clients)
    longest = max(clients, key=lambda c: c["summary"]["elapsed_time"])  # whose window the merged run reports
    assert _key_paths(doc["summary"]) == _key_paths(longest["summary"])
    assert set(doc) - {"clients"} == set(longest) - {"stop_signal"}
    assert doc["summary"]["num_clients"] == 2 and longest["summary"]["num_clients"] == 1


def test_merged_counts_are_the_clients_sums(clients):
    s = _merged(clients)["summary"]
    parts = [c["summary"] for c in clients]
    assert s["total_requests"] == sum(p["total_requests"] for p in parts)
    assert s["requests_by_profile"] == {
        k: sum(p["requests_by_profile"].get(k, 0) for p in parts) for k in s["requests_by_profile"]
    }
    assert s["multi_turn_stats"]["previous_turn_hits"] == sum(
        p["multi_turn_stats"]["previous_turn_hits"] for p in parts
    )
    assert s["prefix_cache_stats"]["hits"] == sum(p["prefix_cache_stats"]["hits"] for p in parts) > 0
    for name, q in s["qos_metrics"].items():
        assert q["requests"] == sum(p["qos_metrics"][name]["requests"] for p in parts)
    # every client is a process of its own: the merged process counters are their sums
    proc = _merged(clients)["process"]
    for k in ("read_bytes", "written_bytes"):
        assert proc[k] == sum(c["process"][k] for c in clients)
    assert proc["cpu_user_s"] == pytest.approx(sum(c["process"]["cpu_user_s"] for c in clients), abs=0.002)
    pooled = LatencyHistogram()
    for c in clients:
        pooled.merge(LatencyHistogram.decode(c["request_histograms"]["storage_io"]))
    assert s["storage_io_latency_ms"]["p99"] == pytest.approx(pooled.percentile_ms(99), abs=1e-4)  # summaries round


def _same(a, b, path=""):
    """Equal, numbers to 0.1% or one unit in the 4th decimal place (the merged path computes rates from the rounded
    elapsed time, and a rate rounded to 4 places may then land one unit off: 0.0910 against 0.0911)."""
    if isinstance(a, dict):
        assert set(a) == set(b), path
        for k in a:
            if k != "histograms":  # the same counts; re-encoded, the bytes may differ
                _same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (int, float)) and not isinstance(a, bool):
        assert b == pytest.approx(a, rel=1e-3, abs=1.5e-4), path
    else:
        assert a == b, path


def test_one_client_merged_alone_is_that_client(clients):
    c = clients[0]
    doc = _merged([c])
    summary = dict(doc["summary"], num_clients=1)
    _same(c["summary"], summary)
    assert doc["request_histograms"].keys() == c["request_histograms"].keys() >= {"rag_burst"}
