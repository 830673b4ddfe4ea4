"""`kvtier plan`: predict, before any run, how the prefix hit rate of long multi-round sessions evolves round by round
over a tiered KV cache of given sizes, and when (if ever) it collapses. No server, no GPU: a simulation of the
sessions' block chains under LRU (replay/plan/model.py says exactly what it models)."""

from __future__ import annotations

import argparse
import datetime as _dt
import re
import shlex
import sys
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from kvconnector.errors import ConfigError, UserError
from kvconnector.units import human_bytes, parse_size
from kvconnector.validation import describe_validation_error
from replay.models import DTYPE_BYTES, resolve_model

from ..common.cli import Interrupted, OneLineParser, command, under_contract
from ..common.settings import documented, load_settings
from ..outputs.paths import claim_outputs
from .model import ORDERS, POLICIES, MPParams, PlanResult, TierSpec, Workload, simulate
from .trace_cli import TracePlanConfig
from .trace_cli import main as trace_main

PROG = "kvtier plan"
ENV_PREFIX = "KVTIER_PLAN_"

EXAMPLES = """examples:
  # LUISUAN's published GP7000 measurement (replay/plan/README.md): 112 sessions x 20 rounds of 5,000 forced
  # output tokens, FP8 KV at 88.1 KB/token, block 256;
  # a 400 GiB DRAM tier against 50 GiB of DRAM over 46.09 TB of NVMe-oF, side by side, with a figure
  kvtier plan --concurrency 112 --rounds 20 --first-input-len 10000 --input-len 50 --output-len 5000 \\
      --block-size 256 --kv-bytes-per-token 88.1KB \\
      --config dram="--tier dram=400GiB" --config tiered="--tier dram=50GiB --tier nvmeof=46.09TB" \\
      --output plan.json --plots plots/
  # one configuration, KV size from a model of the catalog (or a config.json path), vLLM's block of 16
  kvtier plan --concurrency 32 --rounds 50 --input-len 200 --output-len 500 --block-size 16 \\
      --model llama3.1-8b --kv-dtype bf16 --tier cpu=64GiB --tier nvme=2TB
  # the same workload when the engine keeps the answers' KV (vLLM's own prefix cache) against when it does not
  kvtier plan --concurrency 64 --rounds 30 --input-len 300 --output-len 800 --block-size 256 \\
      --kv-bytes-per-token 128KiB --config kept="--tier cpu=200GiB --answer-kv reused" \\
      --config lmcache="--tier cpu=200GiB --answer-kv recomputed"
  # a closed loop's fixed order against a new random order of the sessions each round (a slope, not a cliff)
  kvtier plan --concurrency 112 --rounds 20 --first-input-len 10000 --input-len 50 --output-len 5000 \
      --block-size 256 --kv-bytes-per-token 88.1KB --seed 1 \
      --config fixed="--tier dram=400GiB" --config shuffled="--tier dram=400GiB --order shuffled"
  # the configurations (and any other key) from a YAML file; flags win over it
  kvtier plan --config plan.yaml --rounds 40
  # a production trace with block hashes (Mooncake) instead of sessions: tiers and a capacity sweep
  # (all its options: kvtier plan --trace - --help)
  kvtier plan --trace conversation_trace.jsonl --tier local=3e6 --capacity-sweep 1e4..1e9 --plots plots/

--answer-kv: whether a round's answer is reusable in the next round. `recomputed` (the default): the cache below the
engine holds prefill KV only (LMCache's default), so the answer is prefilled again inside the next prompt; `reused`: the
generated blocks are kept (vLLM's own prefix cache) and a chat template re-tokenizes the answer to the same tokens. The
ideal hit rate of LUISUAN's published GP7000 measurement (0.9527 at round 20) fits `recomputed` with a first prompt near
10k tokens and short follow-ups (the first example gives 0.9520); `reused` would put it above 0.99.

--policy lmcache-mp: LMCache MP's L1 as it evicts (0.5.6): a loop wakes once a second and, at or above
--l1-watermark of the L1, drops --l1-evict-ratio of its chunks, tails first; a store that finds the L1 full is
dropped; an optional second tier is a write-through L2 (kvtier's disk tier). Rounds become ticks: --ticks-during
while a round's answers decode, --ticks-between in the pause (replay/plan/lmcache_mp.py says what is modelled).
  kvtier plan --policy lmcache-mp --concurrency 4 --rounds 12 --first-input-len 265 --input-len 268 \
      --output-len 32 --block-size 256 --kv-bytes-per-token 512B --l1-watermark 0.2 --l1-evict-ratio 1 \
      --config l1only="--tier l1=0.016GiB" --config tiered="--tier l1=0.016GiB --tier disk=256MB"

--config NAME="FLAGS": one configuration to compare, FLAGS being --tier (one or more), --answer-kv, --order and
--policy; repeat it for several. A --config value without NAME= is a YAML file of any keys of this command, with the
configurations under `configs:` (NAME: {tiers: {dram: 400GiB}, answer_kv: reused}) or one list under `tiers:`.
Options also come from KVTIER_PLAN_<KEY> environment variables; precedence: defaults < YAML < environment < flags.
Sizes take units: 88.1KB, 50GiB, 46.09TB (KB, MB, GB, TB: powers of 1000; KiB ... TiB: powers of 1024).

What it prints: one table, per round the prompt length, the working set, the ideal hit rate and each
configuration's predicted hit rate and bytes written; under it, per configuration, the round it collapses (hit rate
below a quarter of the ideal), the first round with an eviction, how many rounds its largest tier alone can hold and
the bytes written in all. --output adds every per-round figure (a `rounds` list per configuration), --plots a PNG.
exit status: 0 done; 2 a usage error (one line, nothing written); 130/143 stopped by SIGINT/SIGTERM (what was
simulated so far is written).
"""

_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_NAMED_CONFIG = re.compile(r"^([A-Za-z0-9_.-]+)=(.*)$", re.DOTALL)

Size = Annotated[float, BeforeValidator(parse_size)]
# Bounds on the work a plan asks for, checked before anything is simulated. The model costs about 3.5 us and 100 B
# per session and keeps one row per round: a million sessions is 100 MB, 10^8 simulated requests about six minutes
# on one core, and 100,000 rounds a per-round table larger than anyone reads (every round adds at least one token
# to the prompt, so the last round is past every context length of the model catalog, 163,840 at most).
MAX_SESSIONS = 1_000_000
MAX_ROUNDS = 100_000
MAX_SIMULATED_REQUESTS = 100_000_000
Count = Annotated[int, Field(ge=1)]
AnswerKV = Literal["reused", "recomputed"]
Policy = Literal[POLICIES]  # type: ignore[valid-type]
Order = Literal[ORDERS]  # type: ignore[valid-type]


class Tier(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    capacity_bytes: Size

    @model_validator(mode="after")
    def _check(self) -> Tier:
        if not _NAME.match(self.name):
            raise ValueError(f"tier name {self.name!r}: use letters, digits, '_', '-' or '.'")
        return self


def _tier_list(v: Any) -> Any:
    """Tiers fastest first, as flags give them (['dram=400GiB', ...] or 'dram=400GiB,nvme=2TB') or as YAML does
    (a mapping {dram: 400GiB, nvme: 2TB}, or a list of 'NAME=SIZE' / {NAME: SIZE})."""
    if isinstance(v, str):
        v = [p for p in (x.strip() for x in v.split(",")) if p]
    if isinstance(v, dict):
        v = [{"name": k, "capacity_bytes": s} for k, s in v.items()]
    if not isinstance(v, list):
        return v
    out = []
    for item in v:
        if isinstance(item, str):
            name, sep, size = item.partition("=")
            if not sep or not name.strip():
                raise ValueError(f"expected NAME=SIZE like dram=400GiB, got {item!r}")
            out.append({"name": name.strip(), "capacity_bytes": size.strip()})
        elif isinstance(item, dict) and len(item) == 1 and "name" not in item:
            ((name, size),) = item.items()
            out.append({"name": str(name), "capacity_bytes": size})
        else:
            out.append(item)
    return out


def _unique_names(tiers: list[Tier]) -> list[Tier]:
    seen = set()
    for t in tiers:
        if t.name in seen:
            raise ValueError(f"tier {t.name!r} is given twice")
        seen.add(t.name)
    return tiers


TierList = Annotated[list[Tier], BeforeValidator(_tier_list)]


class ConfigEntry(BaseModel):
    """One configuration to compare: its tiers, and optionally its own answer_kv, order and policy."""

    model_config = ConfigDict(extra="forbid")
    tiers: Annotated[TierList, Field(min_length=1)]
    answer_kv: AnswerKV | None = None
    policy: Policy | None = None
    order: Order | None = None

    @model_validator(mode="after")
    def _check(self) -> ConfigEntry:
        _unique_names(self.tiers)
        return self


class PlanConfig(BaseModel):
    """Every option of `kvtier plan`, validated once (defaults < YAML < KVTIER_PLAN_<KEY> < flags)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    concurrency: Count
    rounds: Count
    input_len: int = Field(ge=0)
    output_len: int = Field(ge=0)
    first_input_len: Count | None = None
    block_size: Count
    model: str | None = None
    kv_dtype: Literal[tuple(DTYPE_BYTES)] = "bf16"  # type: ignore[valid-type]
    kv_bytes_per_token: Size | None = None
    answer_kv: AnswerKV = "recomputed"
    policy: Policy = "lru"
    order: Order = "fixed"
    seed: int = Field(0, ge=0)
    l1_watermark: float = Field(0.8, gt=0, le=1)
    l1_evict_ratio: float = Field(0.2, gt=0, le=1)
    ticks_during: int = Field(1, ge=0)
    ticks_between: int = Field(3, ge=0)
    tiers: TierList = []
    configs: dict[str, ConfigEntry] = {}
    output: str | None = None
    plots: str | None = None
    html_output: str | None = None
    quiet: bool = False

    @model_validator(mode="after")
    def _check(self) -> PlanConfig:
        if (self.model is None) == (self.kv_bytes_per_token is None):
            raise ValueError("give the KV size as --model M or as --kv-bytes-per-token SIZE (one of them)")
        if self.tiers and self.configs:
            raise ValueError("give --tier (one configuration) or --config NAME=... (several), not both")
        if not self.tiers and not self.configs:
            raise ValueError("give the cache: --tier NAME=SIZE (fastest first) or --config NAME='--tier ...'")
        if self.concurrency > MAX_SESSIONS:
            raise ValueError(f"--concurrency {self.concurrency}: at most {MAX_SESSIONS:,} sessions")
        if self.rounds > MAX_ROUNDS:
            raise ValueError(f"--rounds {self.rounds}: at most {MAX_ROUNDS:,} rounds")
        if self.concurrency * self.rounds > MAX_SIMULATED_REQUESTS:
            raise ValueError(
                f"--concurrency {self.concurrency} x --rounds {self.rounds}: at most "
                f"{MAX_SIMULATED_REQUESTS:,} simulated requests per configuration"
            )
        if self.first_input_len is None and self.input_len < 1:
            raise ValueError("--input-len 0 needs --first-input-len (the first prompt cannot be empty)")
        for name in self.configs:
            if not _NAME.match(name):
                raise ValueError(f"configuration name {name!r}: use letters, digits, '_', '-' or '.'")
        _unique_names(self.tiers)
        return self

    def configurations(self) -> dict[str, ConfigEntry]:
        if self.configs:
            return self.configs
        return {"+".join(t.name for t in self.tiers): ConfigEntry(tiers=self.tiers)}


class _ConfigFlagsError(UserError):
    """A bad flag inside one --config NAME="...": turned into a ConfigError naming that --config."""


class _ConfigFlagsParser(argparse.ArgumentParser):
    def error(self, message: str):
        raise _ConfigFlagsError(message)


def _config_flags(name: str, text: str) -> dict[str, Any]:
    """The flags of one --config NAME="..." as the keys of a ConfigEntry."""
    p = _ConfigFlagsParser(prog=f"--config {name}", add_help=False)
    p.add_argument("--tier", action="append", default=[])
    p.add_argument("--answer-kv", choices=["reused", "recomputed"])
    p.add_argument("--policy", choices=list(POLICIES))
    p.add_argument("--order", choices=list(ORDERS))
    hint = "it takes --tier NAME=SIZE, --answer-kv, --order, --policy"
    try:
        words = shlex.split(text)
    except ValueError as exc:  # shlex's own refusal: an unclosed quote, a trailing backslash
        raise ConfigError(f"--config {name}: {exc} ({hint})") from None
    try:
        ns = p.parse_args(words)
    except _ConfigFlagsError as exc:
        raise ConfigError(f"--config {name}: {exc} ({hint})") from None
    out: dict[str, Any] = {"tiers": ns.tier}
    if ns.answer_kv:
        out["answer_kv"] = ns.answer_kv
    if ns.policy:
        out["policy"] = ns.policy
    if ns.order:
        out["order"] = ns.order
    try:  # checked here so a mistake is blamed on this --config by name (settings would name the YAML layer)
        ConfigEntry.model_validate(out)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, f"--config {name}")) from None
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = OneLineParser(
        prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter, description=__doc__, epilog=EXAMPLES
    )

    def group(title: str):
        return documented(ap.add_argument_group(title).add_argument, PlanConfig)

    g = group("sessions")
    g("--concurrency", type=int, metavar="C", help="sessions, each sending one request per round")
    g("--rounds", type=int, metavar="N", help="rounds per session")
    g("--input-len", type=int, metavar="I", help="tokens of each follow-up prompt (and of the first, by default)")
    g("--output-len", type=int, metavar="L", help="tokens of each answer (forced: the answer is always L long)")
    g("--first-input-len", type=int, metavar="I0", help="tokens of the first round's prompt (default: --input-len)")
    g = group("KV geometry")
    g("--block-size", type=int, metavar="B", help="tokens per block (vLLM's block, LMCache's chunk: 16, 256, ...)")
    g("--model", metavar="M", help="KV bytes per token from a model: a catalog name or a config.json path")
    g("--kv-dtype", choices=list(DTYPE_BYTES), help="KV element type, with --model")
    g("--kv-bytes-per-token", metavar="SIZE", help="KV bytes per token, e.g. 88.1KB (instead of --model)")
    g = group("cache")
    g("--tier", action="append", metavar="NAME=SIZE", dest="tiers", help="a tier, fastest first; repeat for more")
    ap.add_argument(
        "--config",
        action="append",
        metavar='NAME="FLAGS"|FILE.yaml',
        help="a configuration to compare (repeat), or a YAML file of options (see below)",
    )
    g("--answer-kv", choices=["reused", "recomputed"], help="whether a round's answer KV is reusable next round")
    g("--policy", choices=list(POLICIES), help="eviction policy")
    g(
        "--order",
        choices=list(ORDERS),
        help="sessions served in the same order every round (a closed loop's) or in a new random one each round",
    )
    g("--seed", type=int, help="random seed of --order shuffled")
    g = group("--policy lmcache-mp (LMCache MP's L1 over an optional L2: --tier l1=SIZE [--tier l2=SIZE])")
    g("--l1-watermark", type=float, metavar="F", help="LMCache's --eviction-trigger-watermark")
    g("--l1-evict-ratio", type=float, metavar="F", help="LMCache's --eviction-ratio (share of L1 keys per tick)")
    g("--ticks-during", type=int, metavar="N", help="eviction ticks (1 s each) between a round's stores and its end")
    g("--ticks-between", type=int, metavar="N", help="eviction ticks between rounds (the pause, whole seconds)")
    g = group("outputs")
    g("--output", metavar="FILE", help="plan JSON: workload, then per configuration its rounds list and summary")
    g("--plots", metavar="DIR", help="write DIR/plan.png (hit rate per round per configuration, with the ideal)")
    g("--html-output", metavar="FILE", help="a self-contained HTML report (kvtier report's page) of the plan")
    g("--quiet", action="store_true", default=None, help="no table")
    return ap


def load_config(argv: list[str]) -> PlanConfig:
    ns = build_parser().parse_args(argv)
    flags = {k: v for k, v in vars(ns).items() if v is not None and k != "config"}
    flag_paths: dict[str, tuple[str, ...]] = {}
    yaml_path = None
    for value in ns.config or []:
        m = _NAMED_CONFIG.match(value)
        if m and "/" not in m.group(1):
            name = m.group(1)
            dest = f"config {name}"
            if dest in flags:
                raise ConfigError(f"--config {name} is given twice")
            flags[dest] = _config_flags(name, m.group(2))
            flag_paths[dest] = ("configs", name)
        elif yaml_path is not None:
            raise ConfigError(f"--config: one YAML file at most ({yaml_path}, {value})")
        else:
            yaml_path = value
    return load_settings(
        PlanConfig,
        config_path=yaml_path,
        env_prefix=ENV_PREFIX,
        flags=flags,
        flag_paths=flag_paths,
        missing_hint=f" (see '{PROG} --help')",
        env_known_elsewhere=frozenset(TracePlanConfig.model_fields),  # plan --trace shares the variables' prefix
    )


def kv_bytes_per_token(cfg: PlanConfig) -> tuple[float, str | None]:
    if cfg.kv_bytes_per_token is not None:
        return cfg.kv_bytes_per_token, None
    spec = resolve_model(cfg.model)
    return float(spec.bytes_per_token(cfg.kv_dtype)), spec.name


def _progress_printer(total: int):
    """A status line on a terminal for simulations long enough to watch; nothing otherwise."""
    if not sys.stderr.isatty() or total < 200_000:
        return lambda name, r, rounds: None

    def show(name: str, r: int, rounds: int) -> None:
        end = "\n" if r == rounds else ""
        print(f"\r{PROG}: {name}: round {r}/{rounds}", end=end, file=sys.stderr, flush=True)

    return show


def plan_document(cfg: PlanConfig, bpt: float, model_name: str | None, plans: list[PlanResult], argv) -> dict:
    base = plans[0].bytes_written_total if plans else 0.0
    return {
        "kind": "kvtier plan",
        "created_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "command": ["kvtier", "plan", *argv],
        "workload": {
            "concurrency": cfg.concurrency,
            "rounds": cfg.rounds,
            "first_input_len": cfg.first_input_len if cfg.first_input_len is not None else cfg.input_len,
            "input_len": cfg.input_len,
            "output_len": cfg.output_len,
            "block_size": cfg.block_size,
            "kv_bytes_per_token": bpt,
            "model": model_name,
            "kv_dtype": cfg.kv_dtype if model_name else None,
            "seed": cfg.seed,
        },
        "configurations": [
            {**p.to_dict(), "bytes_written_vs_first": (p.bytes_written_total / base) if base else None} for p in plans
        ],
        "status": "done" if len(plans) == len(cfg.configurations()) else "interrupted",
    }


def run(cfg: PlanConfig, argv: list[str]) -> tuple[dict, list[PlanResult]]:
    bpt, model_name = kv_bytes_per_token(cfg)
    configs = cfg.configurations()
    show = _progress_printer(cfg.concurrency * cfg.rounds * len(configs))
    jobs = []
    for name, entry in configs.items():  # every configuration checked before any is simulated
        w = Workload(
            concurrency=cfg.concurrency,
            rounds=cfg.rounds,
            input_len=cfg.input_len,
            output_len=cfg.output_len,
            block_size=cfg.block_size,
            kv_bytes_per_token=bpt,
            first_input_len=cfg.first_input_len,
            answer_kv=entry.answer_kv or cfg.answer_kv,
        )
        tiers = [TierSpec(t.name, t.capacity_bytes) for t in entry.tiers]
        for t in tiers:
            if t.capacity_bytes < w.block_bytes:  # a tier of 400B where 400GB was meant: not a cache at all
                # Named as the user gave it: --tier NAME=SIZE, or the tier of one --config NAME.
                given = f"--config {name}: tier {t.name}" if cfg.configs else f"--tier {t.name}"
                raise ConfigError(
                    f"{given} ({human_bytes(t.capacity_bytes)}) holds no whole block "
                    f"({human_bytes(w.block_bytes)} = {w.block_size} tokens x {human_bytes(bpt)})"
                )
        jobs.append((name, entry, w, tiers))
    mp = MPParams(cfg.l1_watermark, cfg.l1_evict_ratio, cfg.ticks_during, cfg.ticks_between)
    plans: list[PlanResult] = []
    try:
        for name, entry, w, tiers in jobs:
            plans.append(
                simulate(
                    w,
                    tiers,
                    name=name,
                    policy=entry.policy or cfg.policy,
                    order=entry.order or cfg.order,
                    seed=cfg.seed,
                    progress=lambda r, n=name: show(n, r, cfg.rounds),
                    mp=mp,
                )
            )
    except Interrupted as exc:
        exc.partial = plan_document(cfg, bpt, model_name, plans, argv)  # type: ignore[attr-defined]
        raise
    return plan_document(cfg, bpt, model_name, plans, argv), plans


def _write(cfg, doc: dict) -> int:
    from .report import write_outputs, write_plan_plot  # matplotlib only when writing

    plot = write_plan_plot if doc["configurations"] else None
    return write_outputs(PROG, doc, cfg.output, cfg.plots, plot, cfg.html_output)


@command("plan")
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a == "--trace" or a.startswith("--trace=") for a in argv):  # a production trace instead of sessions
        known = frozenset(PlanConfig.model_fields)
        return under_contract("plan --trace", lambda args: trace_main(args, env_known_elsewhere=known), argv)
    cfg = load_config(argv)  # a refusal raises a ConfigError: `command` says it in one line, exit 2
    kv_bytes_per_token(cfg)  # a bad --model is a usage error before anything runs
    claim = claim_outputs({"--output": cfg.output, "--html-output": cfg.html_output}, {"--plots": cfg.plots})
    with claim:
        return _run_and_write(cfg, argv)


def _run_and_write(cfg, argv: list[str]) -> int:
    try:
        doc, _ = run(cfg, argv)
    except Interrupted as exc:
        _write(cfg, exc.partial)  # type: ignore[attr-defined]
        print(f"{PROG}: interrupted ({exc}); wrote what was simulated", file=sys.stderr)
        return exc.exit_code
    if not cfg.quiet:
        from ..outputs.terminal import console
        from .report import plan_table

        console(min_width=100).print(plan_table(doc))
    return _write(cfg, doc)


if __name__ == "__main__":  # as `kvtier ...`: logging and signals set up by the dispatcher (replay/cli.py)
    from replay.cli import main as kvtier

    sys.exit(kvtier(["plan", *sys.argv[1:]]))
