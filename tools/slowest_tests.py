"""The slowest tests of a `make test` run, from the durations files each tier wrote (tests/conftest.py's
--durations-file): where the suite's time goes, across tiers.

    python tools/slowest_tests.py test-durations/*.json [-n 20]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", type=Path, help="durations files (JSON)")
    ap.add_argument("-n", type=int, default=20, help="how many to print (default 20)")
    a = ap.parse_args()
    rows, totals = [], []
    for path in a.files:
        doc = json.loads(path.read_text())
        totals.append(f"{path.stem} {doc['total_s']:.0f} s over {len(doc['tests'])} tests")
        rows += [(t["s"], path.stem, t["test"]) for t in doc["tests"]]
    print(f"slowest {a.n} tests ({'; '.join(totals)}; wall time per test, set-up and tear-down included):")
    for s, tier, test in sorted(rows, reverse=True)[: a.n]:
        print(f"{s:8.1f} s  {tier:<7} {test}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
