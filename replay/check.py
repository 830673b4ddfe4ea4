"""`kvtier check`: a run directory of the MLPerf KV cache harness against Rules.md section 6 by rule ID
(replay/mlperf/rules.py), or kvtier bench results files against the MLPerf KV cache spec's checklist
(replay/synthetic/check.py).

One entry for both, here above the two: the drivers know nothing of the MLPerf harness package, which knows nothing
of the drivers (tests/test_layers.py). A directory among the arguments makes it a run directory's check.
"""

from __future__ import annotations

import os
import sys

from kvconnector.errors import UserError

from .common.cli import command

PROG = "kvtier check"


@command("check")
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    given = [a for a in argv if not a.startswith("-")]
    dirs = [a for a in given if os.path.isdir(a)]
    if not dirs or any(a in ("-h", "--help") for a in argv):
        from .synthetic.check import main as check_files

        return check_files(argv)
    if len(given) != 1 or len(argv) != 1:
        raise UserError(f"{dirs[0]}: a run directory is checked alone (give one RUN_DIR, or results files)")
    return check_run_dir(dirs[0])


def check_run_dir(run_dir: str) -> int:
    """Print one line per finding; exit 0 when every rule holds, 1 when one fails (RunDirError: 2)."""
    from .mlperf.record import read_run
    from .mlperf.rules import check_run, failed

    rec = read_run(run_dir)
    findings = check_run(rec)
    for f in findings:
        print(f.line())
    bad = failed(findings, rec.mode)
    rules = {f.rule for f in findings if f.verdict != "SKIP"}
    failing = {f.rule for f in bad}
    print(
        f"{PROG}: {run_dir} ({rec.layout}'s layout, {rec.mode or 'mode not recorded'}): {len(rules - failing)} of"
        f" {len(rules)} rules hold" + (f"; failing: {', '.join(sorted(failing))}" if failing else ""),
        file=sys.stderr,
    )
    return 1 if bad else 0


if __name__ == "__main__":  # as `kvtier ...`: logging and signals set up by the dispatcher (replay/cli.py)
    from replay.cli import main as kvtier

    sys.exit(kvtier(["check", *sys.argv[1:]]))
