"""`kvtier bench`: the synthetic benchmark of the tiered KV store (no vLLM, no GPU needed). This module parses the
command line and picks the way to run (one process, trials, --num-clients, an MPI rank); the steps of a run are in
lifecycle.py."""

from __future__ import annotations

import argparse

from replay.models import CATALOG
from replay.sources.registry import block_trace_names
from replay.sources.trace_timing import TIMINGS

from ..common.cli import OneLineParser, command, set_log_level
from ..common.settings import documented
from ..mpi import world_size
from .check import main as check_main
from .config import BenchConfig, GenerationConfig, load_config
from .finish import PROG
from .lifecycle import Invocation, check_modes, check_output_paths, run_single
from .mpi_run import run_rank
from .multiclient import run_clients
from .trials import run_trials

EXAMPLES = """\
examples:
  kvtier bench                                   # tiny-1b, 100 users, 60 s, 4 GiB CPU tier + a temp disk tier
  kvtier bench --duration 30 --num-users 50 --cache-dir /mnt/nvme --output run.json --plots plots/
  kvtier bench --model llama3.1-8b --cpu-mem-gb 0 --gpu-mem-gb 0 --cache-dir /mnt/nvme   # storage only
  kvtier bench --generation-mode realistic --num-users 1000 --duration 120
  kvtier bench --dataset-path ShareGPT_V3.json --max-conversations 200 --replay-cycles 2
  kvtier bench --use-burst-trace --burst-trace-path 'BurstGPT/*.csv' --trace-speedup 10
  kvtier bench --source mooncake --dataset-path conversation_trace.jsonl --trace-speedup 0   # measured vs plan
  kvtier bench --source weka --dataset-path traces/ --trace-timing think --trace-speedup 10   # agents, closed loop
  kvtier bench --storage-backend s3 --s3-bucket kv --storage-capacity-gb 20 --cpu-mem-gb 0   # an object store
  kvtier bench --target-hit-rate 0.6 --cpu-mem-gb 1 --gpu-mem-gb 0 --cache-dir /mnt/nvme   # sessions made to hit 60%
  kvtier bench --enable-rag --rag-num-docs 20 --enable-autoscaling --autoscaler-mode capacity
  kvtier bench --decode-only --num-users 20 --cpu-mem-gb 0     # read-heavy decode node
  kvtier bench --prefix-model chained --block-size 256 --rounds 20 --num-users 16 --cpu-mem-gb 2   # hit-rate cliff
  kvtier bench --num-clients 2 --num-users 200                 # two processes, merged results
  kvtier bench --trials 5 --seed 42 --output stress.json       # 5 trials (stress-trial1.json ...), medians
  kvtier bench --trials 3 --submission-check --duration 300 --gpu-mem-gb 0 --cpu-mem-gb 0 --generation-mode none
  mpirun -n 4 --host a:2,b:2 kvtier bench --num-users 400 --cache-dir /mnt/nvme   # a client per MPI rank
  kvtier bench --config config.yaml --xlsx-output run.xlsx --io-op-log ops.csv.zst     # a real run, every op
  kvtier bench --model llama3.1-70b-instruct --num-gpus 8 --gpu-mem-gb 141 --tensor-parallel 8 \\
      --io-trace-log trace.csv.zst              # the reference's trace-only mode: no device I/O, the ops logged
  kvtier bench --config mlperf/config.yaml --gpu-mem-gb 0 --cpu-mem-gb 0       # the reference's semantics (default)
  kvtier bench --request-model kvtier --size-unit GB --cpu-mem-gb 4   # kvtier's request model, sizes in 10^9 B
  kvtier bench --precondition --prefill-only --disable-multi-turn --disable-prefix-caching --gpu-mem-gb 0 \\
      --cpu-mem-gb 0 --model llama3.1-70b-instruct --num-users 100 --duration 300 --cache-dir /mnt/nvme

defaults: the MLPerf reference's for its flags (sizes in GiB, --request-model reference, --storage-capacity-gb 0 =
95% of the free space, --use-burst-trace alone reads BurstGPT/data/BurstGPT_1.csv), except --model tiny-1b,
--gpu-mem-gb 16 with CUDA and 0 without, --cpu-mem-gb 4 (with --io-trace-log: 16 and 32, as the reference),
--generation-mode none, --log-level WARNING and --output results/<time>.json (replay/synthetic/README.md says why).
--size-unit GB and --request-model kvtier give kvtier's own.

config.yaml: the top-level keys are these flags with underscores (num_users: 50); sections user_templates,
qos_profiles, qos_distribution, eviction, prefix_cache, rag, conversation, autoscaler, decode, generation, sharegpt,
model_configs. Unknown keys are errors. Precedence: defaults < config.yaml < KVTIER_<KEY> env < flags.
The MLPerf reference's config.yaml is accepted as it is (its names are aliases, generation_timing and
qos_distribution are converted; its internal limits are accepted and named in a note).

on bad input: one line on stderr naming the flag, variable or file, exit 2, nothing written. Every output path
(--output, --xlsx-output, --csv-output, --html-output, --io-trace-log, --io-op-log, --plots) is checked before the
run starts; if the results cannot be written when the run ends, they go to results/ (or the temp directory) instead
and the line says where.
A default results name is never reused: a second run in the same second gets results/<time>-2.json.

exit status: 0 done; 1 run failed (e.g. filesystem full; partial results written); 2 bad arguments;
128 + signal when stopped by a signal: 130 SIGINT (Ctrl-C), 143 SIGTERM. Both signals stop the run the same way,
at any moment: partial results are written if the run had started, and the run's cache files are removed.
"""

# Flags whose value lives in a config section.
SECTION_FLAGS = {
    "decode_batch_size": ("decode", "batch_size"),
    "target_usage_ratio": ("eviction", "target_usage_ratio"),
    "large_entry_limit_ratio": ("eviction", "large_entry_limit_ratio"),
    "rag_top_k": ("rag", "top_k"),
}


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog=PROG,
        description="Drive the tiered KV store (GPU -> CPU -> disk, waterfall LRU) with simulated LLM users and "
        "measure what each tier costs a request. Every flag of the MLPerf Storage KV Cache reference is accepted "
        "with its meaning, and the shared ones default as there: sizes in GiB (--size-unit GB for 10^9 B) and the "
        "reference's request model (--request-model kvtier for kvtier's own).",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        argument_default=argparse.SUPPRESS,  # only flags given on the command line override config.yaml
    )
    add = p.add_argument

    def group(title: str):
        return documented(p.add_argument_group(title).add_argument, BenchConfig, SECTION_FLAGS)

    w = group("workload")
    w(
        "--model",
        help=f"one of {', '.join(CATALOG)}, a name from config model_configs, or a Hugging Face config.json",
    )
    w("--kv-dtype", choices=["bf16", "fp16", "fp8", "int8", "fp32"], help="KV cache element type")
    w("--num-users", type=int, help="simulated users")
    w("--duration", type=float, help="run window in seconds")
    w("--max-requests", type=int, help="stop after this many completed requests; 0 = no limit")
    w("--request-rate", type=float, help="cap on requests started per second; 0 = closed loop")
    w("--seed", type=int, help="seed for users, sizes and payloads (repeatable runs)")
    w(
        "--max-context-tokens",
        type=int,
        help="cap on a request's tokens, below the model's context length; longer ones are cut and counted",
    )
    w("--disable-multi-turn", action="store_true", help="every conversation has one turn")
    w("--disable-prefix-caching", action="store_true", help="no shared system-prompt KV entries")
    w(
        "--generation-mode",
        choices=["none", "fast", "realistic"],
        help="simulated GPU time per generated token: "
        + ", ".join(f"{mode} {ms:g} ms" for mode, ms in GenerationConfig().ms_per_token.items()),
    )
    w("--decode-batch-size", type=int, help="tokens per decode read")
    w(
        "--prefix-model",
        choices=["entries", "chained"],
        help="entries: a turn's KV is one entry; chained: a session's KV is a chain of --block-size blocks, reused up "
        "to the first block missing from every tier, sessions in lockstep rounds with a per-round hit-rate table",
    )
    w("--block-size", type=int, help="chained: tokens per KV block")
    w("--rounds", type=int, help="chained: turns per session (0 = each conversation's own length)")
    w(
        "--source",
        help="a block-hash trace at --dataset-path ("
        + ", ".join(block_trace_names())
        + "): each request looks its blocks up in "
        "the store up to the first one missing, writes the rest, and the measured per-tier hit rates are printed "
        "beside kvtier plan's prediction for the same tiers; arrivals are the trace's times (--trace-speedup scales "
        "them, --request-rate is refused) and every request is in the first QoS class of qos_distribution",
    )
    w("--trace-block-tokens", type=int, help="--source: the trace's block in tokens (default: its format's)")
    w(
        "--trace-timing",
        choices=list(TIMINGS),
        help="--source: timestamps (open loop, each request at its time) or think (a trace with sessions, weka: each "
        "call its think time after the previous call of its session ended, sub-agents joined; --trace-speedup "
        "divides the pauses)",
    )
    w("--max-idle-s", type=float, help="with --trace-timing think: cap each pause at this many seconds")
    w(
        "--target-hit-rate",
        type=float,
        help="synthesize sessions whose prefix hit rate at --cache-tokens is this fraction (the hit-rate source, "
        "a block-hash trace: --max-requests defaults to 10 turns a session); printed beside the rate measured",
    )
    w("--cache-tokens", type=float, help="with --target-hit-rate: the cache it is aimed at (default: the tiers' room)")
    w("--input-len", type=int, help="with --target-hit-rate: prompt tokens per turn")
    w("--output-len", type=int, help="with --target-hit-rate: answer tokens per turn")
    w(
        "--performance-profile",
        choices=["latency", "throughput"],
        help="latency: users think between requests; throughput: back-to-back requests",
    )
    w("--prefill-only", action="store_true", help="writes only (a prefill node)")
    w("--decode-only", action="store_true", help="reads only, of num_users x 10 pre-populated entries (a decode node)")
    w(
        "--enable-rag",
        action="store_true",
        help="documents ingested as chunk entries; RAG queries read top-k chunks first",
    )
    w("--rag-num-docs", type=int, help="documents to ingest")
    w("--rag-top-k", type=int, help="chunks read per RAG query")
    w("--enable-autoscaling", action="store_true", help="start and stop users as the autoscaler decides")
    w(
        "--autoscaler-mode",
        choices=["qos", "capacity"],
        help="qos: hold saturation and SLAs; capacity: find peak throughput",
    )
    w("--target-saturation", type=float, help="qos autoscaler's target I/O saturation")
    w(
        "--qos-scheduler",
        choices=["fair", "strict"],
        help="I/O queue between QoS classes: fair = weighted shares (no class starves), strict = priority",
    )
    s = group("workload sources")
    s("--dataset-path", help="ShareGPT JSON: replay real conversations (multi-turn); with --source, the trace file")
    s("--max-conversations", type=int, help="ShareGPT conversations to load")
    s("--use-burst-trace", action="store_true", help="replay a BurstGPT trace (needs --burst-trace-path)")
    s("--burst-trace-path", help="BurstGPT CSV file, directory or glob")
    s("--trace-speedup", type=float, help="trace time scale: 1 real time, 10 ten times faster, 0 no delay")
    s("--replay-cycles", type=int, help="times to replay the dataset/trace; 0 = until the run ends")
    s(
        "--validation-trace",
        help="JSON list of a real system's requests (the reference's RealTraceEntry records, with cache_hit, "
        "context_tokens, generation_tokens, read_bytes, write_bytes): the run's any-tier hit rate is compared with "
        "the trace's, results 'validation' (passed within 5%%)",
    )
    t = group("tiers")
    t(
        "--size-unit",
        choices=["GiB", "GB"],
        help="unit of the size flags (--gpu-mem-gb, --cpu-mem-gb, --storage-capacity-gb, --precondition-size-gb): "
        "GiB = 2^30 B as the MLPerf reference reads them, GB = 10^9 B (results are always in 10^9 B)",
    )
    t("--gpu-mem-gb", type=float, help="GPU tier size per GPU (default 16 with CUDA, 0 without)")
    t("--num-gpus", type=int, help="GPUs of the node: the GPU tier holds num-gpus x gpu-mem-gb (as the reference)")
    t(
        "--tensor-parallel",
        type=int,
        help="tensor-parallel degree TP, 1 <= TP <= --num-gpus: this process is one rank and stores 1/TP of every "
        "KV entry (entries of bytes_per_token / TP per token)",
    )
    t("--cpu-mem-gb", type=float, help="CPU tier size; 0 disables")
    t("--cache-dir", help="where the disk tier writes (a fresh subdirectory per run; default a temp dir in /var/tmp)")
    t("--storage-capacity-gb", type=float, help="disk tier size; 0 = 95%% of the filesystem's free space")
    t(
        "--io-mode",
        choices=["direct", "buffered"],
        help="direct: O_DIRECT; buffered: write, fadvise(DONTNEED) before reads",
    )
    t(
        "--sync",
        choices=["entry", "none"],
        help="entry: each write fdatasync'd (and its directory fsync'd) before it completes; none: left to the "
        "kernel's writeback (a power cut may lose recent entries; checksums keep torn ones from being served)",
    )
    t(
        "--storage-backend",
        choices=["disk", "s3"],
        help="where the storage tier lives: disk (files under --cache-dir) or s3 (an object per entry in --s3-bucket, "
        "under a prefix of the run's own, deleted at the end unless --keep-cache; needs --storage-capacity-gb)",
    )
    t("--s3-bucket", help="with --storage-backend s3: the bucket (it must exist)")
    t(
        "--s3-endpoint",
        help="with --storage-backend s3: the endpoint URL (default $AWS_ENDPOINT_URL, else AWS); credentials as boto3 "
        "finds them ($AWS_ACCESS_KEY_ID and $AWS_SECRET_ACCESS_KEY, a profile)",
    )
    t("--promote-on-hit", action="store_true", help="move entries hit in a lower tier back to the top tier")
    t("--target-usage-ratio", type=float, help="evict to keep each tier below this fill")
    t("--large-entry-limit-ratio", type=float, help="entries larger than this share of a tier skip it")
    x = group("execution")
    x("--max-concurrent-allocs", type=int, help="limit on concurrent prefill writes; 0 = no limit")
    x(
        "--io-workers",
        type=int,
        help="threads doing storage I/O (default 8; with --request-model reference one per user, up to 500)",
    )
    x(
        "--request-model",
        choices=["kvtier", "reference"],
        help="reference: the MLPerf reference's requests (whole-context entries, every earlier turn read, "
        ">= 10k-token requests prefill only, --max-concurrent-allocs bounds prefill writes); kvtier: kvtier's own "
        "(a turn stores the tokens it adds and reads the previous turn; --prefix-model chained uses it)",
    )
    x(
        "--num-clients",
        type=int,
        help="worker processes on this host, each with its share of users and its own cache subdirectory; under "
        "mpirun or srun (found from OMPI_COMM_WORLD_SIZE, PMI_SIZE or SLURM_STEP_NUM_TASKS, no flag needed) each rank "
        "is one such client, with "
        "<cache-dir>/rank-<r>, and rank 0 writes the merged results",
    )
    x("--precondition", action="store_true", help="sequential writes before the run to reach SSD steady state")
    x(
        "--precondition-size-gb",
        type=float,
        help="preconditioning volume, written over one file of at most the disk tier's size; 0 = 2x the disk tier",
    )
    x("--precondition-threads", type=int, help="preconditioning writers; 0 = one per CPU (os.cpu_count())")
    o = group("output")
    o("--output", help="results JSON (default results/<timestamp>.json)")
    o("--xlsx-output", help="also write an Excel workbook")
    o("--csv-output", help="also write a flat CSV of the metrics")
    o(
        "--io-trace-log",
        help="the reference's trace-only mode: the same requests and tier decisions with no device I/O (every tier "
        "a no-op of its size); one CSV row per operation in the reference's columns (Timestamp, Operation, "
        "Object_Size_Bytes, Tier, Key, Phase) for replaying elsewhere; .zst or .gz compresses",
    )
    o(
        "--io-op-log",
        help="a real run's log: one CSV row per storage operation done, with its host and device ms "
        "(.zst or .gz compresses)",
    )
    o("--plots", help="directory for PNG figures (latency CDFs, bandwidth and occupancy over time, ...)")
    o("--html-output", help="a self-contained HTML report of the run (kvtier report's page: tables, interactive plots)")
    o("--keep-cache", action="store_true", help="leave the run's entries in the cache dir")
    o(
        "--enable-latency-tracing",
        action="store_true",
        help="trace the run with bpftrace (root): block and syscall latency histograms and a distilled fio job "
        "go into the results; the raw trace next to the output",
    )
    add("--config", help="config.yaml with any of the keys above and the sections")
    tr = p.add_argument_group("trials (the spec asks for 3-5 per configuration, median reported)")
    tr.add_argument(
        "--trials",
        type=int,
        help="run N trials, each with a fresh cache, into <output stem>-trial<i>.json; --output gets the medians, "
        "min, max and CV of every figure",
    )
    tr.add_argument("--vary-seed", action="store_true", help="trial i uses seed + i - 1 (default: one seed for all)")
    tr.add_argument(
        "--submission-check",
        action="store_true",
        help="after the run, check the results against the spec's submission checklist (as `kvtier check` does); "
        "exit 1 if an item fails",
    )
    add("--no-progress", action="store_true", help="no live status line")
    add("--log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"])
    return p


# Options of this invocation, not of the run's configuration.
NOT_CONFIG = ("config", "no_progress", "log_level", "trials", "vary_seed", "submission_check")


def cli_values(args: argparse.Namespace) -> dict:
    """The config values given on the command line, by argparse dest (SECTION_FLAGS says which set a section key)."""
    values = {k: v for k, v in vars(args).items() if k not in NOT_CONFIG}
    if getattr(args, "no_progress", False):
        values["progress"] = False
    return values


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    # A section flag overrides its key of the section and keeps the section's others (from config.yaml or defaults).
    return load_config(getattr(args, "config", None), cli_values(args), SECTION_FLAGS)


@command("bench")
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    set_log_level(PROG, args.log_level)
    inv = Invocation(
        getattr(args, "trials", None), getattr(args, "vary_seed", False), getattr(args, "submission_check", False)
    )
    if world_size() > 1:  # started by mpirun: this process is one rank of the job
        return run_rank(lambda: config_from_args(args), inv)
    cfg = config_from_args(args)
    check_modes(cfg, inv)
    output, is_default, claim = check_output_paths(cfg, inv.trials)
    with claim:
        if inv.trials:
            code = run_trials(cfg, output, is_default, inv.trials, inv.vary_seed)
        elif cfg.num_clients > 1:
            code = run_clients(cfg, output, is_default)
        else:
            code = run_single(cfg, output, is_default)
    if inv.submission_check and code == 0:
        code = check_main([output])
    return code
