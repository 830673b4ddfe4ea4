"""`kvtier replay`: replay ShareGPT / BurstGPT / synthetic load against an OpenAI-compatible server."""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import signal
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from kvconnector.errors import UserError
from replay.openai.client import api_root, fd_limit_message
from replay.openai.driver import Driver, DriverOptions, RunState
from replay.openai.mpi_run import ReplaySteps, run_rank
from replay.openai.prometheus_source import is_prometheus_url, parse_prometheus_url
from replay.openai.report import build_summary, request_rows
from replay.openai.schedule import arrival_offsets_ns, trace_offsets_ns
from replay.openai.workload import (
    TextMaker,
    long_session_plans,
    plans_from_block_trace,
    plans_from_conversations,
    synthetic_plans,
)
from replay.sources.base import WorkloadError
from replay.sources.registry import SOURCES, check_source, source_names

from ..common.cli import (
    Interrupted,
    OneLineParser,
    command,
    exit_code,
    fail,
    loop_stop_signals,
    signal_name,
    stop_signals_raise,
)
from ..common.settings import documented, load_settings
from ..mpi import world_size
from ..outputs import replay_tables, write_jsonl, write_replay_plots, write_requests_csv
from ..outputs.paths import OutputClaim, claim_outputs, write_results
from ..outputs.progress import LiveLine, stderr_is_terminal

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
  # synthetic open loop, bursty (gamma, burstiness 0.5), SLO goodput
  kvtier replay --base-url http://127.0.0.1:8000 --model M --source synthetic --input-len 512 --output-len 64 \\
      --num-requests 500 --request-rate 20 --burstiness 0.5 --slo ttft_ms=500,tpot_ms=50 --output syn.json
  # four load generators on two hosts, one merged result: sessions split among the ranks (a session stays on one),
  # --max-concurrency 64 in all (16 a rank); see replay/openai/README.md
  mpirun -n 4 -H a:2,b:2 kvtier replay --base-url http://srv:8000 --model M --source sharegpt \\
      --dataset-path sg.json --num-requests 2000 --request-rate 20 --max-concurrency 64 --output job.json
Under mpirun (found from OMPI_COMM_WORLD_SIZE or PMI_SIZE, no flag needed) each rank sends its share of the one
schedule: sessions round robin by index (a single-turn source's requests one by one); --max-concurrency, --users and
--warmup are the job's totals, divided among the ranks; --request-rate and --num-requests are the job's; rank 0 alone
scrapes --metrics-url and writes every output, merged (each rank's own figures under `ranks`). Not with --rounds.
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
    trace_speedup: float = Field(1.0, gt=0)
    trace_block_tokens: Count | None = None
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
        source = check_source(self.source, self.source_inputs(), block_tokens=self.trace_block_tokens)
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
        help="where the requests come from (mooncake: a block-hash trace, prompts sharing its prefixes)",
    )
    g("--dataset-path", help="ShareGPT JSON file; a block-hash trace's file (weka: also a directory)")
    g("--trace-path", help="BurstGPT CSV file, directory or glob (block-hash traces: --dataset-path)")
    g(
        "--trace-block-tokens",
        type=int,
        help="block-hash traces: their block as N tokens, every length scaled with it (fit a small model)",
    )
    g("--trace-speedup", type=float, help="divide trace timestamps by this (2 = twice as fast)")
    g("--num-requests", type=int, help="stop after this many requests (turns)")
    g(
        "--duration",
        type=float,
        help="run window in seconds: nothing is scheduled or started after it; requests in flight get 2 s",
    )
    g("--input-len", type=int, help="synthetic: input tokens per turn")
    g("--output-len", type=int, help="synthetic and long sessions: output tokens")
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


def _config(argv: list[str]) -> ReplayConfig:
    args = vars(build_parser().parse_args(argv))
    cfg_path = args.pop("config")
    return load_settings(
        ReplayConfig,
        config_path=cfg_path,
        env_prefix=ENV_PREFIX,
        flags={k: v for k, v in args.items() if v is not None},  # only what the command line gave
        missing_hint=" (see kvtier replay --help)",
    )


async def _prepare(cfg: ReplayConfig, drv: Driver, rng: random.Random, state: RunState):
    """Load the source, size the texts, compute the schedule. Returns (pacing, plans, offsets, traced, meta)."""
    maker = TextMaker(cfg.seed)
    source = SOURCES[cfg.source]
    needs_text = not source.has_text
    if needs_text:
        # Set-up must not outlast what the user allowed a request, nor the run window itself.
        budget_s = min(30.0, cfg.request_timeout, cfg.duration or math.inf)
        await maker.prepare(drv.session, cfg.base_url, cfg.model, timeout_s=budget_s)
        if maker.fallback_reason:
            print(
                f"kvtier replay: server tokenizer not used ({maker.fallback_reason}); prompt lengths are estimated "
                "at 4 characters per token",
                file=sys.stderr,
            )
    fixed = None if cfg.max_tokens == "dataset" else cfg.max_tokens
    meta: dict = {
        "source": cfg.source,
        "endpoint": cfg.endpoint,
        "model": cfg.model,
        "base_url": cfg.base_url,
        "seed": cfg.seed,
        "prompt_text_from": maker.mode if needs_text else "dataset text",
        "prompt_text_fallback_reason": maker.fallback_reason if needs_text else None,
    }
    convs = None
    path = cfg.source_inputs()[source.path_flag] if source.path_flag else None
    if source.has_text:  # conversations, taken in a shuffled order
        limit = cfg.concurrency * 4 if cfg.rounds else cfg.num_requests
        convs, report = source.load(path, max_requests=limit, max_context_tokens=cfg.max_prompt_tokens)
        meta["load_report"] = _load_report(report)
        order = list(range(len(convs)))
        rng.shuffle(order)
        convs = [convs[i] for i in order]
    if cfg.rounds:
        plans, cycled = await long_session_plans(
            convs,
            maker,
            rng,
            concurrency=cfg.concurrency,
            rounds=cfg.rounds,
            output_len=cfg.output_len,
            input_len=cfg.input_len,
            prefix_len=cfg.prefix_len,
        )
        meta["long_session"] = {
            "rounds": cfg.rounds,
            "concurrency": cfg.concurrency,
            "output_len": cfg.output_len,
            "cycled_turns": cycled,
        }
        return "rounds", plans, None, False, meta
    traced = False
    trace_offsets = None
    if source.timed and not source.block_trace:  # conversations at the input's times
        convs, report = source.load(path, max_requests=cfg.num_requests, max_context_tokens=cfg.max_prompt_tokens)
        meta["load_report"] = _load_report(report)
        stamps = [t.arrival_s or 0.0 for c in convs for t in c.turns]
        trace_offsets = trace_offsets_ns(stamps, cfg.trace_speedup, cfg.duration)
        traced = True
        meta["trace_speedup"] = cfg.trace_speedup
    if source.block_trace:
        trace = source.load(path, block_tokens=cfg.trace_block_tokens, max_requests=cfg.num_requests)
        meta["load_report"] = {"requests": len(trace.requests), "block_tokens": trace.block_tokens}
        meta["trace_speedup"] = cfg.trace_speedup
        offsets = trace_offsets_ns([r.arrival_s for r in trace.requests], cfg.trace_speedup, cfg.duration)
        plans = await plans_from_block_trace(
            trace, maker, fixed_max_tokens=fixed, max_tokens_cap=cfg.max_tokens_cap, trace_offsets_ns=offsets
        )
        traced = True
    elif convs is not None:
        plans = await plans_from_conversations(
            convs,
            maker,
            rng,
            num_requests=cfg.num_requests,
            fixed_max_tokens=fixed,
            max_tokens_cap=cfg.max_tokens_cap,
            trace_offsets_ns=trace_offsets,
        )
    else:
        sessions = cfg.num_requests or 100
        sessions = max(1, math.ceil(sessions / cfg.turns))
        plans = await synthetic_plans(
            maker,
            rng,
            sessions=sessions,
            turns=cfg.turns,
            input_len=cfg.input_len,
            output_len=fixed or cfg.output_len,
            range_ratio=cfg.range_ratio,
            prefix_len=cfg.prefix_len,
            prefix_groups=cfg.prefix_groups,
        )
    if not plans:
        raise WorkloadError("the workload is empty after --num-requests/--duration")
    if cfg.users:
        return "closed", plans, None, False, meta
    if traced:
        offsets = [p.turns[0].arrival_offset_ns or 0 for p in plans]
    else:
        kind = cfg.arrival or ("gamma" if cfg.burstiness != 1.0 else "poisson")
        offsets = arrival_offsets_ns(len(plans), cfg.request_rate, kind, cfg.burstiness, cfg.seed, cfg.duration)
        plans = plans[: len(offsets)]
        meta["arrival"] = kind
        meta["target_rate"] = None if math.isinf(cfg.request_rate) else cfg.request_rate
        meta["burstiness"] = cfg.burstiness
    return "open", plans, offsets, traced, meta


def _load_report(report) -> dict:
    return {
        "conversations": report.conversations,
        "turns": report.turns,
        "skipped": report.skipped,
        "truncated": report.truncated,
        "tokenizer": report.tokenizer,
    }


async def _progress(state: RunState, stop: asyncio.Event, target: float | None) -> None:
    """The sent/done line on stderr until `stop` is set, every half second, erased at the end."""
    last_t, last_sent = time.perf_counter(), 0
    with LiveLine(transient=True) as line:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), 0.5)
            except TimeoutError:
                pass
            now = time.perf_counter()
            rate = (state.sent - last_sent) / (now - last_t) if now > last_t else 0.0
            last_t, last_sent = now, state.sent
            tgt = f" (target {target:g})" if target else ""
            line.show(
                f"sent {state.sent}/{state.scheduled_total}  in flight {state.in_flight}  done {state.done}  "
                f"errors {state.errors}  rate {rate:.1f}/s{tgt}"
            )


async def _run(cfg: ReplayConfig, state: RunState, job=None) -> dict:
    """Set up, then the window; `job` is this process's rank of `mpirun -n N kvtier replay` (mpi_run.RankJob), which
    takes the rank's share of the plans and keeps the ranks in step, or None for a run of its own."""
    opts = DriverOptions(
        base_url=cfg.base_url,
        model=cfg.model,
        endpoint=cfg.endpoint,
        api_key=os.environ.get(cfg.api_key_env),
        max_concurrency=cfg.max_concurrency,
        think_time_ms=cfg.think_time_ms,
        request_timeout_s=cfg.request_timeout,
        request_max_time_s=cfg.request_max_time,
        ignore_eos=bool(cfg.ignore_eos or cfg.rounds),
        continuous_usage=not cfg.no_continuous_usage,
        metrics_urls=list(cfg.metrics_url),
        metrics_interval_s=cfg.metrics_interval,
        warmup_requests=cfg.warmup,
    )
    drv = Driver(opts, state)
    rng = random.Random(cfg.seed)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_signal(signum: int) -> None:
        state.stop_signal = state.stop_signal or signum
        drv.abort(f"interrupted ({signal_name(signum)}): partial results")

    with loop_stop_signals(loop, on_signal):  # the caller's handlers come back afterwards
        if job is not None and job.received:  # a signal before the event loop listened
            on_signal(job.received[0])
        return await _set_up_and_window(cfg, state, job, drv, rng, loop, stop)


async def _set_up_and_window(cfg: ReplayConfig, state: RunState, job, drv: Driver, rng, loop, stop) -> dict:
    meta: dict = {}
    async with drv.open_session():
        if job is None:  # a signal during set-up (the /tokenize probe) ends it at once, nothing sent
            prepared = await drv.unless_aborted(_prepare(cfg, drv, rng, state))
            if prepared is None:
                return meta
            pacing, plans, offsets, traced, meta = prepared
            await drv.warmup(plans)
        else:  # this rank's share, warmed up, once every rank has set up
            pacing, plans, offsets, traced, meta = await job.set_up(_prepare(cfg, drv, rng, state), drv)
        state.metrics_start = await drv.snapshot()
        if state.metrics_start is not None and state.metrics_start.errors:  # said once; the run goes on
            print(
                f"{PROG}: warning: --metrics-url: {'; '.join(state.metrics_start.errors)}; the run goes on without "
                "those metrics",
                file=sys.stderr,
            )
            if not state.metrics_start.values:
                meta["metrics_warning"] = f"no metrics read: {'; '.join(state.metrics_start.errors)}"
        scraper = asyncio.create_task(drv.scrape_loop()) if cfg.metrics_url else None
        show = not cfg.quiet and stderr_is_terminal()
        prog = asyncio.create_task(_progress(state, stop, meta.get("target_rate"))) if show else None
        if job is not None:
            job.start()  # the ranks' windows start together, after rank 0's first scrape
        watch = asyncio.create_task(job.watch(drv)) if job is not None else None
        window = loop.call_later(cfg.duration, drv.close_window) if cfg.duration else None
        try:
            if pacing == "rounds":
                await drv.run_rounds(plans, cfg.rounds)
            elif pacing == "closed":
                await drv.run_closed_loop(plans, cfg.users)
            else:
                await drv.run_open_loop(plans, offsets, traced)
        finally:
            if window:
                window.cancel()
            stop.set()
            if prog:
                await prog
            if scraper:
                scraper.cancel()
                await asyncio.gather(scraper, return_exceptions=True)
            if watch is not None:
                watch.cancel()
                await job.done(state)  # every rank's window over before the last scrape
            if cfg.metrics_url and (not drv.aborted or state.window_closed):
                await drv.snapshot()
    meta["pacing"] = pacing
    return meta


def summarize(cfg: ReplayConfig, state: RunState, meta: dict) -> dict:
    return build_summary(
        state,
        meta,
        percentiles=cfg.percentiles,
        slo=cfg.slo,
        block_size=cfg.block_size,
        kv_bytes_per_token=cfg.kv_bytes_per_token,
        kv_bytes_metric=cfg.kv_bytes_metric,
    )


def _write_outputs(cfg: ReplayConfig, state: RunState, meta: dict) -> dict:
    return write_outputs(cfg, summarize(cfg, state, meta), lambda warmup=False: request_rows(state, warmup=warmup))


def write_outputs(cfg: ReplayConfig, summary: dict, rows: Callable[..., Iterable[dict]]) -> dict:
    """The results file and the detail files; `rows(warmup=...)` gives the per-request rows (the warm-up requests'
    too when asked: the JSONL has them, the CSV and the plots do not)."""
    summary["results_path"], moved = write_results(cfg.output, summary)
    if moved:
        print(f"{PROG}: {moved}; results written to {summary['results_path']} instead", file=sys.stderr)
    if cfg.detail:
        write_jsonl(rows(warmup=True), cfg.detail)
    if cfg.csv:
        write_requests_csv(rows(), cfg.csv, summary.get("rounds"))
    if cfg.plots:
        summary["plots"] = write_replay_plots(summary, rows(), cfg.plots)
    if cfg.html_output:
        from ..outputs.html import write_html  # plotly only when asked

        try:
            write_html(summary, cfg.html_output, summary["results_path"])
        except OSError as exc:  # the results JSON holds it all: `kvtier report` makes the page from it later
            print(f"{PROG}: --html-output {cfg.html_output}: not written ({exc.strerror or exc})", file=sys.stderr)
    return summary


def check_output_paths(cfg: ReplayConfig) -> OutputClaim:
    """Check and claim every output before the run (`claim_outputs`); the claim holds until released or exit."""
    return claim_outputs(
        {"--output": cfg.output, "--detail": cfg.detail, "--csv": cfg.csv, "--html-output": cfg.html_output},
        {"--plots": cfg.plots},
        inputs=cfg.source_inputs(),
    )


def report(cfg: ReplayConfig, summary: dict, code: int) -> int:
    """The closing lines and tables of a written run; the exit code (1 when the run failed as a whole)."""
    if code == 0 and summary["run_failed"]:
        print(f"{PROG}: run failed: {summary['run_failed']}", file=sys.stderr)
        code = 1
    if (summary.get("errors_by_kind") or {}).get("client_limit"):  # not the server's fault: say what to raise
        n = summary["errors_by_kind"]["client_limit"]
        print(f"{PROG}: {n} requests failed on the client's side: {fd_limit_message()}", file=sys.stderr)
    if not cfg.quiet:
        from rich.console import Console

        console = Console(stderr=False)
        for t in replay_tables(summary):
            console.print(t)
        console.print(f"results: {summary['results_path']}" + (f", {cfg.detail}" if cfg.detail else ""))
    return code


def _write_partial(cfg: ReplayConfig, state: RunState, meta: dict, bug: BaseException):
    """Write what the run measured before `bug` ended it, then raise it with a note saying where."""
    try:
        summary = _write_outputs(cfg, state, meta)
    except Exception as exc:  # the results could not be made either: the first bug is the one to report
        bug.add_note(f"no results written ({type(exc).__name__}: {exc})")
    else:
        bug.add_note(f"partial results in {summary['results_path']}")
    raise bug


@command("replay")
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if world_size() > 1:  # started by mpirun: this process is one rank of the job
        return run_rank(
            ReplaySteps(
                load=lambda: _config(argv),
                check=check_output_paths,
                run=_run,
                summarize=summarize,
                write=write_outputs,
                report=report,
            )
        )
    cfg = _config(argv)  # a refusal raises a UserError: replay/cli.py says it in one line, exit 2
    with check_output_paths(cfg):
        return _run_and_write(cfg)


def _run_and_write(cfg: ReplayConfig) -> int:
    """The run, then its outputs. A refusal found while reading the source (a UserError) writes nothing; a bug
    (any other exception) writes what was measured, then is raised for replay/cli.py to log (exit 1)."""
    state = RunState()
    meta: dict = {}
    code = 0
    try:
        with stop_signals_raise():  # a signal before the event loop listens stops the run the same way
            meta = asyncio.run(_run(cfg, state))
    except KeyboardInterrupt as exc:
        signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
        state.stop_signal = state.stop_signal or signum
        state.aborted = state.aborted or f"interrupted ({signal_name(signum)}): partial results"
    except UserError:
        raise
    except Exception as bug:
        state.aborted = state.aborted or f"internal error: {type(bug).__name__}: {bug}"
        _write_partial(cfg, state, meta, bug)
    if state.aborted:
        code = exit_code(state.stop_signal) if state.stop_signal else 3
        print(f"{PROG}: run ended early: {state.aborted}", file=sys.stderr)
    try:
        summary = _write_outputs(cfg, state, meta)
    except OSError as exc:
        return fail(PROG, f"cannot write results: {exc}", 1)
    return report(cfg, summary, code)


if __name__ == "__main__":  # the error contract is the dispatcher's (replay/cli.py)
    from replay.cli import main as kvtier

    sys.exit(kvtier(["replay", *sys.argv[1:]]))
