"""The MLPerf reference's config.yaml (a fixture of the same shape: tests/replay/data/mlperf_reference_config.yaml) is
accepted by `kvtier bench --config` unchanged, each key lands where its meaning is, and --precondition does what the
spec says (2x the capacity written, never more than the capacity on disk)."""

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from bench_helpers import run

from kvconnector.errors import ConfigError
from replay.synthetic.config import load_config
from replay.synthetic.mlperf_config import REFERENCE_KEYS, UNUSED
from replay.synthetic.payload import RandomPayload
from replay.synthetic.precondition import ALIGN, default_threads, plan, precondition

FIXTURE = Path(__file__).parent / "data" / "mlperf_reference_config.yaml"
KVTIER = [sys.executable, "-m", "replay.cli", "bench"]

# Reference leaf key -> where kvtier keeps its value (attribute path; "*" is the same name below the section).
RENAMED = {
    "context_range": "context_tokens",
    "generation_range": "generate_tokens",
    "think_time_range": "think_time_s",
    "target_latency_p95_ms": "target_p95_ms",
    "target_latency_p99_ms": "target_p99_ms",
    "target_latency_p999_ms": "target_p999_ms",
    "target_latency_p9999_ms": "target_p9999_ms",
    "system_prompt_hit_probability": "probability",
    "chunk_size_tokens": "chunk_tokens",
    "top_k_chunks": "top_k",
    "request_probability": "probability",
    "max_turns_per_conv": "max_turns",
    "end_conversation_probability": "end_probability",
    "kv_dim_per_head": "head_dim",
}


def leaves(d, path=()):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from leaves(v, (*path, k))
        else:
            yield (*path, k), v


def lookup(cfg, path):
    obj = cfg
    for part in path:
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, RENAMED.get(part, part))
    return obj


def test_the_reference_config_loads_and_every_key_lands_where_its_meaning_is():
    raw = yaml.safe_load(FIXTURE.read_text())
    cfg = load_config(str(FIXTURE), {})
    converted = {"generation_timing", "qos_distribution", "dtype"}
    for path, value in leaves(raw):
        if path[0] in converted or path[-1] in converted:
            continue
        got = lookup(cfg, path)
        assert (list(got) if isinstance(got, tuple) else got) == value, path
    # the two keys of another form, and a model's dtype
    assert cfg.generation.ms_per_token == {"none": 0.0, "fast": 2.0, "realistic": 30.0}
    assert cfg.qos_distribution == pytest.approx({"interactive": 0.15, "responsive": 0.35, "batch": 0.5})
    assert cfg.kv_dtype == "fp16"  # tiny-1b's dtype: float16
    assert cfg.qos_profiles["batch"].targets() == {95.0: 1000, 99.0: 5000, 99.9: 7500, 99.99: 10000}
    # the reference's shape keys give the same bytes per token as kvtier's catalog (qwen3-32b: head_dim 128 given)
    from replay.models import CATALOG, ModelSpec

    for name in ("tiny-1b", "llama3.1-8b", "llama3.1-70b-instruct", "deepseek-v3"):
        spec = ModelSpec(name, **cfg.model_configs[name].spec_fields(name))
        assert spec.bytes_per_token("fp16") == CATALOG[name].bytes_per_token("fp16"), name
        assert spec.max_context_tokens == CATALOG[name].max_context_tokens


def test_every_reference_key_is_in_the_readme_table():
    """Each key of the fixture has its row in REFERENCE_KEYS (by name, or its section's `.*` row), and each row is in
    the README's table."""
    rows = {}  # section -> names its rows list ("*" for a whole section)
    for key, _, _ in REFERENCE_KEYS:
        first, *more = key.split(" / ")
        section, name = first.split(".")[0], first.split(".")[-1]
        rows.setdefault(section, set()).update([name, *more])
    for path, _ in leaves(yaml.safe_load(FIXTURE.read_text())):
        assert path[-1] in rows.get(path[0], ()) or "*" in rows.get(path[0], ()), path
    readme = (Path(__file__).parents[2] / "replay" / "synthetic" / "README.md").read_text()
    for key, _, _ in REFERENCE_KEYS:
        assert f"`{key}`" in readme, key


def test_both_names_work_the_flag_wins_and_unknown_keys_stay_errors(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"rag": {"top_k_chunks": 7}}))
    assert load_config(str(path), {}).rag.top_k == 7
    assert load_config(str(path), {"rag_top_k": 2}, {"rag_top_k": ("rag", "top_k")}).rag.top_k == 2
    bad = [
        ({"rag": {"top_k_chunkz": 3}}, r"rag\.top_k_chunkz: Extra inputs"),
        (
            {
                "user_templates": {
                    "c": {"context_range": [1, "x"], "generation_range": [1, 2], "think_time_range": [0, 0]}
                }
            },
            r"user_templates\.c\.context_range\[1\]",
        ),
        ({"generation_timing": {"fast": -1}}, r"generation_timing\.fast: expected seconds per token"),
        (
            {"qos_distribution": {"interactive_probability": 0.6, "responsive_threshold": 0.5}},
            "interactive_probability",
        ),
        ({"qos_distribution": {"interactive_probability": 0.1, "batch": 0.5}}, "not both"),
        ({"generation_timing": {"fast": 0.001}, "generation": {"ms_per_token": {"fast": 1}}}, "not both"),
        ({"model_configs": {"m": {"num_layers": 2, "hidden_dim": 100, "num_heads": 3}}}, "not a multiple"),
    ]
    for data, match in bad:
        path.write_text(yaml.safe_dump(data))
        with pytest.raises(ConfigError, match=match):
            load_config(str(path), {})


def test_a_kv_dtype_given_wins_over_the_model_dtype(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        yaml.safe_dump(
            {"model_configs": {"tiny-1b": {"num_layers": 12, "kv_heads": 4, "head_dim": 128, "dtype": "int8"}}}
        )
    )
    assert load_config(str(path), {}).kv_dtype == "int8"
    assert load_config(str(path), {"kv_dtype": "bf16"}).kv_dtype == "bf16"


@pytest.mark.slow
def test_p999_and_p9999_targets_decide_the_sla(tmp_path):
    # p95 and p99 targets of an hour are met by any run; a 1 us p99.99 target is not
    loose = {"priority": 1, "target_latency_p95_ms": 3.6e6, "target_latency_p99_ms": 3.6e6}

    def met(**extra):
        q = run(tmp_path, qos_profiles={"c": {**loose, **extra}}, qos_distribution={"c": 1.0}, duration=1)
        return q["summary"]["qos_metrics"]["c"]["sla"]["met"]

    assert met() is True
    assert met(target_latency_p9999_ms=0.001) is False
    assert met(target_latency_p999_ms=0.001) is False


@pytest.mark.slow
def test_the_reference_config_runs_unchanged_and_names_the_keys_it_does_not_use(tmp_path):
    out = tmp_path / "r.json"
    p = subprocess.run(
        KVTIER
        + ["--config", str(FIXTURE), "--model", "tiny-1b", "--num-users", "4", "--duration", "2", "--seed", "42"]
        + ["--gpu-mem-gb", "0", "--cpu-mem-gb", "0", "--storage-capacity-gb", "0.05", "--generation-mode", "none"]
        + ["--cache-dir", str(tmp_path / "c"), "--output", str(out), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    unused = [f"{s}.{k}" for s, keys in UNUSED.items() for k in keys]
    note = next(line for line in p.stderr.splitlines() if "does not use" in line)
    assert all(k in note for k in unused)
    doc = json.loads(out.read_text())
    assert doc["status"] == "completed" and doc["summary"]["total_requests"] > 0
    assert doc["config"]["qos_profiles"]["interactive"]["target_p999_ms"] == 150
    assert doc["model"]["bytes_per_token"] == 24_576


# ---- --precondition ------------------------------------------------------------------------------------------------
def on_disk(directory: str) -> int:
    """Bytes the files under `directory` occupy (du)."""
    total = 0
    for root, _, files in os.walk(directory):
        for f in files:
            try:
                total += os.stat(os.path.join(root, f)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


@pytest.mark.parametrize("direct", [False, True])
def test_precondition_writes_twice_the_capacity_never_holding_more(tmp_path, direct):
    from kvconnector.timed_io import O_DIRECT, probe_direct

    if direct and not (O_DIRECT and probe_direct(str(tmp_path))):
        pytest.skip("O_DIRECT is not available on this filesystem")
    capacity = 24 * ALIGN
    size, span = plan(0, capacity, free_bytes=10 * capacity)
    assert (size, span) == (2 * capacity, capacity)
    peak, free_drop, stop = [0], [0], threading.Event()
    free0 = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize

    def watch():
        while not stop.is_set():
            peak[0] = max(peak[0], on_disk(str(tmp_path / "pc")))
            st = os.statvfs(tmp_path)
            free_drop[0] = max(free_drop[0], free0 - st.f_bavail * st.f_frsize)
            time.sleep(0.002)

    w = threading.Thread(target=watch)
    w.start()
    try:
        got = precondition(str(tmp_path / "pc"), size, 3, RandomPayload(16, 1), direct=direct, span_bytes=span)
    finally:
        stop.set()
        w.join()
    assert got["bytes"] == 2 * capacity and got["file_bytes"] == capacity and got["passes"] == 2.0
    assert got["threads"] == 3 and "error" not in got
    # seen during the run: never above the capacity (plus the filesystem's extent blocks for the file)
    assert 0 < peak[0] <= capacity + 256 * 1024, peak
    # the filesystem as a whole (other processes write to it too): far from the 2x a file per pass would take
    assert free_drop[0] < 1.5 * capacity + 64 * ALIGN, free_drop
    assert os.listdir(tmp_path / "pc") == []  # removed afterwards


def test_precondition_plan_defaults_and_bounds():
    gb = 1 << 30
    assert plan(0, 10 * gb, free_bytes=100 * gb) == (20 * gb, 10 * gb)  # 2x the tier over a file of the tier
    assert plan(0, 100 * gb, free_bytes=50 * gb)[1] <= 0.95 * 50 * gb  # a tier of all the free space still fits
    assert plan(10**9, 10 * gb, free_bytes=100 * gb) == (1e9, 1e9 // ALIGN * ALIGN)  # a smaller volume: one pass
    with pytest.raises(ConfigError, match="no room"):
        plan(0, 10 * gb, free_bytes=ALIGN // 2)
    assert default_threads() == os.cpu_count()


@pytest.mark.slow
def test_the_specs_combined_precondition_command_runs(tmp_path):
    """The spec's "rigorous SSD write testing" command (section 4), with a shorter window and a small disk tier so the
    test writes 2 x 0.064 GiB instead of 2x this machine's free space. It exited 2 before (2x the tier > free space)."""
    out = tmp_path / "r.json"
    p = subprocess.run(
        KVTIER
        + ["--precondition", "--prefill-only", "--disable-multi-turn", "--disable-prefix-caching"]
        + ["--gpu-mem-gb", "0", "--cpu-mem-gb", "0", "--model", "llama3.1-70b-instruct", "--num-users", "100"]
        + ["--duration", "2", "--cache-dir", str(tmp_path / "c"), "--storage-capacity-gb", "0.064"]
        + ["--output", str(out), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    doc = json.loads(out.read_text())
    pc = doc["setup"]["precondition"]
    tier = int(0.064 * 2**30)  # the reference's unit: --storage-capacity-gb is GiB
    # 2x the tier; O_DIRECT writes whole pages, so each writer may stop short of its share by less than a page
    assert 2 * tier - 4096 * pc["threads"] < pc["bytes"] <= 2 * tier and pc["file_bytes"] <= tier
    assert pc["threads"] == os.cpu_count()
    assert doc["summary"]["decode_stats"]["reads"] == 0 and doc["tiers"]["disk"]["read"]["ops"] == 0
