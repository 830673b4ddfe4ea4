"""`kvtier bench`: the synthetic benchmark of the tiered KV store (no vLLM, no GPU needed)."""

from __future__ import annotations

import argparse
import logging
import sys

from pydantic import ValidationError

from kvconnector.errors import ConfigError, KvtierError, StorageFullError
from kvconnector.models import CATALOG

from .bench_config import BenchConfig
from .bench_view import LiveView, print_summary
from .results import write_json
from .synthetic.bench import Bench, default_output_path

EXAMPLES = """\
examples:
  kvtier bench                                   # tiny-1b, 100 users, 60 s, 4 GB CPU tier + a temp disk tier
  kvtier bench --duration 30 --num-users 50 --cache-dir /mnt/nvme --output run.json
  kvtier bench --model llama3.1-8b --cpu-mem-gb 0 --gpu-mem-gb 0 --cache-dir /mnt/nvme   # storage only
  kvtier bench --generation-mode realistic --num-users 1000 --duration 120
  kvtier bench --model ./my-model/config.json --kv-dtype fp8 --io-mode buffered
  kvtier bench --max-requests 500 --request-rate 20 --seed 7 --promote-on-hit

exit status: 0 done, 1 run failed (e.g. filesystem full; partial results written), 2 bad arguments, 130 interrupted
(partial results written).
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvtier bench",
        description="Drive the tiered KV store (GPU -> CPU -> disk, waterfall LRU) with simulated LLM users and "
        "measure what each tier costs a request. Flags follow the MLPerf Storage KV Cache benchmark.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    w = p.add_argument_group("workload")
    w.add_argument("--model", default="tiny-1b", help=f"one of {', '.join(CATALOG)}, or a Hugging Face config.json path (default tiny-1b)")
    w.add_argument("--kv-dtype", default="bf16", choices=["bf16", "fp16", "fp8", "int8", "fp32"], help="KV cache element type (default bf16)")
    w.add_argument("--num-users", type=int, default=100, help="simulated users (default 100)")
    w.add_argument("--duration", type=float, default=60, help="run window in seconds (default 60)")
    w.add_argument("--max-requests", type=int, default=0, help="stop after this many completed requests (0 = no limit)")
    w.add_argument("--request-rate", type=float, default=0, help="cap on requests started per second (0 = closed loop)")
    w.add_argument("--seed", type=int, help="seed for users, sizes and payloads (repeatable runs)")
    w.add_argument("--disable-multi-turn", action="store_true", help="every conversation has one turn")
    w.add_argument("--generation-mode", default="none", choices=["none", "fast", "realistic"],
                   help="simulated GPU time per generated token: none 0 ms, fast 2 ms, realistic 30 ms (default none)")
    w.add_argument("--decode-batch-size", type=int, default=32, help="tokens per decode read (default 32)")
    t = p.add_argument_group("tiers")
    t.add_argument("--gpu-mem-gb", type=float, default=None, help="GPU tier size (default 16 with CUDA, 0 without)")
    t.add_argument("--cpu-mem-gb", type=float, default=4.0, help="CPU tier size (default 4; 0 disables)")
    t.add_argument("--cache-dir", help="where the disk tier writes (a fresh subdirectory per run; default a temp dir in /var/tmp)")
    t.add_argument("--storage-capacity-gb", type=float, default=0, help="disk tier size (0 = free space of the filesystem)")
    t.add_argument("--io-mode", default="direct", choices=["direct", "buffered"],
                   help="direct: O_DIRECT; buffered: write+fdatasync, fadvise(DONTNEED) before reads (default direct)")
    t.add_argument("--promote-on-hit", action="store_true", help="move entries hit in a lower tier back to the top tier")
    t.add_argument("--target-usage-ratio", type=float, default=0.8, help="evict to keep each tier below this fill (default 0.8)")
    t.add_argument("--large-entry-limit-ratio", type=float, default=0.95, help="entries larger than this share of a tier skip it (default 0.95)")
    x = p.add_argument_group("execution and output")
    x.add_argument("--max-concurrent-allocs", type=int, default=0, help="limit on concurrent prefill writes (0 = no limit)")
    x.add_argument("--io-workers", type=int, default=8, help="threads doing storage I/O (default 8)")
    x.add_argument("--output", help="results JSON (default results/<timestamp>.json)")
    x.add_argument("--keep-cache", action="store_true", help="leave the run's entries in the cache dir")
    x.add_argument("--no-progress", action="store_true", help="no live status line")
    x.add_argument("--log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    fields = {k: v for k, v in vars(args).items() if k not in ("no_progress", "log_level")}
    fields["progress"] = not args.no_progress
    return BenchConfig(**fields)


def _fail(msg: str, code: int = 2) -> int:
    print(f"kvtier bench: {msg}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="kvtier: %(levelname)s %(message)s")
    try:
        cfg = config_from_args(args)
    except ValidationError as exc:
        err = exc.errors()[0]
        return _fail(f"--{'-'.join(str(p) for p in err['loc']).replace('_', '-')}: {err['msg']}")
    output = cfg.output or default_output_path()
    bench = Bench(cfg)
    try:
        bench.prepare()
    except ConfigError as exc:
        return _fail(str(exc))
    for note in bench.notes:
        print(f"kvtier bench: {note}", file=sys.stderr)
    try:
        with LiveView(cfg.duration, enabled=cfg.progress) as view:
            doc = bench.run(on_sample=view.update)
    except KvtierError as exc:
        bench.cleanup()
        return _fail(str(exc), 1)
    finally:
        bench.cleanup()
    write_json(output, doc)
    print_summary(doc, output)
    if doc["status"] == "failed":
        err = doc["error"] or "unknown error"
        hint = " (filesystem full)" if "space" in err else ""
        return _fail(f"run failed{hint}: {err}; partial results in {output}", 1)
    if doc["status"] == "interrupted":
        print(f"kvtier bench: interrupted; partial results in {output}", file=sys.stderr)
        return 130
    return 0
