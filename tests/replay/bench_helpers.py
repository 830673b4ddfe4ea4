"""Small, fast `kvtier bench` runs for tests: a 2 KiB/token model and short user templates via config.yaml.

These runs use kvtier's own request model and sizes in GB (10^9 B), not the defaults (the MLPerf reference's
request model, sizes in GiB): the tests built on them are about kvtier's model and state sizes in 10^9 B. A test of
the reference's semantics passes request_model / size_unit itself (or does not use these helpers)."""

import csv
import json

import yaml

from replay.synthetic.bench import Bench
from replay.synthetic.cli import build_parser, config_from_args

SMALL_MODEL = {"num_layers": 4, "kv_heads": 2, "head_dim": 64}  # 2,048 B/token in bf16

FAST_TEMPLATES = {
    "chatbot": {"context_tokens": [64, 256], "generate_tokens": [16, 64], "think_time_s": [0.0, 0.02]},
    "coding": {"context_tokens": [256, 1024], "generate_tokens": [16, 96], "think_time_s": [0.0, 0.02]},
}


# Sections merge with what is already set; name-keyed mappings (user_templates, qos_profiles, ...) replace it.
SECTIONS = {"eviction", "prefix_cache", "rag", "conversation", "autoscaler", "decode", "generation", "sharegpt"}


def write_config(tmp_path, **overrides) -> str:
    cfg = {
        "model": "small",
        "model_configs": {"small": SMALL_MODEL},
        "user_templates": FAST_TEMPLATES,
        "request_model": "kvtier",
        "size_unit": "GB",
        "gpu_mem_gb": 0,
        "cpu_mem_gb": 0.002,
        "storage_capacity_gb": 0.2,
        "random_buffer_mb": 16,
        "duration": 1.5,
        "num_users": 4,
        "seed": 11,
        "progress": False,
        "cache_dir": str(tmp_path / "cache"),
        "output": str(tmp_path / "out.json"),
    }
    for k, v in overrides.items():
        if k in SECTIONS and isinstance(cfg.get(k), dict):  # a section: override its keys, keep the others
            cfg[k] = {**cfg[k], **v}
        else:
            cfg[k] = v
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def run(tmp_path, *flags, **overrides) -> dict:
    """Run in-process through the same path as the CLI; return the results document. Probes run several times in one
    folder: the previous run's results file is removed first, so a run that wrote none fails here instead of
    handing back the earlier run's document."""
    from replay.synthetic.cli import main

    path = write_config(tmp_path, **overrides)
    out = tmp_path / "out.json"
    out.unlink(missing_ok=True)
    rc = main(["--config", path, *flags])
    assert out.exists(), f"kvtier bench exited {rc} and wrote no results"
    doc = json.loads(out.read_text())
    doc["_rc"] = rc
    return doc


def prepared(tmp_path, *flags, **overrides) -> Bench:
    args = build_parser().parse_args(["--config", write_config(tmp_path, **overrides), *flags])
    bench = Bench(config_from_args(args))
    bench.prepare()
    return bench


def write_sharegpt(path, n=3, turns=3):
    """A small ShareGPT file: n conversations of `turns` turns, the last one cut short as in the public copy."""
    convs = []
    for i in range(n):
        msgs = []
        for t in range(turns):
            msgs.append({"from": "human", "value": f"question {i}.{t} " + "word " * (40 + 10 * t)})
            msgs.append({"from": "gpt", "value": "answer " * (30 + t)})
        convs.append({"id": f"c{i}", "conversations": msgs})
    text = json.dumps(convs)
    path.write_text(text[:-40])  # truncated like the real copy: the last conversation is damaged
    return path


def write_burstgpt(path, with_sessions=True):
    """A small BurstGPT trace: 4 sessions of 3 conversation turns, then one failed API request."""
    rows = []
    t = 0.0
    for s in range(4):
        for turn in range(3):
            rows.append(
                {
                    "Timestamp": round(t, 3),
                    "Model": "ChatGPT",
                    "Request tokens": 100 + 150 * turn,
                    "Response tokens": 40,
                    "Total tokens": 140 + 150 * turn,
                    "Log Type": "Conversation log",
                    "Session ID": f"s{s}",
                    "Elapsed time": 1.0,
                }
            )
            t += 0.1
    rows.append(
        {
            "Timestamp": round(t, 3),
            "Model": "GPT-4",
            "Request tokens": 50,
            "Response tokens": 0,
            "Total tokens": 50,
            "Log Type": "API log",
            "Session ID": "failed",
            "Elapsed time": 0,
        }
    )
    fields = (
        list(rows[0])
        if with_sessions
        else ["Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type"]
    )
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    return path


# --prefix-model chained runs: a 256 B/token model and fixed turns, so a run of nine rounds takes seconds
TINY = {"tiny": {"num_layers": 1, "kv_heads": 1, "head_dim": 64}}  # 256 B/token in bf16: a 256-token block is 64 KiB
# Every turn adds 256 input and 256 answer tokens: two blocks per session per round.
FIXED = {"chat": {"context_tokens": [256, 256], "generate_tokens": [256, 256], "think_time_s": [0, 0]}}
# 0.8 x 4 MB of CPU tier = 48 blocks: 8 sessions x 2 blocks x 3 rounds, so the working set crosses it in round 4.
CPU_GB = 0.004


def chained_run(tmp, **kw) -> dict:
    cfg = {
        "model": "tiny",
        "model_configs": TINY,
        "user_templates": FIXED,
        "prefix_model": "chained",
        "block_size": 256,
        "rounds": 9,
        "num_users": 8,
        "duration": 120,
        "cpu_mem_gb": CPU_GB,
        "storage_capacity_gb": 0.05,
        **kw,
    }
    tmp.mkdir(parents=True, exist_ok=True)
    doc = run(tmp, **cfg)
    assert doc["_rc"] == 0 and doc["status"] == "completed", doc.get("error")
    return doc


def saturated_run(tmp_path, **overrides) -> dict:
    # One I/O worker and users that never think: storage is the bottleneck for the whole run.
    templates = {n: {**t, "think_time_s": [0.0, 0.0]} for n, t in FAST_TEMPLATES.items()}
    cfg = dict(
        num_users=12,
        io_workers=1,
        duration=3,
        disable_prefix_caching=True,
        user_templates=templates,
        qos_distribution={"interactive": 1, "responsive": 1, "batch": 1},
    )
    cfg.update(overrides)
    return run(tmp_path, **cfg)
