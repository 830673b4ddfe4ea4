"""Every key of `kvtier bench`'s configuration changes what the run does: one probe per key, and a check that no key
is left without one (the MLPerf reference silently ignores several of its config keys; we must not)."""

import csv
import json
import os
import threading

import pytest
from bench_helpers import FAST_TEMPLATES, chained_run, prepared, run, saturated_run, write_burstgpt, write_sharegpt
from pydantic import BaseModel

from kvconnector.errors import ConfigError
from replay.common.leftovers import KEPT_NAME
from replay.sources.block_traces import load_block_trace
from replay.synthetic.config import BenchConfig


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
NO_BENCH = set()  # probes that read the key's effect without running a bench: the fast tier's


def probe(key, runs_bench=True):
    """Register the function as the probe of config key `key` (section keys as `section.key`); `runs_bench=False`
    for a probe that only prepares a bench (sessions, turns, the loaded dataset)."""

    def register(fn):
        PROBES[key] = fn
        if not runs_bench:
            NO_BENCH.add(key)
        return fn

    return register


# ---- probes of the model and the tiers: each reads the key's effect on a short run --------------------------------
def written_per_token(tmp, **kw) -> float:
    """Bytes the run wrote per prompt token: one disk tier, no system prompt, and one user stopped by max_requests, so
    every byte written belongs to a counted request."""
    kw = {"cpu_mem_gb": 0, "disable_prefix_caching": True, "max_requests": 3, "num_users": 1, "duration": 20, **kw}
    doc = run(tmp, **kw)
    return doc["tiers"]["disk"]["write"]["bytes"] / doc["summary"]["prompt_tokens"]


@probe("model")
def p_model(tmp):
    assert written_per_token(tmp, model="tiny-1b") == 24_576


@probe("kv_dtype")
def p_kv_dtype(tmp):
    assert written_per_token(tmp, kv_dtype="fp8") == 1024  # half the small model's 2,048 B/token in bf16


@probe("model_configs")
def p_model_configs(tmp):
    assert written_per_token(tmp, model_configs={"small": {"num_layers": 8, "kv_heads": 2, "head_dim": 64}}) == 4096


@probe("gpu_mem_gb")
def p_gpu_mem_gb(tmp):
    from kvconnector.tiers import cuda_torch

    if cuda_torch() is None:  # the key asks for a GPU tier: without CUDA that is a one-line error, not a silent skip
        with pytest.raises(ConfigError, match="CUDA"):
            prepared(tmp, gpu_mem_gb=1)
    else:
        gpu = run(tmp, gpu_mem_gb=0.01, duration=0.5)["tiers"]["gpu"]
        assert gpu["capacity_bytes"] == 10_000_000 and gpu["write"]["ops"] > 0


@probe("cpu_mem_gb")
def p_cpu_mem_gb(tmp):
    cpu = run(tmp, cpu_mem_gb=0.01, duration=0.5)["tiers"]["cpu"]
    assert cpu["capacity_bytes"] == 10_000_000 and cpu["write"]["ops"] > 0 and cpu["used_bytes"] <= 10_000_000
    assert list(run(tmp, cpu_mem_gb=0, duration=0.5)["tiers"]) == ["disk"]  # 0: no CPU tier at all


@probe("cache_dir")
def p_cache_dir(tmp):
    run(tmp, cache_dir=str(tmp / "elsewhere"), keep_cache=True, duration=0.5)
    (run_dir,) = os.listdir(tmp / "elsewhere")
    assert os.listdir(tmp / "elsewhere" / run_dir) and not (tmp / "cache").exists()


@probe("storage_capacity_gb")
def p_storage_capacity_gb(tmp):
    doc = run(tmp, storage_capacity_gb=0.01, duration=1)  # ~0.15 GB is written in 1 s: the disk tier must evict
    disk = doc["tiers"]["disk"]
    assert disk["capacity_bytes"] == 10_000_000 and 0 < disk["used_bytes"] <= 10_000_000
    assert disk["events"]["evictions"] > 0


# The storage backend's keys: what each makes the set-up do, without an object store (a run on a real one, Ceph's
# radosgw, is in tests/kvconnector/test_s3_tier.py).
S3_UNREACHABLE = {"storage_backend": "s3", "s3_bucket": "kv-probe", "storage_capacity_gb": 0.01}


def s3_refusal(tmp, **kw) -> str:
    with pytest.MonkeyPatch.context() as mp, pytest.raises(ConfigError) as exc:
        # keys in the environment: boto3 then asks no one else for credentials (an instance's metadata service)
        mp.setenv("AWS_ACCESS_KEY_ID", "probe")
        mp.setenv("AWS_SECRET_ACCESS_KEY", "probe")
        mp.setenv("AWS_EC2_METADATA_DISABLED", "true")
        prepared(tmp, **kw)
    return str(exc.value)


@probe("storage_backend", runs_bench=False)
def p_storage_backend(tmp):
    disk = prepared(tmp)
    assert disk.tiers[-1].kind == "disk"
    disk.cleanup()
    # s3: the storage tier is an S3 client, which reaches for its endpoint as the run is set up
    assert "tier s3: cannot use S3 bucket 'kv-probe' at http://127.0.0.1:9" in s3_refusal(
        tmp, **S3_UNREACHABLE, s3_endpoint="http://127.0.0.1:9"
    )


@probe("s3_bucket", runs_bench=False)
def p_s3_bucket(tmp):
    assert "--s3-bucket is read with --storage-backend s3 only" in s3_refusal(tmp, s3_bucket="kv")
    assert "bucket 'other'" in s3_refusal(
        tmp, **{**S3_UNREACHABLE, "s3_bucket": "other"}, s3_endpoint="http://127.0.0.1:9"
    )


@probe("s3_endpoint", runs_bench=False)
def p_s3_endpoint(tmp):
    assert "at http://127.0.0.1:7" in s3_refusal(tmp, **S3_UNREACHABLE, s3_endpoint="http://127.0.0.1:7")


def entry_opens(tmp, **kw) -> list[int]:
    """The flags of every open(2) of a cache entry during a run (not of the tier's directory or its marker file)."""
    real_open, flags = os.open, []

    def spy(path, f, *a, **k):
        p = str(path)
        if p.startswith(str(tmp / "cache")) and not os.path.basename(p).startswith(".") and not os.path.isdir(p):
            flags.append(f)
        return real_open(path, f, *a, **k)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "open", spy)
        run(tmp, cpu_mem_gb=0, duration=0.5, **kw)
    return flags


@probe("io_mode")
def p_io_mode(tmp):
    from kvconnector.timed_io import O_DIRECT, probe_direct

    buffered = entry_opens(tmp, io_mode="buffered")
    assert buffered and not any(f & O_DIRECT for f in buffered)
    if O_DIRECT and probe_direct(str(tmp)):  # where O_DIRECT works, "direct" uses it for every entry
        assert all(f & O_DIRECT for f in entry_opens(tmp, io_mode="direct"))


def sync_calls(tmp, **kw) -> tuple[int, int, int]:
    """(fdatasync calls, fsync calls, the disk tier's writes) of a run. The fsyncs include the one of the tier's
    marker file, written once when the run's fresh directory becomes a tier, whatever the policy."""
    real_fdatasync, real_fsync, counts = os.fdatasync, os.fsync, {"fdatasync": 0, "fsync": 0}

    def count(name, real):
        def spy(fd):
            counts[name] += 1
            return real(fd)

        return spy

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "fdatasync", count("fdatasync", real_fdatasync))
        mp.setattr(os, "fsync", count("fsync", real_fsync))
        doc = run(tmp, cpu_mem_gb=0, duration=0.5, **kw)
    assert doc["tiers"]["disk"]["sync"] == kw["sync"]
    return counts["fdatasync"], counts["fsync"], doc["tiers"]["disk"]["write"]["ops"]


@probe("sync")
def p_sync(tmp):
    fdatasyncs, fsyncs, writes = sync_calls(tmp, sync="entry")
    assert writes > 0 and fdatasyncs >= writes and fsyncs > 0  # each write durable before it returns
    fdatasyncs, fsyncs, writes = sync_calls(tmp, sync="none")
    assert writes > 0 and fdatasyncs == 0  # left to the kernel's writeback


@probe("promote_on_hit")
def p_promote_on_hit(tmp):
    # A 2 MB CPU tier over the disk tier: previous turns and decode reads hit on disk; promotion moves them back up.
    def promotions(on):
        return run(tmp, promote_on_hit=on, duration=1)["tiers"]["cpu"]["events"].get("promotions_in", 0)

    assert promotions(True) > 0 == promotions(False)


def cpu_used_max(doc) -> int:
    return max(s["tiers"]["cpu"]["used_bytes"] for s in doc["timeline"])


@probe("eviction.target_usage_ratio")
def p_eviction_target_usage_ratio(tmp):
    # A 20 MB CPU tier, filled many times over in a second; entries are at most ~2.3 MB.
    half = run(tmp, cpu_mem_gb=0.02, eviction={"target_usage_ratio": 0.5}, duration=1)
    full = run(tmp, cpu_mem_gb=0.02, eviction={"target_usage_ratio": 1.0}, duration=1)
    assert cpu_used_max(half) <= 10_000_000 < cpu_used_max(full)


@probe("eviction.large_entry_limit_ratio")
def p_eviction_large_entry_limit_ratio(tmp):
    # A 20 MB CPU tier that takes entries of at most 2% of it (400 kB): larger new entries go straight to disk.
    run(tmp, cpu_mem_gb=0.02, eviction={"large_entry_limit_ratio": 0.02}, duration=1, io_op_log=str(tmp / "ops.csv"))
    puts = [r for r in csv.DictReader(open(tmp / "ops.csv")) if r["phase"] == "put"]
    assert all(int(r["bytes"]) <= 400_000 for r in puts if r["tier"] == "cpu")
    assert any(r["tier"] == "disk" for r in puts) and any(r["tier"] == "cpu" for r in puts)


@probe("seed", runs_bench=False)
def p_seed(tmp):
    a = [t.input_tokens for t in turns(prepared(tmp, seed=1))]
    assert (
        a
        == [t.input_tokens for t in turns(prepared(tmp, seed=1))]
        != [t.input_tokens for t in turns(prepared(tmp, seed=2))]
    )


@probe("user_templates", runs_bench=False)
def p_user_templates(tmp):
    tpl = {"only": {"context_tokens": [7, 7], "generate_tokens": [3, 3], "think_time_s": [0, 0]}}
    ts = turns(prepared(tmp, user_templates=tpl))
    assert {(t.input_tokens, t.output_tokens) for t in ts} == {(7, 3)}
    # the reference's users: each request from [C/4, C] of the user's C (here 7 and 3)
    ts = turns(prepared(tmp, user_templates=tpl, request_model="reference"))
    assert {(t.input_tokens, t.output_tokens) for t in ts} <= {(i, o) for i in range(1, 8) for o in range(1, 4)}
    assert len({t.input_tokens for t in ts}) > 1


@probe("qos_distribution", runs_bench=False)
def p_qos_distribution(tmp):
    b = prepared(tmp, qos_distribution={"batch": 1.0})
    assert {b.workload.new_user(i).qos for i in range(20)} == {"batch"}


@probe("conversation.end_probability", runs_bench=False)
def p_conversation_end_probability(tmp):
    assert {len(s.conversation.turns) for s in sessions(prepared(tmp, conversation={"end_probability": 1.0}))} == {1}


@probe("conversation.max_turns", runs_bench=False)
def p_conversation_max_turns(tmp):
    b = prepared(tmp, conversation={"end_probability": 0.0, "max_turns": 3})
    assert {len(s.conversation.turns) for s in sessions(b)} == {3}


@probe("disable_multi_turn", runs_bench=False)
def p_disable_multi_turn(tmp):
    b = prepared(tmp, disable_multi_turn=True, conversation={"end_probability": 0.0})
    assert {len(s.conversation.turns) for s in sessions(b)} == {1}


@probe("disable_prefix_caching", runs_bench=False)
def p_disable_prefix_caching(tmp):
    assert {s.system_prompt for s in sessions(prepared(tmp, disable_prefix_caching=True))} == {None}


@probe("prefix_cache.probability", runs_bench=False)
def p_prefix_cache_probability(tmp):
    assert {s.system_prompt for s in sessions(prepared(tmp, prefix_cache={"probability": 0.0}))} == {None}
    assert None not in {s.system_prompt for s in sessions(prepared(tmp, prefix_cache={"probability": 1.0}))}


@probe("prefix_cache.system_prompts", runs_bench=False)
def p_prefix_cache_system_prompts(tmp):
    b = prepared(tmp, prefix_cache={"probability": 1.0, "system_prompts": [{"text": "x", "tokens": 5}]})
    assert {s.system_prompt for s in sessions(b)} == {0}


@probe("dataset_path", runs_bench=False)
def p_dataset_path(tmp):
    b = prepared(tmp, dataset_path=str(write_sharegpt(tmp / "sg.json", n=4)))
    assert b.workload.kind == "sharegpt" and len(b.workload.conversations) == 3


@probe("max_conversations", runs_bench=False)
def p_max_conversations(tmp):
    b = prepared(tmp, dataset_path=str(write_sharegpt(tmp / "sg.json", n=4)), max_conversations=2)
    assert len(b.workload.conversations) == 2


@probe("sharegpt.min_turns", runs_bench=False)
def p_sharegpt_min_turns(tmp):
    with pytest.raises(ConfigError, match="no usable"):  # no conversation has 4 turns
        prepared(tmp, dataset_path=str(write_sharegpt(tmp / "sg.json", n=4)), sharegpt={"min_turns": 4})


@probe("sharegpt.max_turn_tokens", runs_bench=False)
def p_sharegpt_max_turn_tokens(tmp):
    with pytest.raises(ConfigError, match="no usable"):
        prepared(tmp, dataset_path=str(write_sharegpt(tmp / "sg.json", n=4)), sharegpt={"max_turn_tokens": 5})


@probe("use_burst_trace", runs_bench=False)
def p_use_burst_trace(tmp):
    b = prepared(tmp, use_burst_trace=True, burst_trace_path=str(write_burstgpt(tmp / "t.csv")))
    assert b.workload.kind == "burstgpt" and len(b.workload.conversations) == 4


PROBES["burst_trace_path"] = p_use_burst_trace


@probe("trace_speedup")
def p_trace_speedup(tmp):
    # The trace spans 1.1 s: at 0.2x (five times slower) the run lasts at least 5.5 s, at 2x about 0.55 s plus the
    # requests' own time, which a loaded machine stretches alike for both (so compare the two, with room for that).
    trace = str(write_burstgpt(tmp / "t.csv"))

    def replay(speedup):
        kw = {"use_burst_trace": True, "burst_trace_path": trace, "replay_cycles": 1, "duration": 20}
        s = run(tmp, trace_speedup=speedup, **kw)["summary"]
        assert s["total_requests"] == 12 and s["window"]["ended_by"] == "workload"
        return s["elapsed_time"]

    slow, fast = replay(0.2), replay(2)
    assert slow >= 5.5 and 0.55 <= fast < slow - 3, (slow, fast)


@probe("max_context_tokens")
def p_max_context_tokens(tmp):
    tpl = {"t": {"context_tokens": [500, 500], "generate_tokens": [1, 1], "think_time_s": [0, 0]}}
    s = run(tmp, max_context_tokens=100, user_templates=tpl, duration=1, disable_prefix_caching=True)["summary"]
    assert s["prompt_tokens"] == 100 * s["total_requests"] > 0


@probe("random_buffer_mb")
def p_random_buffer_mb(tmp):
    # Payloads are page-aligned slices of the random buffer, so the entries written hold at most as many distinct
    # 4 KiB pages as the buffer has: more than a 16 MiB buffer's 4,096 proves the 32 MiB one was used. One request
    # whose entry (20,000 tokens of the test model's 2 KiB: 40 MiB) is larger than the buffer wraps around all of it.
    tpl = {"t": {"context_tokens": [20000, 20000], "generate_tokens": [1, 1], "think_time_s": [0, 0]}}
    kw = {"num_users": 1, "max_requests": 1, "user_templates": tpl, "disable_prefix_caching": True}
    run(tmp, random_buffer_mb=32, cpu_mem_gb=0, keep_cache=True, duration=30, **kw)
    pages = set()
    for root, _, files in os.walk(tmp / "cache"):
        for name in files:
            data = open(os.path.join(root, name), "rb").read()
            # page 0 is the entry header; the last page may be padded
            pages.update(hash(data[i : i + 4096]) for i in range(4096, len(data) - 4096, 4096))
    assert 4096 < len(pages) <= 8192


@probe("io_workers")
def p_io_workers(tmp):
    from kvconnector.store import TieredStore

    def storage_threads(workers):
        """The threads that ran the store's operations during a run."""
        real_get, real_put, seen = TieredStore.get, TieredStore.put, set()

        def get(self, *a, **k):
            seen.add(threading.get_ident())
            return real_get(self, *a, **k)

        def put(self, *a, **k):
            seen.add(threading.get_ident())
            return real_put(self, *a, **k)

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(TieredStore, "get", get)
            mp.setattr(TieredStore, "put", put)
            run(tmp, io_workers=workers, num_users=8, performance_profile="throughput", duration=1)
        return len(seen)

    assert storage_threads(1) == 1 and storage_threads(3) == 3


# ---- autoscaler keys: each run autoscales every 0.2 s; the decisions recorded in the results show the key ----------
def autoscaled(tmp, users, mode="qos", missed=False, target=0.95, **scaler) -> list[dict]:
    """The autoscaler's steps over a 2.4 s run (1.2 s once gave 2 steps on a loaded machine: the first came at
    0.98 s). `missed`: one QoS class whose SLA (1 us) every interval misses, so qos mode scales down at each step;
    otherwise light load (saturation far below a 0.95 target) so qos mode scales up."""
    # One QoS class: its SLA missed at every interval, or one no loaded machine misses (10 s), so that only the
    # saturation decides (the default classes' SLAs can be missed when other work loads the 2 cores).
    sla_ms = 0.001 if missed else 10_000
    kw = {
        "qos_profiles": {"c": {"priority": 1, "target_p95_ms": sla_ms, "target_p99_ms": sla_ms}},
        "qos_distribution": {"c": 1.0},
    }
    tpl = {"t": {"context_tokens": [64, 64], "generate_tokens": [16, 16], "think_time_s": [0.04, 0.04]}}
    steps = run(
        tmp,
        enable_autoscaling=True,
        autoscaler_mode=mode,
        autoscaler={"interval_s": 0.2, "cooldown_s": 0, **scaler},
        target_saturation=target,
        num_users=users,
        user_templates=tpl,
        duration=2.4,
        **kw,
    )["autoscaling_stats"]
    assert len(steps) >= 3
    return steps


@probe("autoscaler.min_users")
def p_autoscaler_min_users(tmp):
    # 6 * 0.8 = 4, held at 5 (an interval that completed nothing on a loaded machine may step up instead)
    users = [s["next_users"] for s in autoscaled(tmp, 6, missed=True, min_users=5)]
    assert min(users) == 5, users


@probe("autoscaler.max_users")
def p_autoscaler_max_users(tmp):
    # 6 * 1.2 = 8, held at 7 (a loaded machine may push saturation over the band and step down sometimes)
    users = [s["next_users"] for s in autoscaled(tmp, 6, max_users=7)]
    assert max(users) == 7, users


@probe("autoscaler.scale_up_factor")
def p_autoscaler_scale_up_factor(tmp):
    assert autoscaled(tmp, 2, scale_up_factor=3, max_users=40)[0]["next_users"] == 6


@probe("autoscaler.scale_down_factor")
def p_autoscaler_scale_down_factor(tmp):
    assert autoscaled(tmp, 8, missed=True, scale_down_factor=0.5)[0]["next_users"] == 4


@probe("autoscaler.cooldown_s")
def p_autoscaler_cooldown_s(tmp):
    steps = autoscaled(tmp, 8, missed=True, cooldown_s=30)
    assert steps[0]["action"] == "scale_down" and {s["reason"] for s in steps[1:]} == {"cooldown"}
    # without it (the helper's 0), every step scales down again
    assert "cooldown" not in {s["reason"] for s in autoscaled(tmp, 8, missed=True)}


@probe("autoscaler.band")
def p_autoscaler_band(tmp):
    # target 0.5 +- 0.5 holds any saturation; +- 0.01 holds none of a light load's (about 0.02). The users are held
    # at 4: below the band qos mode scales up at every step, and a loaded machine once saw saturation reach 0.49-0.51
    # that way (a step within the band, rightly), which said nothing about the band.
    wide = autoscaled(tmp, 4, target=0.5, band=0.5, max_users=4)
    assert all("within band" in s["reason"] for s in wide), wide
    narrow = autoscaled(tmp, 4, target=0.5, band=0.01, max_users=4)
    light = [s for s in narrow if s["reason"] != "cooldown" and s["saturation"] < 0.49]
    assert light and all("below band" in s["reason"] for s in light), narrow


@probe("target_saturation")
def p_target_saturation(tmp):
    # A light load is above a target of 0.001 (+- 0.0001): every step scales down; below 0.95 it scales up.
    # (by majority: on a loaded machine a single interval may land on the other side)
    def sides(steps):
        return sum("above band" in s["reason"] for s in steps), sum("below band" in s["reason"] for s in steps)

    above, below = sides(autoscaled(tmp, 4, target=0.001, band=0.0001))
    assert above > below, (above, below)
    above, below = sides(autoscaled(tmp, 4, max_users=4))
    assert below > above, (above, below)


@probe("autoscaler_mode")
def p_autoscaler_mode(tmp):
    assert autoscaled(tmp, 2, mode="capacity")[0]["reason"] == "first step"  # qos mode never says so
    assert autoscaled(tmp, 2)[0]["reason"].startswith("saturation")


@probe("autoscaler.ramp_factor")
def p_autoscaler_ramp_factor(tmp):
    # capacity mode: the first step always ramps (growth from nothing is infinite)
    assert autoscaled(tmp, 2, mode="capacity", ramp_factor=4)[0]["next_users"] == 8


@probe("autoscaler.fine_factor")
def p_autoscaler_fine_factor(tmp):
    # growth never exceeds fast_growth 1000: from the second step on, the fine factor (5: 2 -> ramp 4 -> 20)
    steps = autoscaled(tmp, 2, mode="capacity", fast_growth=1000, fine_factor=5)
    assert steps[1]["next_users"] in (20, steps[1]["users"]) and steps[1]["action"] in ("scale_up", "peak_found")
    assert steps[1]["action"] == "scale_up", steps  # throughput grew from 2 to 4 users at 40 ms think time


@probe("autoscaler.fast_growth")
def p_autoscaler_fast_growth(tmp):
    # users double and so does throughput (+100%): below a 0.5 threshold it ramps again, above 1000 it fine-tunes
    ramp = autoscaled(tmp, 2, mode="capacity", fast_growth=0.5, fine_factor=1.1)
    assert ramp[1]["action"] == "scale_up" and ramp[1]["next_users"] == 8, ramp
    fine = autoscaled(tmp, 2, mode="capacity", fast_growth=1000, fine_factor=1.1)
    assert fine[1]["action"] == "scale_up" and fine[1]["next_users"] == 5, fine


# ---- probes that run the benchmark briefly -------------------------------------------------------------------------
@probe("duration")
def p_duration(tmp):
    # ended by the window, not before it; how far past it a loaded machine goes is the window report's business
    s = run(tmp, duration=1.0)["summary"]
    assert s["window"]["ended_by"] == "duration" and s["window"]["duration_s"] == 1.0 and s["elapsed_time"] >= 1.0


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


# ---- the chained prefix model: a short run of 2 sessions, 256 input + 256 answer tokens per turn --------------------
def short_chained(tmp, **kw) -> dict:
    return chained_run(tmp, **{"num_users": 2, "rounds": 3, **kw})


@probe("prefix_model")
def p_prefix_model(tmp):
    rows = short_chained(tmp)["rounds"]
    assert [r["hit_rate"] for r in rows] == [0.0, pytest.approx(2 / 3), pytest.approx(0.8)]
    assert "rounds" not in run(tmp, duration=0.5)  # entries: no rounds, no chains


@probe("block_size")
def p_block_size(tmp):
    # round 2's prompt is 768 tokens, 512 of them sent before: 2 blocks of 256, or 2 of 200 (400 tokens)
    assert short_chained(tmp, block_size=200)["rounds"][1]["ideal_hit_rate"] == pytest.approx(400 / 768)


@probe("rounds")
def p_rounds(tmp):
    assert len(short_chained(tmp, rounds=2)["rounds"]) == 2


# ---- a block-hash trace (replay/synthetic/trace_blocks.py): the committed Mooncake sample, 20 requests --------------
MOONCAKE = os.path.join(os.path.dirname(__file__), "data", "mooncake", "conversation_trace_head300.jsonl")


def mooncake(tmp, **kw) -> dict:
    kw = {"dataset_path": MOONCAKE, "trace_block_tokens": 16, "trace_speedup": 0, "max_requests": 20, **kw}
    return run(tmp, **{"source": "mooncake", "duration": 60, **kw})


@probe("source")
def p_source(tmp):
    t = mooncake(tmp)["trace"]
    assert t["source"] == "mooncake" and t["requests"] == 20 and t["hit_rate"] == t["predicted_hit_rate"] > 0
    assert "trace" not in run(tmp, duration=0.5)


WEKA = os.path.join(os.path.dirname(__file__), "data", "weka", "kv-cache-tester", "trace_0291.json")


def weka(tmp, **kw) -> dict:
    """trace_0291 of kv-cache-tester: a real agentic session, 20 minutes recorded, two sub-agents; in real time."""
    kw = {"dataset_path": WEKA, "trace_block_tokens": 16, "trace_speedup": 1, "cpu_mem_gb": 0.5, "duration": 60, **kw}
    return run(tmp, source="weka", **kw)


@probe("trace_timing")
def p_trace_timing(tmp):
    # in a 3 s window the timestamps timing starts only the calls recorded in its first 3 s; the think timing, its
    # pauses capped at 10 ms, runs every call (each after the call it follows and the sub-agents it joins) and ends
    # with the last, and the plan's prediction over the order they ran is what a tier holding the trace measured
    think = weka(tmp, trace_timing="think", max_idle_s=0.01)["trace"]
    stamps = weka(tmp, duration=3)["trace"]
    calls = len(load_block_trace(WEKA, "weka", block_tokens=16).requests)
    assert think["requests"] == calls > 20 and stamps["requests"] < 5
    assert (think["trace_timing"], stamps["trace_timing"]) == ("think", "timestamps")
    assert think["hit_rate"] == think["predicted_hit_rate"] > 0


@probe("max_idle_s")
def p_max_idle_s(tmp):
    # the session's pauses capped at 10 ms run it whole (the run ends with it); capped at the default minute, a 5 s
    # window sees fewer of its calls
    capped = weka(tmp, trace_timing="think", max_idle_s=0.01)["trace"]
    minute = weka(tmp, trace_timing="think", duration=5)["trace"]
    assert capped["max_idle_s"] == 0.01 and capped["requests"] > minute["requests"]


def hit_rate_doc(tmp, **kw) -> dict:
    """--target-hit-rate on one disk tier of about 19,500 tokens (0.05 GB at 2,048 B a token) in 64-token blocks, no
    simulated time."""
    kw = {"target_hit_rate": 0.6, "cpu_mem_gb": 0, "storage_capacity_gb": 0.05, "duration": 60, **kw}
    kw.setdefault("trace_block_tokens", 64)
    return run(tmp, generation_mode="none", **kw)


def hit_rate_run(tmp, **kw) -> dict:
    return hit_rate_doc(tmp, **kw)["trace"]


@probe("target_hit_rate")
def p_target_hit_rate(tmp):
    # each target is met within a block of the prompt (64 / 2,048 tokens) and measured on the store's own hits
    for target in (0.3, 0.7):
        t = hit_rate_run(tmp, target_hit_rate=target)
        assert t["source"] == "hit-rate" and t["target_hit_rate"]["target"] == target
        assert t["hit_rate"] == pytest.approx(target, abs=64 / 2048), t


@probe("cache_tokens")
def p_cache_tokens(tmp):
    # aimed at half the store: half the sessions, and the store (larger) still meets the target; aimed at twice the
    # store, the sessions' turns outgrow it and LRU under their cycle keeps no context until it is used again
    room = hit_rate_run(tmp)
    half = hit_rate_run(tmp, cache_tokens=room["tiers"][0]["capacity_tokens"] / 2)
    double = hit_rate_run(tmp, cache_tokens=room["tiers"][0]["capacity_tokens"] * 2)
    assert half["target_hit_rate"]["sessions"] < room["target_hit_rate"]["sessions"]
    assert half["hit_rate"] == pytest.approx(0.6, abs=64 / 2048) and double["hit_rate"] < 0.1


@probe("input_len")
def p_input_len(tmp):
    t = hit_rate_run(tmp, input_len=1024)
    assert t["prompt_tokens"] == 1024 * t["requests"] and t["target_hit_rate"]["prompt_tokens"] == 1024


@probe("output_len")
def p_output_len(tmp):
    short, long = (hit_rate_doc(tmp, output_len=n)["summary"] for n in (16, 64))
    assert long["generated_tokens"] == 4 * short["generated_tokens"] > 0


@probe("trace_block_tokens")
def p_trace_block_tokens(tmp):
    # a 512-token Mooncake block scaled to N tokens: blocks of N x 2,048 B, prompts scaled with them
    a, b = mooncake(tmp)["trace"], mooncake(tmp, trace_block_tokens=32)["trace"]
    assert (a["block_bytes"], b["block_bytes"]) == (16 * 2048, 32 * 2048)
    assert b["prompt_tokens"] == pytest.approx(2 * a["prompt_tokens"], rel=0.01)


@probe("generation.prefill_ms_per_token")
def p_generation_prefill_ms_per_token(tmp):
    def ttft(ms: float) -> float:
        gen = {"ms_per_token": {"fast": 0}, "prefill_ms_per_token": {"fast": ms}}
        return short_chained(tmp, rounds=1, generation_mode="fast", generation=gen)["rounds"][0]["ttft_p50_ms"]

    assert ttft(1.0) >= 256 * 0.9 > ttft(0.0)  # round 1 computes each 256-token prompt


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
    # Two classes of our own: one with a 1 us target no storage operation meets, one with a target of an hour.
    q = run(
        tmp,
        qos_profiles={
            "tight": {"priority": 9, "target_p95_ms": 0.001, "target_p99_ms": 0.002},
            "loose": {"priority": 1, "target_p95_ms": 3.6e6, "target_p99_ms": 3.6e6},
        },
        qos_distribution={"tight": 0.5, "loose": 0.5},
        duration=1,
    )["summary"]["qos_metrics"]
    assert set(q) == {"tight", "loose"} and q["tight"]["requests"] > 0 and q["loose"]["requests"] > 0
    assert q["tight"]["sla"]["met"] is False and q["tight"]["sla"]["verdict"] == "missed"
    assert q["loose"]["sla"]["met"] is True and q["tight"]["priority"] == 9


@probe("qos_scheduler")
def p_qos_scheduler(tmp):
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


@probe("io_op_log")
def p_io_op_log(tmp):
    doc = run(tmp, duration=0.5, io_op_log=str(tmp / "ops.csv"))
    rows = list(csv.reader(open(tmp / "ops.csv")))
    ops = sum(t["read"]["ops"] + t["write"]["ops"] for t in doc["tiers"].values())
    assert len([r for r in rows[1:] if r[1] in ("read", "write")]) == ops
    assert any(float(r[8]) > 0 for r in rows[1:] if r[1] == "write" and r[3] == "disk")  # device time: real I/O


@probe("io_trace_log")
def p_io_trace_log(tmp):
    # The reference's trace-only mode: the operations logged in its columns, none done (the disk tier's directory
    # stays empty, the block device's time is nil).
    doc = run(tmp, duration=0.5, cpu_mem_gb=0, keep_cache=True, io_trace_log=str(tmp / "ops.csv"))
    rows = list(csv.DictReader(open(tmp / "ops.csv")))
    assert doc["tiers"]["disk"]["write"]["ops"] == sum(r["Operation"] == "Write" for r in rows) > 0
    assert {r["Tier"] for r in rows} == {"Tier-2"} and doc["trace_only"] is True
    assert doc["tiers"]["disk"]["write"]["device_ms"]["p50"] == 0
    assert [f for _, _, fs in os.walk(tmp / "cache") for f in fs if f != KEPT_NAME] == []  # only the keep mark


@probe("size_unit")
def p_size_unit(tmp):
    gib = run(tmp, duration=0.5, size_unit="GiB", cpu_mem_gb=0.01)["tiers"]["cpu"]["capacity_bytes"]
    gb = run(tmp, duration=0.5, size_unit="GB", cpu_mem_gb=0.01)["tiers"]["cpu"]["capacity_bytes"]
    assert (gib, gb) == (int(0.01 * 2**30), 10_000_000)


@probe("num_gpus")
def p_num_gpus(tmp):
    # The GPU tier holds num_gpus x gpu_mem_gb; in the trace-only mode it needs no CUDA.
    kw = {"duration": 0.5, "gpu_mem_gb": 0.01, "io_trace_log": str(tmp / "t.csv")}
    assert run(tmp, num_gpus=3, **kw)["tiers"]["gpu"]["capacity_bytes"] == 3 * 10_000_000


@probe("tensor_parallel")
def p_tensor_parallel(tmp):
    # Each rank stores 1/TP of an entry: the small model's 2,048 B/token become 512 at TP 4.
    assert written_per_token(tmp, num_gpus=4, tensor_parallel=4) == 512
    with pytest.raises(ConfigError, match="--tensor-parallel 2 exceeds --num-gpus 1"):
        prepared(tmp, tensor_parallel=2)


@probe("validation_trace")
def p_validation_trace(tmp):
    trace = tmp / "trace.json"
    rec = {"context_tokens": 100, "generation_tokens": 10, "read_bytes": 1, "write_bytes": 1}
    trace.write_text(json.dumps([{**rec, "cache_hit": True}, {**rec, "cache_hit": False}]))
    v = run(tmp, duration=0.5, validation_trace=str(trace))["validation"]
    assert v["trace_stats"]["cache_hit_rate"] == 0.5 and v["comparison"]["cache_hit_rate"]["trace"] == 0.5
    assert "validation" not in run(tmp, duration=0.5)


@probe("plots")
def p_plots(tmp):
    run(tmp, duration=0.5, plots=str(tmp / "plots"))
    assert any(f.endswith(".png") for f in os.listdir(tmp / "plots"))


@probe("html_output")
def p_html_output(tmp):
    run(tmp, duration=0.5, html_output=str(tmp / "r.html"))
    page = (tmp / "r.html").read_text()
    assert 'data-kind="bench"' in page and "out.json" in page  # the page of this run, naming its results file


@probe("enable_latency_tracing")
def p_enable_latency_tracing(tmp):
    import shutil

    if os.geteuid() != 0 or not shutil.which("bpftrace"):
        pytest.skip("enable_latency_tracing runs bpftrace: needs root and bpftrace (CI has both)")
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


# ---- keys the MLPerf reference's config.yaml brought -----------------------------------------------------------------
def notes_of(tmp, **kw) -> list[str]:
    return prepared(tmp, **kw).notes


def p_unused(section, key, value):
    """A reference key kvtier accepts without acting on it: the run says so in its notes (never silently)."""

    def check(tmp):
        assert not any(f"{section}.{key}" in n for n in notes_of(tmp))
        assert any(f"{section}.{key}" in n for n in notes_of(tmp, **{section: {key: value}}))

    return check


for _section, _key, _value in (
    ("eviction", "max_recursion_depth", 10),
    ("eviction", "max_evictions_hard_cap", 5000),
    ("eviction", "max_evictions_min", 1000),
    ("gpu_backend", "memory_fraction", 0.9),
    ("gpu_backend", "max_eviction_attempts", 100),
    ("gpu_backend", "free_memory_threshold", 0.1),
    ("conversation", "max_conversations", 1000),
    ("autoscaler", "consecutive_samples_required", 2),
    ("saturation_detection", "read_latency_p95_threshold_ms", 100),
    ("saturation_detection", "write_latency_p95_threshold_ms", 50),
    ("saturation_detection", "queue_depth_threshold", 100),
    ("saturation_detection", "history_window_size", 10),
):
    PROBES[f"{_section}.{_key}"] = p_unused(_section, _key, _value)


def request_model_run(tmp, model, context, **kw) -> dict:
    """One user, one 3-turn conversation of `context`-token turns and 40 generated tokens each."""
    tpl = {"t": {"context_tokens": [context, context], "generate_tokens": [40, 40], "think_time_s": [0, 0]}}
    return run(
        tmp,
        request_model=model,
        user_templates=tpl,
        conversation={"end_probability": 0.0, "max_turns": 3},
        num_users=1,
        max_requests=3,
        duration=30,
        disable_prefix_caching=True,
        cpu_mem_gb=0,
        **kw,
    )["summary"]


@probe("request_model")
def p_request_model(tmp):
    # kvtier: turn n reads turn n-1 (2 reads), decode ceil(40 / 32) = 2 reads per request; the reference: every
    # earlier turn (0 + 1 + 2 = 3 reads), decode 1 + ceil(a / 32) reads with a request's answer a in [40/4, 40] (its
    # user's sizes: each request draws from [C/4, C]), and none at all for >= 10k-token requests.
    ours = request_model_run(tmp, "kvtier", 1000)
    ref = request_model_run(tmp, "reference", 1000)
    assert ours["multi_turn_stats"]["previous_turn_hits"] == 2 and ref["multi_turn_stats"]["previous_turn_hits"] == 3
    assert ours["decode_stats"]["reads"] == 6 and 6 <= ref["decode_stats"]["reads"] <= 9
    assert ours["prompt_tokens"] == 1000 + 1040 * 2  # increments (the reference: whole contexts, of 250-1000 tokens)
    assert 3 * 250 <= ref["prompt_tokens"] <= 3000
    assert request_model_run(tmp, "reference", 40_000)["decode_stats"]["reads"] == 0
    assert request_model_run(tmp, "kvtier", 10_000)["decode_stats"]["reads"] == 6
    assert BenchConfig().request_model == "reference"  # the default: the MLPerf reference's (these helpers: kvtier)
    # I/O threads: 8 by default; the reference's min(users, 500) when --io-workers is not given
    assert prepared(tmp, num_users=20).cfg.effective_io_workers == 8
    assert prepared(tmp, num_users=20, request_model="reference").cfg.effective_io_workers == 20
    assert prepared(tmp, num_users=20, request_model="reference", io_workers=3).cfg.effective_io_workers == 3


@probe("prefix_cache.min_prefix_length", runs_bench=False)
def p_prefix_cache_min_prefix_length(tmp):
    # the default prompts have 512, 1024 and 768 tokens: at 800 only the second is cached
    b = prepared(tmp, prefix_cache={"probability": 1.0, "min_prefix_length": 800})
    assert {s.system_prompt for s in sessions(b)} == {1}


@probe("prefix_cache.max_prefix_entries", runs_bench=False)
def p_prefix_cache_max_prefix_entries(tmp):
    b = prepared(tmp, prefix_cache={"probability": 1.0, "max_prefix_entries": 1})
    assert {s.system_prompt for s in sessions(b)} == {0}
    assert {s.system_prompt for s in sessions(prepared(tmp, prefix_cache={"probability": 1.0}))} == {0, 1, 2}


def rag_ingest(tmp, **kw) -> dict:
    return run(tmp, enable_rag=True, duration=0.5, **kw)["setup"]["rag_ingest"]


@probe("rag.max_chunk_bytes")
def p_rag_max_chunk_bytes(tmp):
    assert rag_ingest(tmp, rag={"chunk_tokens": 10, "max_chunk_bytes": 4096})["chunk_bytes"] == 4096


@probe("rag.max_documents")
def p_rag_max_documents(tmp):
    assert rag_ingest(tmp, rag_num_docs=5, rag={"max_documents": 2})["documents"] == 2


def p_rag_doc_tokens(key):
    # 1,000-token documents of 100-token chunks: 10 chunks each instead of chunks_per_doc (8). "large" needs a model
    # of 64 layers (this one: 64 x 2 x 1 x 8 x 2 B = 2,048 B per token, as small as the test model).
    large = key.startswith("large")
    big = {"model": "big", "model_configs": {"big": {"num_layers": 64, "kv_heads": 1, "head_dim": 8}}}

    def check(tmp):
        kw = big if large else {}
        got = rag_ingest(tmp, rag_num_docs=3, rag={"chunk_tokens": 100, key: 1000}, **kw)
        assert got["chunks"] == 30, got
        other = ("small" if large else "large") + key[len("large" if large else "small") :]
        assert rag_ingest(tmp, rag_num_docs=3, rag={"chunk_tokens": 100, other: 1000}, **kw)["chunks"] == 24

    return check


for _key in ("large_model_doc_tokens_min", "large_model_doc_tokens_max", "small_model_doc_tokens_min"):
    PROBES[f"rag.{_key}"] = p_rag_doc_tokens(_key)
PROBES["rag.small_model_doc_tokens_max"] = p_rag_doc_tokens("small_model_doc_tokens_max")


@probe("rag.retrieval_distribution")
def p_rag_retrieval_distribution(tmp):
    # 20 documents, one chunk per query: zipfian picks document 0 about 28% of the time, uniform about 5%. A pick is a
    # read of the chunk (a hit) or its rewrite (a miss); demotions and evictions of chunks are not picks.
    def share_of_first(dist):
        kw = {"rag_num_docs": 20, "rag": {"top_k": 1, "probability": 1.0, "retrieval_distribution": dist}}
        run(tmp, enable_rag=True, duration=2, num_users=8, io_op_log=str(tmp / "ops.csv"), **kw)
        keys = [
            r["key"]
            for r in csv.DictReader(open(tmp / "ops.csv"))
            if r["key"].startswith("rag/") and (r["op"], r["phase"]) in (("read", "get"), ("write", "put"))
        ]
        assert len(keys) >= 60, len(keys)
        return sum(k.startswith("rag/d0/") for k in keys) / len(keys)

    assert share_of_first("zipfian") > 0.15 > share_of_first("uniform")


def sharegpt_turns(tmp, **sharegpt):
    b = prepared(tmp, dataset_path=str(write_sharegpt(tmp / "sg.json", n=4)), sharegpt=sharegpt)
    return b.workload, [t for c in b.workload.conversations for t in c.turns]


@probe("sharegpt.max_context_tokens", runs_bench=False)
def p_sharegpt_max_context_tokens(tmp):
    _, turns_ = sharegpt_turns(tmp)
    assert max(t.input_tokens for t in turns_) > 20
    w, turns_ = sharegpt_turns(tmp, max_context_tokens=20)
    assert max(t.input_tokens for t in turns_) == 20 and w.report.truncated["over_sharegpt_max_context_tokens"] > 0


@probe("sharegpt.max_generation_tokens", runs_bench=False)
def p_sharegpt_max_generation_tokens(tmp):
    w, turns_ = sharegpt_turns(tmp, max_generation_tokens=10)
    assert max(t.output_tokens for t in turns_) == 10 and w.report.truncated["over_sharegpt_max_generation_tokens"]


@probe("sharegpt.chars_per_token_estimate", runs_bench=False)
def p_sharegpt_chars_per_token_estimate(tmp):
    w4, t4 = sharegpt_turns(tmp)
    if not w4.report.tokenizer.startswith("estimate"):
        pytest.skip("tiktoken's data is on this machine: the estimate is not used")
    w2, t2 = sharegpt_turns(tmp, chars_per_token_estimate=2)
    assert sum(t.input_tokens for t in t2) > 1.9 * sum(t.input_tokens for t in t4)
    assert "chars/2" in w2.report.tokenizer


def p_validation_limit(key, flag, over):
    def check(tmp):
        if flag != "gpu_mem_gb":  # a GPU tier needs CUDA; the limit is checked before that
            prepared(tmp, **{flag: over})  # no limit: fine
        with pytest.raises(ConfigError, match=f"exceeds validation_limits.{key}"):
            prepared(tmp, **{flag: over}, validation_limits={key: over / 2})

    return check


PROBES["validation_limits.max_users"] = p_validation_limit("max_users", "num_users", 8)
PROBES["validation_limits.max_duration_seconds"] = p_validation_limit("max_duration_seconds", "duration", 4)
PROBES["validation_limits.max_cpu_memory_gb"] = p_validation_limit("max_cpu_memory_gb", "cpu_mem_gb", 0.002)
PROBES["validation_limits.max_gpu_memory_gb"] = p_validation_limit("max_gpu_memory_gb", "gpu_mem_gb", 1)


def test_every_config_key_has_a_probe():
    assert all_keys() - set(PROBES) == set()


# The autoscaler's probes read decisions made from measured saturation and throughput: another test's load beside
# them moves those (capacity mode saw its throughput fall while a parallel tier ran), so they run alone; so does the
# scheduler's, which counts what a saturated 2 s run completes per class (a loaded machine starved a class once).
TIMED = {k for k in all_keys() if k.startswith(("autoscaler", "enable_autoscaling", "target_saturation"))}
TIMED.add("qos_scheduler")


def _marks(key: str) -> tuple:
    if key in NO_BENCH:
        return ()
    return (pytest.mark.slow, pytest.mark.serial) if key in TIMED else (pytest.mark.slow,)


@pytest.mark.parametrize("key", [pytest.param(k, marks=_marks(k)) for k in sorted(all_keys())])
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
    with pytest.raises(ConfigError, match=r"rag\.top_kk"):
        prepared(tmp_path, rag={"top_kk": 3})
