"""`kvtier` command line: one subcommand per module, each exposing `main(argv) -> int`.

Subcommand modules are imported lazily so `kvtier bench --help` does not pay for aiohttp or matplotlib.

Every subcommand's main wears the error contract (replay/common/cli.py `command`, docs/errors.md): a refusal is
one line and exit 2, a bug exit 1 with its traceback in a log file. Here: logging set up once for every subcommand,
SIGINT/SIGTERM where a subcommand does not handle them itself (one line, 128 + the signal's number), and the same
contract around the one subcommand that cannot import it (tracing/ stands alone).
"""

from __future__ import annotations

import importlib
import sys

from .common.cli import Interrupted, closed_stdout_is_fine, fail, setup_logging, stop_signals_raise, under_contract

SUBCOMMANDS = {
    "bench": ("replay.synthetic.cli", "synthetic benchmark of the tiered KV store, in-process (no vLLM needed)"),
    "replay": ("replay.openai.cli", "replay ShareGPT / BurstGPT / synthetic load against an OpenAI-compatible server"),
    "compare": ("replay.synthetic.compare", "side-by-side table of result JSON files, with ratios"),
    "check": ("replay.check", "MLPerf rules: a harness run directory by rule ID, or kvtier bench results files"),
    "merge": ("replay.synthetic.merge", "merge kvtier bench results of several processes, hosts or trials into one"),
    "throttlefs": ("deploy.throttle.cli", "mount a FUSE passthrough that caps bandwidth and adds per-op latency"),
    "sweep": ("deploy.sweep.cli", "run bench or replay once per throttlefs bandwidth x latency point; heat maps"),
    "plan": ("replay.plan.cli", "predict per-round prefix hit rates of long sessions over tiers, and the collapse"),
    "report": ("replay.report", "one self-contained HTML report (tables, interactive plots) of result files"),
    "distill": ("tracing.distill", "turn a bpftrace storage trace into a standalone fio job"),
    "conformance": ("replay.conformance", "an LMCache L2 adapter through failures: restarts, flipped bytes, kill -9"),
    "mlperf": ("replay.mlperf.cli", "kvtier under the MLPerf Storage harness (mlpstorage): its shim, its run summary"),
}

USAGE = (
    "usage: kvtier {"
    + ",".join(SUBCOMMANDS)
    + "} [options]   (kvtier SUBCOMMAND --help for each)\n\n"
    + "\n".join(f"  {name:<{max(map(len, SUBCOMMANDS))}}  {summary}" for name, (_, summary) in SUBCOMMANDS.items())
    + "\n\nexamples:\n"
    + "  kvtier bench --duration 30 --num-users 50 --cache-dir /mnt/nvme --output run.json\n"
    + "  kvtier replay --base-url http://127.0.0.1:8000 --model M --source synthetic --num-requests 100\n"
    + "  kvtier compare a.json b.json\n"
    + "  kvtier report a.json b.json -o report.html\n"
    + "  kvtier help bench        (the same as kvtier bench --help)\n"
    + "  kvtier --version         (-V: the version, and the commit where one is known)"
)


def main(argv: list[str] | None = None) -> int:
    with closed_stdout_is_fine():  # `kvtier ... | head`: the reader's choice, not the command's failure
        return _main(list(sys.argv[1:] if argv is None else argv))


def version_line() -> str:
    """`kvtier 0.1.0`, and the commit where one is known: the git checkout it runs from, else the one pip recorded
    when it installed kvtier from a repository (direct_url.json)."""
    from .outputs.provenance import provenance

    p = provenance()
    commit, dirty = p["commit"], p["dirty"]
    if commit is None:
        commit = _installed_commit()
    if commit is None:
        return f"kvtier {p['kvtier_version']}"
    return f"kvtier {p['kvtier_version']} (commit {commit[:12]}{', with local changes' if dirty else ''})"


def _installed_commit() -> str | None:
    import json
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        text = distribution("kvtier").read_text("direct_url.json")
        commit = json.loads(text or "{}").get("vcs_info", {}).get("commit_id")
    except (PackageNotFoundError, ValueError, AttributeError):
        return None
    return commit if isinstance(commit, str) else None


def _main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        print(version_line())
        return 0
    if argv[0] == "help":  # `kvtier help`, `kvtier help SUB`: what --help says
        if len(argv) == 1:
            print(USAGE)
            return 0
        if argv[1] not in SUBCOMMANDS or len(argv) > 2:
            what = " ".join(argv[1:])
            return fail("kvtier", f"help {what}: not a subcommand (one of {', '.join(SUBCOMMANDS)})")
        return run_subcommand(argv[1], ["--help"])
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        return fail("kvtier", f"unknown subcommand '{name}' (one of {', '.join(SUBCOMMANDS)}; see 'kvtier --help')")
    return run_subcommand(name, rest)


def run_subcommand(name: str, argv: list[str]) -> int:
    """`kvtier NAME ARGV...` under the error contract (replay/common/cli.py `command`); returns the exit status."""
    prog = f"kvtier {name}"
    setup_logging(prog)
    # Any subcommand stopped by SIGINT or SIGTERM where it does not handle them itself: one line, 128 + signal.
    with stop_signals_raise():
        try:
            # `tracing` stands alone and cannot wear `command`: its main runs under the same contract from here
            return under_contract(name, lambda args: importlib.import_module(SUBCOMMANDS[name][0]).main(args), argv)
        except Interrupted as exc:
            print(f"{prog}: interrupted ({exc})", file=sys.stderr)
            return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
