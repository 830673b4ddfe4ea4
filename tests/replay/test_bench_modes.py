"""Every workload source and mode of `kvtier bench`, on small files the tests write."""

import json
import subprocess
import sys

import pytest
from bench_helpers import run, write_burstgpt, write_sharegpt

from kvconnector.histogram import LatencyHistogram
from replay.synthetic.autoscaler import Autoscaler
from replay.synthetic.config import AutoscalerConfig
from replay.synthetic.executor import PriorityExecutor

KVTIER = [sys.executable, "-m", "replay.cli", "bench"]


def test_sharegpt_replay_tolerates_truncation_and_reuses_previous_turns(tmp_path):
    data = write_sharegpt(tmp_path / "sg.json")
    doc = run(tmp_path, duration=20, dataset_path=str(data), replay_cycles=1)
    assert doc["_rc"] == 0
    rep = doc["workload"]["load_report"]
    assert doc["workload"]["source"] == "sharegpt" and rep["conversations"] == 2 and rep["skipped"]
    s = doc["summary"]
    # one cycle of 2 conversations x 3 turns, then the run ends by itself
    assert s["total_requests"] == 6 and s["elapsed_time"] < 15
    assert s["multi_turn_stats"]["previous_turn_hits"] == 4


@pytest.mark.parametrize("speedup", [0, 4])
def test_burstgpt_sessions_become_conversations_and_timestamps_are_honoured(tmp_path, speedup):
    trace = write_burstgpt(tmp_path / "trace.csv")
    doc = run(
        tmp_path, duration=30, use_burst_trace=True, burst_trace_path=str(trace), trace_speedup=speedup, replay_cycles=1
    )
    assert doc["_rc"] == 0, doc.get("error")
    s = doc["summary"]
    assert s["total_requests"] == 12  # the failed row is skipped
    assert doc["workload"]["load_report"]["skipped"].get("failed_request") == 1
    assert s["multi_turn_stats"]["previous_turn_hits"] == 8  # 4 sessions x 2 later turns reuse KV
    if speedup:
        # the trace spans 1.1 s; at 4x it takes about 0.3 s plus service time, never less
        assert doc["workload"]["timed"] and s["elapsed_time"] >= 1.1 / speedup


@pytest.mark.slow
def test_missing_trace_empty_glob_and_conflicting_flags_are_clear_errors(tmp_path):
    cases = [
        (["--use-burst-trace", "--burst-trace-path", str(tmp_path / "none.csv")], "not found"),
        (["--use-burst-trace", "--burst-trace-path", str(tmp_path / "*.csv")], "glob matches no file"),
        (["--use-burst-trace"], "--burst-trace-path"),
        (["--prefill-only", "--decode-only"], "exclude each other"),
        (["--dataset-path", str(tmp_path / "missing.json")], "missing.json"),
    ]
    for flags, needle in cases:
        p = subprocess.run(
            KVTIER + ["--no-progress", "--duration", "1", "--output", str(tmp_path / "x.json"), *flags],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert p.returncode == 2 and needle in p.stderr and "Traceback" not in p.stderr, (flags, p.stderr)
        assert not (tmp_path / "x.json").exists()
    bad = tmp_path / "bad.csv"
    bad.write_text("Timestamp,Model,Request tokens,Response tokens\n0.0,ChatGPT,abc,10\n")
    p = subprocess.run(
        KVTIER + ["--use-burst-trace", "--burst-trace-path", str(bad), "--duration", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2 and "bad.csv:2" in p.stderr


@pytest.mark.slow
def test_prefix_caching_hits_after_first_write_and_can_be_disabled(tmp_path):
    doc = run(tmp_path, duration=2, num_users=6, prefix_cache={"probability": 1.0})
    pc = doc["summary"]["prefix_cache_stats"]
    assert pc["misses"] >= 1 and pc["hits"] >= 1 and pc["bytes_saved_gb"] > 0
    assert pc["misses"] <= 3 + pc["hits"]  # three prompts, each written once unless evicted
    off = run(tmp_path, "--disable-prefix-caching", duration=1)["summary"]["prefix_cache_stats"]
    assert off["hits"] == off["misses"] == 0


@pytest.mark.slow
def test_rag_reads_top_k_chunks_as_a_burst_and_ingest_is_excluded(tmp_path):
    doc = run(
        tmp_path,
        "--enable-rag",
        "--rag-num-docs",
        "4",
        "--disable-prefix-caching",
        "--disable-multi-turn",
        duration=2,
        num_users=1,
        rag={"probability": 1.0, "top_k": 3, "chunks_per_doc": 2, "chunk_tokens": 64},
    )
    s = doc["summary"]
    rag = s["rag_stats"]
    assert doc["setup"]["rag_ingest"]["chunks"] == 8
    assert rag["queries"] > 0 and rag["queries"] <= rag["chunk_reads"] <= 3 * rag["queries"]
    # Every write of the run is a prefill (one per request; the single user may have one cut short by the window),
    # a demotion or a re-stored chunk: the 8 ingested chunks are not counted.
    writes = sum(t["write"]["ops"] for t in doc["tiers"].values())
    demotions = sum(t["events"].get("demotions_in", 0) for t in doc["tiers"].values())
    assert writes - (s["total_requests"] + demotions + rag["chunk_misses"]) in (0, 1)


@pytest.mark.slow
def test_prefill_only_and_decode_only(tmp_path):
    pre = run(tmp_path, "--prefill-only", duration=1.5)
    assert pre["summary"]["decode_stats"]["reads"] == 0 and pre["summary"]["total_requests"] > 0
    dec = run(tmp_path, "--decode-only", duration=1.5, num_users=3)
    assert dec["setup"]["prepopulated_entries"] == 30
    assert (
        sum(t["write"]["ops"] for t in dec["tiers"].values())
        == sum(t["events"].get("demotions_in", 0) for t in dec["tiers"].values())
        == 0
    )
    assert dec["summary"]["decode_stats"]["reads"] > 0


@pytest.mark.slow
def test_precondition_runs_first_and_is_not_counted(tmp_path):
    doc = run(tmp_path, "--precondition", "--precondition-size-gb", "0.05", "--precondition-threads", "2", duration=1)
    pc = doc["setup"]["precondition"]
    assert pc["bytes"] >= 0.049e9 and pc["threads"] == 2
    assert sum(t["write"]["bytes"] for t in doc["tiers"].values()) < pc["bytes"] or doc["summary"]["total_requests"] > 0


@pytest.mark.slow
def test_qos_classes_have_sla_verdicts(tmp_path):
    doc = run(
        tmp_path,
        duration=2,
        num_users=8,
        qos_profiles={
            "interactive": {"priority": 3, "target_p95_ms": 100000, "target_p99_ms": 100000},
            "responsive": {"priority": 2, "target_p95_ms": 100000, "target_p99_ms": 100000},
            "batch": {"priority": 1, "target_p95_ms": 0.001, "target_p99_ms": 0.001},
        },
        qos_distribution={"interactive": 0.5, "batch": 0.5},
    )
    q = doc["summary"]["qos_metrics"]
    assert set(q) == {"interactive", "batch"}
    assert q["interactive"]["sla"]["met"] and not q["batch"]["sla"]["met"]
    assert q["interactive"]["requests"] + q["batch"]["requests"] == doc["summary"]["total_requests"]


def test_priority_executor_runs_higher_class_first():
    import threading

    ex = PriorityExecutor(1)
    gate = threading.Event()
    order = []
    ex.submit((0, 0), gate.wait)  # occupies the only worker
    futs = [
        ex.submit(prio, order.append, name)
        for prio, name in [
            ((-1, 5), "batch-late"),
            ((-3, 9), "interactive"),
            ((-1, 1), "batch-early"),
            ((-2, 0), "responsive"),
        ]
    ]
    gate.set()
    for f in futs:
        f.result(timeout=5)
    ex.shutdown()
    assert order == ["interactive", "responsive", "batch-early", "batch-late"]


def test_autoscaler_qos_mode_holds_band_and_backs_off_on_sla_miss():
    a = Autoscaler(AutoscalerConfig(cooldown_s=10), "qos", 0.8)
    assert a.decide(0, 10, 100, 0.3, []).users == 12
    assert a.decide(5, 12, 100, 0.8, []).action == "hold"
    d = a.decide(6, 12, 100, 0.95, [])
    assert d.action == "scale_down" and d.users == 9
    assert a.decide(8, 9, 100, 0.1, []).reason == "cooldown"
    assert a.decide(20, 9, 100, 0.8, ["interactive"]).action == "scale_down"


def test_autoscaler_capacity_mode_finds_the_peak():
    a = Autoscaler(AutoscalerConfig(), "capacity", 0.8)
    assert a.decide(0, 2, 100, 0, []).users == 4  # first step ramps
    assert a.decide(1, 4, 190, 0, []).users == 8  # +90%: keep doubling
    assert a.decide(2, 8, 200, 0, []).users == 12  # +5%: fine steps of 1.5x
    d = a.decide(3, 12, 180, 0, [])
    assert d.action == "peak_found" and d.users == 8 and "Peak capacity found" in d.reason
    assert a.decide(4, 8, 200, 0, []).action == "hold"


@pytest.mark.slow
def test_autoscaling_really_starts_and_stops_users(tmp_path):
    doc = run(
        tmp_path,
        "--enable-autoscaling",
        "--autoscaler-mode",
        "capacity",
        duration=3,
        num_users=1,
        autoscaler={"interval_s": 0.5},
    )
    steps = doc["autoscaling_stats"]
    assert steps and steps[0]["action"] == "scale_up"
    users_seen = {s["users"] for s in doc["timeline"]}
    assert max(users_seen) > 1  # workers were really started
    assert doc["summary"]["autoscaling_summary"]["steps"] == len(steps)


@pytest.mark.slow
def test_multi_client_merges_histograms_not_percentiles(tmp_path):
    doc = run(tmp_path, "--num-clients", "2", duration=2, num_users=4)
    assert doc["_rc"] == 0 and doc["summary"]["num_clients"] == 2 and len(doc["clients"]) == 2
    pooled = LatencyHistogram()
    for c in doc["clients"]:
        pooled.merge(LatencyHistogram.decode(c["request_histograms"]["end_to_end"]))
    s = doc["summary"]
    assert s["total_requests"] == sum(c["summary"]["total_requests"] for c in doc["clients"]) == pooled.count
    for pct, key in ((50, "p50"), (99, "p99")):
        assert s["end_to_end_latency_ms"][key] == pytest.approx(pooled.percentile_ms(pct), rel=0.01)
    disk_bytes = sum(c["tiers"]["disk"]["write"]["bytes"] for c in doc["clients"])
    assert doc["tiers"]["disk"]["write"]["bytes"] == disk_bytes
    assert {c["config"]["cache_dir"] for c in doc["clients"]} == {
        str(tmp_path / "cache" / "client-0"),
        str(tmp_path / "cache" / "client-1"),
    }


@pytest.mark.slow
def test_multi_client_ctrl_c_reaches_every_client_and_partial_results_merge(tmp_path):
    import os
    import signal

    from bench_helpers import write_config
    from helpers import wait_for

    cfg = write_config(tmp_path, duration=60, num_users=4, num_clients=2)
    # TMPDIR: the parent's work folder, where each client rewrites its live snapshot (client-N.status), lands here
    env = dict(os.environ, TMPDIR=str(tmp_path))
    p = subprocess.Popen(KVTIER + ["--config", cfg], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    def both_clients_running() -> bool:
        assert p.poll() is None, p.communicate()[1]
        return len(list(tmp_path.glob("kvtier-clients-*/client-*.status"))) == 2

    wait_for(both_clients_running, timeout_s=120, what="a live snapshot from each of the two clients")
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["status"] == "interrupted" and len(doc["clients"]) == 2
    assert all(c["status"] == "interrupted" for c in doc["clients"])
    assert doc["summary"]["total_requests"] > 0 and doc["summary"]["elapsed_time"] < 30
