"""Every key of `kvtier bench`'s configuration changes what the run does: one probe per key, and a check that no key
is left without one (the MLPerf reference silently ignores several of its config keys; we must not)."""

import csv
import os

import pytest
from bench_helpers import FAST_TEMPLATES, prepared, run
from pydantic import BaseModel
from test_bench_modes import write_burstgpt, write_sharegpt

from kvconnector.errors import ConfigError
from replay.synthetic.autoscaler import Autoscaler
from replay.synthetic.config import AutoscalerConfig, BenchConfig
from replay.synthetic.driver import SyntheticDriver


def all_keys() -> set[str]:
    keys = set()
    for name, field in BenchConfig.model_fields.items():
        default = field.get_default(call_default_factory=True)
        if isinstance(default, BaseModel):
            keys |= {f"{name}.{sub}" for sub in type(default).model_fields}
        else:
            keys.add(name)
    return keys


def sessions(bench, n=40):
    users = [bench.workload.new_user(i) for i in range(4)]
    out = []
    for i in range(n):
        s = bench.workload.next_session(users[i % 4])
        if s is None:
            break
        out.append(s)
    return out


def turns(bench, n=40):
    return [t for s in sessions(bench, n) for t in s.conversation.turns]


PROBES = {}


def probe(key):
    """Register the function as the probe of config key `key` (section keys as `section.key`)."""

    def register(fn):
        PROBES[key] = fn
        return fn

    return register


# ---- probes that need no I/O: the key reaches the component whose behaviour the other tests prove -----------------
@probe("model")
def p_model(tmp):
    assert prepared(tmp, model="tiny-1b").bytes_per_token == 24_576


@probe("kv_dtype")
def p_kv_dtype(tmp):
    assert prepared(tmp, kv_dtype="fp8").bytes_per_token * 2 == prepared(tmp).bytes_per_token


@probe("model_configs")
def p_model_configs(tmp):
    assert (
        prepared(tmp, model_configs={"small": {"num_layers": 8, "kv_heads": 2, "head_dim": 64}}).bytes_per_token == 4096
    )


@probe("gpu_mem_gb")
def p_gpu_mem_gb(tmp):
    from kvconnector.tiers import cuda_torch

    if cuda_torch() is None:
        with pytest.raises(ConfigError, match="CUDA"):
            prepared(tmp, gpu_mem_gb=1)
    else:
        assert prepared(tmp, gpu_mem_gb=1).tiers[0].kind == "gpu"


@probe("cpu_mem_gb")
def p_cpu_mem_gb(tmp):
    assert prepared(tmp, cpu_mem_gb=0.5).tiers[0].capacity_bytes == 500_000_000
    assert [t.kind for t in prepared(tmp, cpu_mem_gb=0).tiers] == ["disk"]


@probe("cache_dir")
def p_cache_dir(tmp):
    b = prepared(tmp, cache_dir=str(tmp / "elsewhere"))
    assert b.run_dir.startswith(str(tmp / "elsewhere"))


@probe("storage_capacity_gb")
def p_storage_capacity_gb(tmp):
    assert prepared(tmp, storage_capacity_gb=0.3).tiers[-1].capacity_bytes == 300_000_000


@probe("io_mode")
def p_io_mode(tmp):
    assert prepared(tmp, io_mode="buffered").tiers[-1].io_mode.value == "buffered"


@probe("promote_on_hit")
def p_promote_on_hit(tmp):
    assert prepared(tmp, promote_on_hit=True).store.promote_on_hit  # behaviour: test_store.py


@probe("eviction.target_usage_ratio")
def p_eviction_target_usage_ratio(tmp):
    assert prepared(tmp, eviction={"target_usage_ratio": 0.5}).store.target_usage_ratio == 0.5  # behaviour: test_store


@probe("eviction.large_entry_limit_ratio")
def p_eviction_large_entry_limit_ratio(tmp):
    assert prepared(tmp, eviction={"large_entry_limit_ratio": 0.5}).store.large_entry_limit_ratio == 0.5


@probe("seed")
def p_seed(tmp):
    a = [t.input_tokens for t in turns(prepared(tmp, seed=1))]
    assert (
        a
        == [t.input_tokens for t in turns(prepared(tmp, seed=1))]
        != [t.input_tokens for t in turns(prepared(tmp, seed=2))]
    )


@probe("user_templates")
def p_user_templates(tmp):
    tpl = {"only": {"context_tokens": [7, 7], "generate_tokens": [3, 3], "think_time_s": [0, 0]}}
    ts = turns(prepared(tmp, user_templates=tpl))
    assert {(t.input_tokens, t.output_tokens) for t in ts} == {(7, 3)}


@probe("qos_distribution")
def p_qos_distribution(tmp):
    b = prepared(tmp, qos_distribution={"batch": 1.0})
    assert {b.workload.new_user(i).qos for i in range(20)} == {"batch"}


@probe("conversation.end_probability")
def p_conversation_end_probability(tmp):
    assert {len(s.conversation.turns) for s in sessions(prepared(tmp, conversation={"end_probability": 1.0}))} == {1}


@probe("conversation.max_turns")
def p_conversation_max_turns(tmp):
    b = prepared(tmp, conversation={"end_probability": 0.0, "max_turns": 3})
    assert {len(s.conversation.turns) for s in sessions(b)} == {3}


@probe("disable_multi_turn")
def p_disable_multi_turn(tmp):
    b = prepared(tmp, disable_multi_turn=True, conversation={"end_probability": 0.0})
    assert {len(s.conversation.turns) for s in sessions(b)} == {1}


@probe("disable_prefix_caching")
def p_disable_prefix_caching(tmp):
    assert {s.system_prompt for s in sessions(prepared(tmp, disable_prefix_caching=True))} == {None}


@probe("prefix_cache.probability")
def p_prefix_cache_probability(tmp):
    assert {s.system_prompt for s in sessions(prepared(tmp, prefix_cache={"probability": 0.0}))} == {None}
    assert None not in {s.system_prompt for s in sessions(prepared(tmp, prefix_cache={"probability": 1.0}))}


@probe("prefix_cache.system_prompts")
def p_prefix_cache_system_prompts(tmp):
    b = prepared(tmp, prefix_cache={"probability": 1.0, "system_prompts": [{"text": "x", "tokens": 5}]})
    assert {s.system_prompt for s in sessions(b)} == {0}


@probe("dataset_path")
def p_dataset_path(tmp):
    b = prepared(tmp, dataset_path=str(write_sharegpt(tmp / "sg.json", n=4)))
    assert b.workload.kind == "sharegpt" and len(b.workload.conversations) == 3


@probe("max_conversations")
def p_max_conversations(tmp):
    b = prepared(tmp, dataset_path=str(write_sharegpt(tmp / "sg.json", n=4)), max_conversations=2)
    assert len(b.workload.conversations) == 2


@probe("sharegpt.min_turns")
def p_sharegpt_min_turns(tmp):
    with pytest.raises(ConfigError, match="no usable"):  # no conversation has 4 turns
        prepared(tmp, dataset_path=str(write_sharegpt(tmp / "sg.json", n=4)), sharegpt={"min_turns": 4})


@probe("sharegpt.max_turn_tokens")
def p_sharegpt_max_turn_tokens(tmp):
    with pytest.raises(ConfigError, match="no usable"):
        prepared(tmp, dataset_path=str(write_sharegpt(tmp / "sg.json", n=4)), sharegpt={"max_turn_tokens": 5})


@probe("use_burst_trace")
def p_use_burst_trace(tmp):
    b = prepared(tmp, use_burst_trace=True, burst_trace_path=str(write_burstgpt(tmp / "t.csv")))
    assert b.workload.kind == "burstgpt" and len(b.workload.conversations) == 4


PROBES["burst_trace_path"] = p_use_burst_trace


@probe("trace_speedup")
def p_trace_speedup(tmp):
    trace = str(write_burstgpt(tmp / "t.csv"))
    assert prepared(tmp, use_burst_trace=True, burst_trace_path=trace, trace_speedup=2).workload.timed
    assert not prepared(tmp, use_burst_trace=True, burst_trace_path=trace, trace_speedup=0).workload.timed


@probe("max_context_tokens")
def p_max_context_tokens(tmp):
    tpl = {"t": {"context_tokens": [500, 500], "generate_tokens": [1, 1], "think_time_s": [0, 0]}}
    s = run(tmp, max_context_tokens=100, user_templates=tpl, duration=1, disable_prefix_caching=True)["summary"]
    assert s["prompt_tokens"] == 100 * s["total_requests"] > 0


@probe("random_buffer_mb")
def p_random_buffer_mb(tmp):
    assert prepared(tmp, random_buffer_mb=32).payload.size == 32 << 20


@probe("io_workers")
def p_io_workers(tmp):
    b = prepared(tmp, io_workers=3)
    d = SyntheticDriver(b.cfg, b.store, b.bytes_per_token, b.workload, b.payload, 1)
    import asyncio

    async def pool_size():
        from replay.synthetic.executor import PriorityExecutor

        d._pool = PriorityExecutor(b.cfg.io_workers)
        n = d._pool.workers
        d._pool.shutdown()
        return n

    assert asyncio.run(pool_size()) == 3


def _scaler(**kw):
    return Autoscaler(AutoscalerConfig(**kw), "qos", 0.8)


@probe("autoscaler.min_users")
def p_autoscaler_min_users(tmp):
    assert _scaler(min_users=5).decide(0, 6, 0, 1.0, []).users == 5


@probe("autoscaler.max_users")
def p_autoscaler_max_users(tmp):
    assert _scaler(max_users=7).decide(0, 6, 0, 0.0, []).users == 7


@probe("autoscaler.scale_up_factor")
def p_autoscaler_scale_up_factor(tmp):
    assert _scaler(scale_up_factor=3).decide(0, 10, 0, 0.0, []).users == 30


@probe("autoscaler.scale_down_factor")
def p_autoscaler_scale_down_factor(tmp):
    assert _scaler(scale_down_factor=0.5).decide(0, 10, 0, 1.0, []).users == 5


@probe("autoscaler.cooldown_s")
def p_autoscaler_cooldown_s(tmp):
    a = _scaler(cooldown_s=0)
    a.decide(0, 10, 0, 1.0, [])
    assert a.decide(0.1, 8, 0, 1.0, []).action == "scale_down"


@probe("autoscaler.band")
def p_autoscaler_band(tmp):
    assert _scaler(band=0.5).decide(0, 10, 0, 0.4, []).action == "hold"
    assert _scaler(band=0.1).decide(0, 10, 0, 0.4, []).action == "scale_up"


@probe("target_saturation")
def p_target_saturation(tmp):
    assert Autoscaler(AutoscalerConfig(), "qos", 0.3).decide(0, 10, 0, 0.5, []).action == "scale_down"


@probe("autoscaler_mode")
def p_autoscaler_mode(tmp):
    assert Autoscaler(AutoscalerConfig(), "capacity", 0.8).decide(0, 10, 5, 1.0, []).action == "scale_up"


def _capacity(**kw):
    a = Autoscaler(AutoscalerConfig(**kw), "capacity", 0.8)
    a.decide(0, 10, 100, 0, [])
    return a


@probe("autoscaler.ramp_factor")
def p_autoscaler_ramp_factor(tmp):
    assert _capacity(ramp_factor=4).decide(1, 10, 200, 0, []).users == 40


@probe("autoscaler.fine_factor")
def p_autoscaler_fine_factor(tmp):
    assert _capacity(fine_factor=1.1).decide(1, 10, 105, 0, []).users == 11


@probe("autoscaler.fast_growth")
def p_autoscaler_fast_growth(tmp):
    assert _capacity(fast_growth=0.01).decide(1, 10, 105, 0, []).users == 20


# ---- probes that run the benchmark briefly -------------------------------------------------------------------------
@probe("duration")
def p_duration(tmp):
    assert 1.0 <= run(tmp, duration=1.0)["summary"]["elapsed_time"] < 2.5


@probe("num_users")
def p_num_users(tmp):
    doc = run(tmp, num_users=3, duration=1)
    assert max(s["users"] for s in doc["timeline"]) == 3


@probe("max_requests")
def p_max_requests(tmp):
    assert run(tmp, max_requests=3, num_users=1, duration=20)["summary"]["total_requests"] == 3


@probe("request_rate")
def p_request_rate(tmp):
    s = run(tmp, request_rate=4, duration=2)["summary"]
    assert s["total_requests"] <= 4 * 2 + 1


@probe("generation_mode")
def p_generation_mode(tmp):
    s = run(
        tmp,
        generation_mode="fast",
        duration=1.5,
        user_templates={"t": {**FAST_TEMPLATES["chatbot"], "generate_tokens": [20, 20]}},
    )
    assert s_p50(s, "generation_latency_ms") >= 20 * 2 * 0.9


def s_p50(summary, key):
    return (summary["summary"] if "summary" in summary else summary)[key]["p50"]


@probe("generation.ms_per_token")
def p_generation_ms_per_token(tmp):
    doc = run(
        tmp,
        generation_mode="fast",
        generation={"ms_per_token": {"none": 0, "fast": 5, "realistic": 30}},
        duration=1.5,
        user_templates={"t": {**FAST_TEMPLATES["chatbot"], "generate_tokens": [20, 20]}},
    )
    assert s_p50(doc, "generation_latency_ms") >= 20 * 5 * 0.9


@probe("decode.batch_size")
def p_decode_batch_size(tmp):
    doc = run(
        tmp,
        decode={"batch_size": 4},
        duration=1.5,
        user_templates={"t": {**FAST_TEMPLATES["chatbot"], "generate_tokens": [20, 20]}},
    )
    d = doc["summary"]["decode_stats"]
    assert d["reads"] == 5 * doc["summary"]["total_requests"]


@probe("performance_profile")
def p_performance_profile(tmp):
    slow = {"t": {**FAST_TEMPLATES["chatbot"], "think_time_s": [0.3, 0.3]}}
    lat = run(tmp, duration=1.5, num_users=2, user_templates=slow)["summary"]["total_requests"]
    thr = run(tmp, performance_profile="throughput", duration=1.5, num_users=2, user_templates=slow)["summary"][
        "total_requests"
    ]
    assert thr > 2 * lat


@probe("prefill_only")
def p_prefill_only(tmp):
    assert run(tmp, prefill_only=True, duration=1)["summary"]["decode_stats"]["reads"] == 0


@probe("decode_only")
def p_decode_only(tmp):
    assert run(tmp, decode_only=True, num_users=2, duration=1)["setup"]["prepopulated_entries"] == 20


@probe("enable_rag")
def p_enable_rag(tmp):
    assert run(tmp, enable_rag=True, duration=1)["summary"]["rag_stats"]["queries"] > 0


@probe("rag_num_docs")
def p_rag_num_docs(tmp):
    assert run(tmp, enable_rag=True, rag_num_docs=3, duration=0.5)["setup"]["rag_ingest"]["documents"] == 3


@probe("rag.chunks_per_doc")
def p_rag_chunks_per_doc(tmp):
    assert (
        run(tmp, enable_rag=True, rag={"chunks_per_doc": 2}, rag_num_docs=3, duration=0.5)["setup"]["rag_ingest"][
            "chunks"
        ]
        == 6
    )


@probe("rag.chunk_tokens")
def p_rag_chunk_tokens(tmp):
    assert (
        run(tmp, enable_rag=True, rag={"chunk_tokens": 10}, duration=0.5)["setup"]["rag_ingest"]["chunk_bytes"]
        == 10 * 2048
    )


@probe("rag.top_k")
def p_rag_top_k(tmp):
    r = run(tmp, enable_rag=True, rag={"top_k": 1, "probability": 1.0}, duration=1)["summary"]["rag_stats"]
    assert r["chunk_reads"] == r["queries"] > 0


@probe("rag.probability")
def p_rag_probability(tmp):
    assert run(tmp, enable_rag=True, rag={"probability": 0.0}, duration=1)["summary"]["rag_stats"]["queries"] == 0


@probe("enable_autoscaling")
def p_enable_autoscaling(tmp):
    assert run(tmp, enable_autoscaling=True, autoscaler={"interval_s": 0.3}, duration=1.2)["autoscaling_stats"]


@probe("autoscaler.interval_s")
def p_autoscaler_interval_s(tmp):
    steps = run(tmp, enable_autoscaling=True, autoscaler={"interval_s": 0.25}, duration=1.2)["autoscaling_stats"]
    assert len(steps) >= 3


@probe("replay_cycles")
def p_replay_cycles(tmp):
    doc = run(tmp, dataset_path=str(write_sharegpt(tmp / "sg.json")), replay_cycles=2, duration=20)
    assert doc["summary"]["total_requests"] == 12


@probe("qos_profiles")
def p_qos_profiles(tmp):
    q = run(
        tmp,
        qos_profiles={"interactive": {"priority": 9, "target_p95_ms": 1, "target_p99_ms": 2}},
        qos_distribution={"interactive": 1.0},
        duration=1,
    )["summary"]["qos_metrics"]
    assert q["interactive"]["priority"] == 9 and q["interactive"]["sla"]["target_p95_ms"] == 1


@probe("qos_scheduler")
def p_qos_scheduler(tmp):
    from test_qos import saturated_run

    def batch_requests(sched):
        return saturated_run(tmp, qos_scheduler=sched, duration=2)["summary"]["qos_metrics"]["batch"]["requests"]

    assert batch_requests("strict") == 0 < batch_requests("fair")  # strict priority starves it; fair shares


@probe("max_concurrent_allocs")
def p_max_concurrent_allocs(tmp):
    free = run(tmp, num_users=6, duration=1.5, performance_profile="throughput")
    one = run(tmp, num_users=6, duration=1.5, performance_profile="throughput", max_concurrent_allocs=1)
    assert s_p50(one, "queue_wait_latency_ms") > 3 * s_p50(free, "queue_wait_latency_ms")


@probe("precondition")
def p_precondition(tmp):
    assert run(tmp, precondition=True, precondition_size_gb=0.02, duration=0.5)["setup"]["precondition"]["bytes"] > 0


@probe("precondition_size_gb")
def p_precondition_size_gb(tmp):
    pc = run(tmp, precondition=True, precondition_size_gb=0.03, duration=0.5)["setup"]["precondition"]
    assert 0.029e9 <= pc["bytes"] <= 0.031e9


@probe("precondition_threads")
def p_precondition_threads(tmp):
    assert (
        run(tmp, precondition=True, precondition_size_gb=0.01, precondition_threads=3, duration=0.5)["setup"][
            "precondition"
        ]["threads"]
        == 3
    )


@probe("num_clients")
def p_num_clients(tmp):
    assert len(run(tmp, num_clients=2, duration=1)["clients"]) == 2


@probe("output")
def p_output(tmp):
    run(tmp, duration=0.5)
    assert (tmp / "out.json").exists()  # the helper points `output` there


@probe("xlsx_output")
def p_xlsx_output(tmp):
    run(tmp, duration=0.5, xlsx_output=str(tmp / "r.xlsx"))
    assert (tmp / "r.xlsx").stat().st_size > 0


@probe("csv_output")
def p_csv_output(tmp):
    run(tmp, duration=0.5, csv_output=str(tmp / "r.csv"))
    assert len(list(csv.reader(open(tmp / "r.csv")))) > 10


@probe("io_trace_log")
def p_io_trace_log(tmp):
    doc = run(tmp, duration=0.5, io_trace_log=str(tmp / "ops.csv"))
    rows = list(csv.reader(open(tmp / "ops.csv")))
    ops = sum(t["read"]["ops"] + t["write"]["ops"] for t in doc["tiers"].values())
    assert len([r for r in rows[1:] if r[1] in ("read", "write")]) == ops


@probe("plots")
def p_plots(tmp):
    run(tmp, duration=0.5, plots=str(tmp / "plots"))
    assert any(f.endswith(".png") for f in os.listdir(tmp / "plots"))


@probe("enable_latency_tracing")
def p_enable_latency_tracing(tmp):
    import shutil

    if os.geteuid() != 0 or not shutil.which("bpftrace"):
        from bench_helpers import write_config

        from replay.synthetic.cli import main

        assert main(["--config", write_config(tmp, duration=0.5, enable_latency_tracing=True)]) == 2
        return
    doc = run(tmp, duration=1.5, enable_latency_tracing=True, cpu_mem_gb=0)
    lt = doc["latency_tracing"]
    assert "block" in lt["layers_on"] and lt["histograms"]
    assert lt["fio_job"] and "bssplit=" in lt["fio_job"] and (tmp / "out-trace" / "job.fio").exists()


@probe("keep_cache")
def p_keep_cache(tmp):
    run(tmp, duration=0.5, keep_cache=True)
    assert os.listdir(tmp / "cache")


@probe("progress")
def p_progress(tmp):
    pass  # checked in test_config_key_changes_behaviour, which has the captured stderr


def test_every_config_key_has_a_probe():
    assert all_keys() - set(PROBES) == set()


@pytest.mark.slow
@pytest.mark.parametrize("key", sorted(all_keys()))
def test_config_key_changes_behaviour(key, tmp_path, capfd):
    if key == "progress":
        run(tmp_path, duration=0.7, progress=False)
        assert "requests" not in capfd.readouterr().err
        run(tmp_path, duration=0.7, progress=True)
        assert "requests" in capfd.readouterr().err
        return
    PROBES[key](tmp_path)


def test_unknown_keys_are_errors(tmp_path):
    with pytest.raises(ConfigError, match="num_userz: Extra inputs are not permitted"):
        prepared(tmp_path, num_userz=3)
    with pytest.raises(ConfigError, match="rag.top_kk"):
        prepared(tmp_path, rag={"top_kk": 3})
