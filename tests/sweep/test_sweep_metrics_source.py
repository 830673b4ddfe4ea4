"""Where `kvtier sweep --driver replay` has each point's replay read the server's figures: every instance's vLLM
/metrics page, the stack's Prometheus when run-stack.sh started one, or what the user gave after `--`."""

from __future__ import annotations

from pathlib import Path

from deploy.stack import Stack
from deploy.sweep.cli import _driver_argv

INSTANCES = [{"vllm": "http://127.0.0.1:8001"}, {"vllm": "http://127.0.0.1:8002"}]


def _metrics_urls(endpoints: dict, args: list[str]) -> list[str]:
    stack = Stack(Path("/nonexistent"), {"vllm": "http://127.0.0.1:8000", "model": "tiny", **endpoints})
    argv = _driver_argv("replay", args, "/mnt", "out.json", stack)
    return [argv[i + 1] for i, a in enumerate(argv) if a == "--metrics-url"]


def test_every_vllm_page_without_a_prometheus():
    urls = _metrics_urls({"instances": INSTANCES, "prometheus": None}, [])
    assert urls == ["http://127.0.0.1:8001/metrics", "http://127.0.0.1:8002/metrics"]


def test_the_stacks_prometheus_when_it_runs_one():
    urls = _metrics_urls({"instances": INSTANCES, "prometheus": "http://127.0.0.1:8120"}, [])
    assert urls == ["prometheus+http://127.0.0.1:8120"]


def test_the_users_metrics_url_wins():
    mine = 'prometheus+http://prom.example:9090?match={job=~"vllm"}'
    urls = _metrics_urls({"instances": INSTANCES, "prometheus": "http://127.0.0.1:8120"}, ["--metrics-url", mine])
    assert urls == [mine]
