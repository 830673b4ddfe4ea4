"""The Prometheus configuration of a running stack, from its endpoints.json: `run-stack.sh up --prometheus` writes it.

One scrape job per component (vllm, lmcache, kvtier), one target per instance or node, each target labelled
`stack_instance` with the instance's index, which the recording rules (prometheus/kvtier-rules.yml beside this file)
keep so one instance's vLLM, LMCache and kvtier series line up. Prometheus's own `instance` label stays host:port.
What is scraped follows what runs: LMCache's MP server only in mp mode, kvtier's exporter only with --l2 kvtier.

    python -m deploy.prometheus_config STATE/endpoints.json --interval 5 > STATE/prometheus/prometheus.yml
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from . import SCRIPTS

RULES = SCRIPTS / "prometheus" / "kvtier-rules.yml"


def scrape_targets(endpoints: dict) -> dict[str, list[tuple[int, str]]]:
    """{job: [(instance index, metrics URL)]} of what the stack runs."""
    jobs: dict[str, list[tuple[int, str]]] = {"vllm": [], "lmcache": [], "kvtier": []}
    for i, inst in enumerate(endpoints["instances"]):
        jobs["vllm"].append((i, inst["vllm"] + "/metrics"))
        if endpoints.get("mode") == "mp":
            jobs["lmcache"].append((i, inst["lmcache_metrics"]))
        if endpoints.get("l2") == "kvtier":
            jobs["kvtier"].append((i, inst["kvtier_metrics"]))
    return {job: targets for job, targets in jobs.items() if targets}


def config(endpoints: dict, interval_s: float, rules: Path = RULES) -> dict:
    """The prometheus.yml of the stack: every target every `interval_s`, the rules evaluated as often."""
    every = f"{int(interval_s * 1000)}ms"
    jobs = []
    for job, targets in scrape_targets(endpoints).items():
        statics = []
        paths = set()
        for i, url in targets:
            u = urlsplit(url)
            paths.add(u.path or "/metrics")
            statics.append({"targets": [u.netloc], "labels": {"stack_instance": str(i)}})
        if len(paths) != 1:  # one job, one path: run-stack.sh gives every instance the same
            raise ValueError(f"{job}: targets with different paths {sorted(paths)}")
        jobs.append({"job_name": job, "metrics_path": paths.pop(), "static_configs": statics})
    return {
        "global": {"scrape_interval": every, "evaluation_interval": every, "scrape_timeout": every},
        "rule_files": [str(rules)],
        "scrape_configs": jobs,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m deploy.prometheus_config", description=__doc__.split("\n\n")[0])
    p.add_argument("endpoints", type=Path, help="the stack's endpoints.json")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between scrapes and rule evaluations [5]")
    a = p.parse_args(argv)
    if not a.interval > 0:
        p.error("--interval must be > 0")
    yaml.safe_dump(config(json.loads(a.endpoints.read_text()), a.interval), sys.stdout, sort_keys=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
