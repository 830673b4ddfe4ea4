"""`kvtier replay`'s configuration: the validated model (`ReplayConfig`) fed by flags, a YAML file and
KVTIER_REPLAY_* variables, and the command line that fills it (`build_parser`, `load_config`)."""

from __future__ import annotations

import argparse
import math
import urllib.parse
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from replay.sources.base import WorkloadError
from replay.sources.block_traces import MAX_BLOCK_TOKENS
from replay.sources.registry import (
    MIN_TRACE_SPEEDUP,
    REPLAY_READS,
    check_paced,
    check_reads,
    check_source,
    source_names,
)
from replay.sources.target_hit_rate import DEFAULT_BLOCK_TOKENS, TargetShape, shape_for
from replay.sources.trace_timing import DEFAULT_MAX_IDLE_S, TIMINGS

from ..common.cli import (
    OneLineParser,
)
from ..common.settings import documented, load_settings
from .client import api_root
from .prometheus_source import is_prometheus_url, parse_prometheus_url

PROG = "kvtier replay"

EXAMPLES = """examples:
  # ShareGPT multi-turn sessions (server answers appended), Poisson arrivals of sessions at 2/s
  kvtier replay --base-url http://127.0.0.1:8000 --model M --source sharegpt \\
      --dataset-path ShareGPT_V3.json --num-requests 200 --request-rate 2 --output out.json --plots plots/
  # BurstGPT trace at 10x speed, prompts sized with the server's /tokenize
  kvtier replay --base-url http://127.0.0.1:8000 --model M --source burstgpt \\
      --trace-path 'BurstGPT_*.csv' --trace-speedup 10 --duration 300 --output bg.json --detail bg.jsonl
  # a Mooncake trace (block hashes): prompts that share the trace's prefixes, its 512-token blocks as 16 tokens
  kvtier replay --base-url http://127.0.0.1:8000 --model M --endpoint completions --source mooncake \\
      --dataset-path conversation_trace.jsonl --trace-block-tokens 16 --trace-speedup 10 --output mc.json
  # long sessions: 16 sessions x 20 rounds, 128 output tokens each, per-round hit-rate table
  kvtier replay --base-url http://127.0.0.1:8000 --model M --source synthetic --rounds 20 --concurrency 16 \\
      --output-len 128 --metrics-url http://127.0.0.1:8000/metrics --output long.json
  # the server-side figures from a Prometheus that scrapes the servers (the one deploy/run-stack.sh starts, or
  # yours: match= keeps the series of the servers this run drives)
  kvtier replay --base-url http://127.0.0.1:8000 --model M --num-requests 200 --request-rate 4 --output p.json \
      --metrics-url 'prometheus+http://127.0.0.1:9090?match={job=~"vllm|lmcache|kvtier"}'
  # sessions made to hit 60% of their prompt tokens in a 2M-token prefix cache (measured beside the target)
  kvtier replay --base-url http://127.0.0.1:8000 --model M --endpoint completions --target-hit-rate 0.6 \
      --cache-tokens 2e6 --input-len 2048 --users 8 --metrics-url http://127.0.0.1:8000/metrics --output hr.json
  # synthetic open loop, bursty (gamma, burstiness 0.5), SLO goodput
  kvtier replay --base-url http://127.0.0.1:8000 --model M --source synthetic --input-len 512 --output-len 64 \\
      --num-requests 500 --request-rate 20 --burstiness 0.5 --slo ttft_ms=500,tpot_ms=50 --output syn.json
  # four load generators on two hosts, one merged result: sessions split among the ranks (a session stays on one),
  # --max-concurrency 64 in all (16 a rank); see replay/openai/README.md
  mpirun -n 4 -H a:2,b:2 kvtier replay --base-url http://srv:8000 --model M --source sharegpt \\
      --dataset-path sg.json --num-requests 2000 --request-rate 20 --max-concurrency 64 --output job.json
Under mpirun or srun (found from OMPI_COMM_WORLD_SIZE, PMI_SIZE or SLURM_STEP_NUM_TASKS, no flag needed) each rank
sends its share of the one schedule: sessions round robin by index (a single-turn source's requests one by one);
--max-concurrency, --users and --warmup are the job's totals, divided among the ranks; --request-rate and
--num-requests are the job's; rank 0 alone scrapes --metrics-url and writes every output, merged (each rank's own
figures under `ranks`). Not with --rounds.
The API key, if the server needs one, comes from $OPENAI_API_KEY (or the variable named by --api-key-env).
Options come from flags, KVTIER_REPLAY_<KEY> environment variables (KVTIER_REPLAY_SEED=3) and a --config YAML file
(seed: 3); precedence: defaults < --config < environment < flags. A bad value is one line naming where it came from.
--base-url is the server root; the OpenAI SDK's form with a trailing /v1 is accepted too.

exit status: 0 when at least one request completed and no more requests failed than completed (requests the run
cancelled itself, at the end of --duration or on Ctrl-C, are not failures); 1 when no request completed or more
failed than completed (the summary's errors_by_kind and run_failed say why); 2 for a usage error (one line, nothing
written; every output path is checked before the run); 3 when the run stopped early because the server went away;
128 + signal when stopped by SIGINT (130, Ctrl-C) or SIGTERM (143). Results are written in every case but 2; if
--output cannot be written at the end, they go to results/ (or the temp directory) and a line says where.
"""


def _comma_list(v: Any) -> Any:
    """'50,90,99' (a flag, a variable) -> ['50', '90', '99']; a YAML list passes; one number is a list of one."""
    if isinstance(v, str):
        return [x.strip() for x in v.split(",") if x.strip()]
    return [v] if isinstance(v, (int, float)) else v


def _key_values(v: Any) -> Any:
    """'ttft_ms=500,tpot_ms=50' -> {'ttft_ms': '500', 'tpot_ms': '50'}; a YAML mapping passes."""
    if not isinstance(v, str):
        return v
    out = {}
    for part in filter(None, (p.strip() for p in v.split(","))):
        key, sep, val = part.partition("=")
        if not sep:
            raise ValueError(f"expected KEY=MS pairs like ttft_ms=500,tpot_ms=50, got {part!r}")
        out[key.strip()] = val.strip()
    return out


def _dataset_or_count(v: Any) -> Any:
    """max_tokens: 'dataset' or a whole number of tokens >= 1 (a flag gives it as text). Checked here, before the
    union, so a bad value is one message rather than one per member of the union."""
    if isinstance(v, str) and v.strip().isdigit():
        v = int(v)
    if v != "dataset" and not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
        raise ValueError(f"must be 'dataset' or a whole number >= 1, got {v!r}")
    return v


def _one_or_many(v: Any) -> Any:
    return [v] if isinstance(v, str) else v


Count = Annotated[int, Field(ge=1)]
Percentile = Annotated[float, Field(gt=0, lt=100)]
SloKey = Literal["ttft_ms", "tpot_ms", "e2el_ms", "itl_ms"]


def _check_url(flag: str, url: str) -> None:
    """A URL a request can be sent to: a host, a port in 1..65535 when one is given, no query or fragment."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port  # ValueError when out of range or not a number
    except ValueError as exc:
        raise ValueError(f"{flag} {url!r}: {exc}") from None
    if not parts.hostname:
        raise ValueError(f"{flag} {url!r}: no host")
    if port == 0:
        raise ValueError(f"{flag} {url!r}: port 0 is no server's port")
    if parts.query or parts.fragment:
        raise ValueError(f"{flag} {url!r}: the server root takes no query or fragment")


class ReplayConfig(BaseModel):
    """Every option of a replay, validated once; loaded by replay.common.settings as bench's is (defaults < --config
    YAML < KVTIER_REPLAY_<KEY> environment < flags). Unknown keys are errors; inf and nan are no value's
    (request_rate's inf, 'all at once', excepted)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    base_url: str
    model: str
    endpoint: Literal["chat", "completions"] = "chat"
    api_key_env: str = "OPENAI_API_KEY"
    source: Literal[source_names()] = "synthetic"  # type: ignore[valid-type]
    dataset_path: str | None = None
    trace_path: str | None = None
    trace_speedup: float = Field(1.0, ge=MIN_TRACE_SPEEDUP)
    trace_block_tokens: int | None = Field(None, ge=1, le=MAX_BLOCK_TOKENS)
    trace_timing: Literal[TIMINGS] = "timestamps"  # type: ignore[valid-type]
    max_idle_s: float = Field(DEFAULT_MAX_IDLE_S, gt=0)
    num_requests: Count | None = None
    duration: float | None = Field(None, gt=0)
    request_rate: float = Field(math.inf, ge=0, allow_inf_nan=True)
    arrival: Literal["poisson", "gamma", "constant"] | None = None
    burstiness: float = Field(1.0, gt=0)
    max_concurrency: Count | None = None
    users: Count | None = None
    think_time_ms: float = Field(0.0, ge=0)
    rounds: Count | None = None
    concurrency: Count | None = None
    output_len: Count = 128
    input_len: Count = 256
    # --source hit-rate (given --target-hit-rate, it is the source): sessions whose prefix hit rate at a cache of
    # cache_tokens is the target (replay/sources/target_hit_rate.py)
    target_hit_rate: float | None = Field(None, ge=0, le=1)
    cache_tokens: float | None = Field(None, gt=0)
    # vLLM's random dataset: lengths uniform in L*(1-r)..L*(1+r), so r below 1 (at 1 a prompt could be empty).
    range_ratio: float = Field(0.0, ge=0, lt=1)
    # The longest prompt the run may send, in tokens: a dataset row above it is cut to it (and counted), a
    # synthetic workload whose prompts outgrow it is refused up front. 131,072 is Llama 3.1's context length
    # (max_position_embeddings of its config.json); raise it for a model with a longer context.
    max_prompt_tokens: Count = 131_072
    prefix_len: int = Field(0, ge=0)
    prefix_groups: Count = 1
    turns: Count = 1
    max_tokens: Annotated[Literal["dataset"] | int, BeforeValidator(_dataset_or_count)] = "dataset"
    max_tokens_cap: Count | None = 2048
    ignore_eos: bool = False
    metrics_url: Annotated[list[str], BeforeValidator(_one_or_many)] = []
    metrics_interval: float = Field(5.0, gt=0)
    kv_bytes_per_token: float | None = Field(None, gt=0)
    kv_bytes_metric: str | None = None
    block_size: Count | None = None
    slo: Annotated[dict[SloKey, Annotated[float, Field(gt=0)]], BeforeValidator(_key_values)] = {}
    percentiles: Annotated[tuple[Percentile, ...], Field(min_length=1), BeforeValidator(_comma_list)] = (
        50.0,
        90.0,
        95.0,
        99.0,
    )
    warmup: int = Field(0, ge=0)
    seed: int = Field(0, ge=0)
    request_timeout: float = Field(600.0, gt=0)
    # A request's whole time, first byte to last: a stream that trickles (a keep-alive comment or a byte now and
    # then) never trips the idle --request-timeout, so this ends it.
    request_max_time: float = Field(1800.0, gt=0)
    no_continuous_usage: bool = False
    output: str
    detail: str | None = None
    csv: str | None = None
    plots: str | None = None
    html_output: str | None = None
    quiet: bool = False

    def hit_rate_shape(self) -> TargetShape:
        """--source hit-rate's sessions at --cache-tokens (a WorkloadError when the target cannot be reached)."""
        return shape_for(
            self.target_hit_rate,
            self.cache_tokens,
            block_tokens=self.trace_block_tokens or DEFAULT_BLOCK_TOKENS,
            prompt_tokens=self.input_len,
            requests=self.num_requests,
        )

    def source_inputs(self) -> dict[str, str | None]:
        """The workload's input files by flag (None where not given)."""
        return {"--dataset-path": self.dataset_path, "--trace-path": self.trace_path}

    @model_validator(mode="after")
    def _check(self) -> ReplayConfig:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"--base-url must start with http:// or https://, got {self.base_url!r}")
        _check_url("--base-url", self.base_url)
        if self.base_url.rstrip("/").endswith("/completions"):
            raise ValueError(
                f"--base-url is the server root (e.g. http://127.0.0.1:8000), not an endpoint: "
                f"{self.base_url!r}; --endpoint picks chat or completions"
            )
        self.base_url = api_root(self.base_url)  # the one place a trailing /v1 is taken off
        if self.target_hit_rate is not None and self.source == "synthetic":
            self.source = "hit-rate"  # the target names the workload; no --source needed
        if self.source == "hit-rate" and (self.target_hit_rate is None or self.cache_tokens is None):
            raise ValueError("--source hit-rate needs --target-hit-rate R and --cache-tokens C (the server's cache)")
        source = check_source(self.source, self.source_inputs(), block_tokens=self.trace_block_tokens)
        check_reads(self, source, REPLAY_READS)
        if source.name == "hit-rate":
            try:
                self.hit_rate_shape()
            except WorkloadError as exc:
                raise ValueError(str(exc)) from None
        check_paced(source, bool(self.users or self.max_concurrency or self.rounds or math.isfinite(self.request_rate)))
        for url in self.metrics_url:
            if is_prometheus_url(url):
                parse_prometheus_url(url)  # a ValueError says what is wrong with it
            elif not url.startswith(("http://", "https://")):
                raise ValueError(
                    f"--metrics-url is a /metrics page (http://HOST:PORT/metrics) or a Prometheus "
                    f"(prometheus+http://HOST:PORT), got {url!r}"
                )
        if source.path_flag is None:  # synthetic: prompts of the lengths asked for
            rounds = self.rounds or self.turns  # each turn or round adds its input and the previous answer
            longest = (
                self.prefix_len
                + rounds * math.ceil(self.input_len * (1 + self.range_ratio))
                + (rounds - 1) * self.output_len
            )
            if longest > self.max_prompt_tokens:
                raise ValueError(
                    f"the synthetic prompts reach {longest:,} tokens (--prefix-len + --input-len x (1 + --range-ratio)"
                    f" per turn, plus the earlier answers), over --max-prompt-tokens {self.max_prompt_tokens:,}"
                )
        if self.trace_timing == "think" and self.users:
            raise ValueError("--users runs its own closed loop; --trace-timing think paces each session as the trace")
        if self.rounds is not None:
            if not self.concurrency:
                raise ValueError("--rounds needs --concurrency C (the number of sessions)")
            if self.source not in ("synthetic", "sharegpt"):
                raise ValueError(f"--rounds works with --source synthetic or sharegpt, not {self.source}")
        return self


ENV_PREFIX = "KVTIER_REPLAY_"


def build_parser() -> argparse.ArgumentParser:
    ap = OneLineParser(
        prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter, description=__doc__, epilog=EXAMPLES
    )

    def group(title: str):
        return documented(ap.add_argument_group(title).add_argument, ReplayConfig)

    g = group("server")
    g("--base-url", help="server root, e.g. http://127.0.0.1:8000")
    g("--model", help="model name the server serves")
    g("--endpoint", choices=["chat", "completions"], help="chat: /v1/chat/completions; completions: /v1/completions")
    g("--api-key-env", help="environment variable holding the API key")
    g("--request-timeout", type=float, help="seconds without data before a request fails")
    g("--request-max-time", type=float, help="seconds a request may take in all, however its data trickles")
    g(
        "--no-continuous-usage",
        action="store_true",
        default=None,
        help="do not ask for per-chunk usage (for servers that reject stream_options.continuous_usage_stats)",
    )
    g = group("workload")
    g(
        "--source",
        choices=source_names(),
        help="where the requests come from (mooncake and the other block-hash traces: prompts sharing its prefixes; "
        "servegen has no times: give --users N)",
    )
    g("--dataset-path", help="ShareGPT JSON file; a block-hash trace's file (weka: also a directory)")
    g("--trace-path", help="BurstGPT CSV file, directory or glob (block-hash traces: --dataset-path)")
    g(
        "--trace-block-tokens",
        type=int,
        help="block-hash traces: their block as N tokens, every length scaled with it (fit a small model)",
    )
    g("--trace-speedup", type=float, help="divide trace timestamps by this (2 = twice as fast); think: its pauses")
    g(
        "--trace-timing",
        choices=list(TIMINGS),
        help="block-hash traces: timestamps (open loop, each request at its time) or think (a trace with sessions, "
        "weka: each call its think time after the previous call of its session ended, sub-agents joined)",
    )
    g(
        "--max-idle-s",
        type=float,
        help="with --trace-timing think: cap each pause at this many seconds (past a minute it is a person away, not "
        "an agent thinking)",
    )
    g("--num-requests", type=int, help="stop after this many requests (turns)")
    g(
        "--duration",
        type=float,
        help="run window in seconds: nothing is scheduled or started after it; requests in flight get 2 s",
    )
    g("--input-len", type=int, help="synthetic and hit-rate: input tokens per turn")
    g("--output-len", type=int, help="synthetic, hit-rate and long sessions: output tokens")
    g("--range-ratio", type=float, help="synthetic: lengths uniform in L*(1-r)..L*(1+r); 0 = fixed")
    g("--prefix-len", type=int, help="synthetic: shared prefix tokens per group")
    g(
        "--max-prompt-tokens",
        type=int,
        help="the longest prompt sent: longer dataset rows are cut to it and counted, a synthetic "
        "workload that outgrows it is refused",
    )
    g("--prefix-groups", type=int, help="synthetic: number of shared-prefix groups")
    g("--turns", type=int, help="synthetic: turns per session")
    g(
        "--target-hit-rate",
        type=float,
        help="the hit-rate source: sessions made so that their prefix hit rate in a cache of --cache-tokens is this "
        "fraction (ten turns a session unless a number of requests is given); the summary shows the rate measured",
    )
    g(
        "--cache-tokens",
        type=float,
        help="the server's prefix cache in tokens, for --target-hit-rate (vLLM: num_gpu_blocks x block_size)",
    )
    g("--max-tokens", help="'dataset' (the dataset's answer length) or a fixed number")
    g("--max-tokens-cap", type=int, help="upper bound on max_tokens from the dataset")
    g("--ignore-eos", action="store_true", default=None, help="force the full output length (vLLM)")
    g = group("arrivals")
    g("--request-rate", type=float, help="sessions per second; inf = all at once")
    g(
        "--arrival",
        choices=["poisson", "gamma", "constant"],
        help="arrival process (poisson; gamma when --burstiness != 1)",
    )
    g("--burstiness", type=float, help="gamma shape: <1 burstier, >1 smoother than Poisson")
    g(
        "--max-concurrency",
        type=int,
        help="at most this many requests in flight (under mpirun: in all, divided among the ranks); the wait is "
        "queue_ms",
    )
    g(
        "--users",
        type=int,
        help="closed loop: this many users, each sending its next turn after an answer (under mpirun: in all)",
    )
    g("--think-time-ms", type=float, help="pause between an answer and the session's next turn")
    g("--rounds", type=int, help="long-session mode: rounds per session")
    g("--concurrency", type=int, help="long-session mode: number of sessions")
    g("--warmup", type=int, help="warm-up requests before the measured run (excluded)")
    g("--seed", type=int, help="seed for the schedule and sampling")
    g = group("metrics and outputs")
    g(
        "--metrics-url",
        action="append",
        help="a /metrics page to scrape (repeatable), or a Prometheus that scrapes the servers: "
        'prometheus+http://HOST:PORT[?match={label="value"}] (its latest samples read through its HTTP API)',
    )
    g("--metrics-interval", type=float, help="seconds between scrapes")
    g("--kv-bytes-per-token", type=float, help="turn lmcache:num_stored_tokens into bytes written")
    g("--kv-bytes-metric", help="counter of bytes written to the KV tier (default: kvtier/LMCache names)")
    g(
        "--block-size",
        type=int,
        help="server KV block size in tokens, for the ideal hit rate (default: vLLM's cache_config_info, else 16)",
    )
    g("--slo", help="goodput SLOs, e.g. ttft_ms=500,tpot_ms=50 (also e2el_ms, itl_ms)")
    g("--percentiles", help="comma list")
    g("--output", help="JSON summary file")
    g("--detail", help="per-request JSONL file")
    g("--csv", help="per-request CSV file (and NAME.rounds.csv in long-session mode)")
    g("--plots", help="directory for PNG plots")
    g("--html-output", help="a self-contained HTML report of the run (kvtier report's page: tables, interactive plots)")
    g(
        "--config",
        help=f"YAML file with the same keys (underscored); {ENV_PREFIX}<KEY> variables override it, flags both",
    )
    g("--quiet", action="store_true", default=None, help="no live progress")
    return ap


def load_config(argv: list[str]) -> ReplayConfig:
    args = vars(build_parser().parse_args(argv))
    cfg_path = args.pop("config")
    return load_settings(
        ReplayConfig,
        config_path=cfg_path,
        env_prefix=ENV_PREFIX,
        flags={k: v for k, v in args.items() if v is not None},  # only what the command line gave
        missing_hint=" (see kvtier replay --help)",
    )
