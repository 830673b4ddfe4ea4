"""Small, fast `kvtier bench` runs for tests: a 2 KiB/token model and short user templates via config.yaml.

These runs use kvtier's own request model and sizes in GB (10^9 B), not the defaults (the MLPerf reference's
request model, sizes in GiB): the tests built on them are about kvtier's model and state sizes in 10^9 B. A test of
the reference's semantics passes request_model / size_unit itself (or does not use these helpers)."""

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
    """Run in-process through the same path as the CLI; return the results document."""
    from replay.synthetic.cli import main

    path = write_config(tmp_path, **overrides)
    rc = main(["--config", path, *flags])
    doc = json.loads((tmp_path / "out.json").read_text())
    doc["_rc"] = rc
    return doc


def prepared(tmp_path, *flags, **overrides) -> Bench:
    args = build_parser().parse_args(["--config", write_config(tmp_path, **overrides), *flags])
    bench = Bench(config_from_args(args))
    bench.prepare()
    return bench
