"""kvtier's aggregation of rank files equals mlpstorage's own, field by field, on the same run tree.

mlpstorage's `KVCacheBenchmark._aggregate_option_results` (mlpstorage_py/benchmarks/kvcache.py, hazemawadalla/storage
rules-pr 2f65ef1) is run from a checkout named by KVTIER_MLPSTORAGE_SRC, in a child process of this Python (its
kvcache module imports only what kvtier's environment holds: psutil, yaml, rich, pydantic, packaging, dotenv). The
method reads two attributes of its object, a logger and the parsed arguments' hosts; the child gives it an object
holding just those. Skipped when no checkout is named: the suite cannot reach GitHub.

The tree has every case the aggregation treats differently: complete trials (sums and means), a rank directory
without a file, an unreadable file, a CPU-tier rank, a trial directory that is absent altogether, a failed rank's
file set aside by the shim. Every field of mlpstorage's entry must be equal in kvtier's (which has the extras of
`EXTRA_OPTION_KEYS` besides)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlperf_helpers import full_tree, put, rank_doc

from replay.mlperf.options import OPTIONS
from replay.mlperf.summary import EXTRA_OPTION_KEYS, aggregate_option

SRC = os.environ.get("KVTIER_MLPSTORAGE_SRC", "")
MODULE = Path(SRC) / "mlpstorage_py" / "benchmarks" / "kvcache.py"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (SRC and MODULE.is_file()),
        reason="no mlpstorage checkout: set KVTIER_MLPSTORAGE_SRC to one of hazemawadalla/storage at 2f65ef1 "
        "(git clone -b rules-pr https://github.com/hazemawadalla/storage)",
    ),
]

# the checkout (not installed) on the children's path: mlpstorage_py is imported from there
CHILD_ENV = {**os.environ, "PYTHONPATH": SRC}

CHILD = """
import json, logging, sys, types
src, cases = sys.argv[1], json.loads(sys.argv[2])
from mlpstorage_py.benchmarks.kvcache import KVCacheBenchmark
me = types.SimpleNamespace(logger=logging.getLogger("mlpstorage"), args=types.SimpleNamespace(hosts=None))
out = [KVCacheBenchmark._aggregate_option_results(me, o, dirs, n) for o, dirs, n in cases]
print(json.dumps(out))
"""


def mlpstorage_aggregates(cases: list) -> list[dict]:
    r = subprocess.run(
        [sys.executable, "-c", CHILD, SRC, json.dumps(cases)],
        capture_output=True,
        text=True,
        timeout=120,
        env=CHILD_ENV,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.splitlines()[-1])


def test_kvtiers_aggregation_is_mlpstorages(tmp_path):
    run = tmp_path / "run"
    full_tree(run)  # Option 1: 2 ranks x 3 trials, complete
    put(run, 2, 0, 0, rank_doc(2.0, 1.0, 100, 50, 5, 6, 7))
    (run / "option_2" / "trial_0" / "rank_1").mkdir()  # a rank that wrote nothing
    put(run, 2, 1, 0, {"summary": {"avg_throughput_tokens_per_sec": 80, "cache_stats": {"storage_entries": 0}}})
    put(run, 2, 1, 1, "{not json")
    put(run, 2, 2, 0, rank_doc(0.25, 0.5, 7, 3, 11, 2, 2))
    put(run, 2, 2, 1, rank_doc(9.0, 9.0, 9, 9, 99, 9, 9), "kvtier_failed_kvcache_results_1.json")
    put(run, 3, 0, 0, rank_doc(3.0, 1.5, 33, 22, 8, 5, 4, entries=0))  # CPU-tier, with storage figures
    put(run, 3, 0, 1, rank_doc(1.0, 0.5, 11, 44, 2, 1, 1))  # trial_1 of Option 3 never ran: absent
    cases = [
        (1, [str(run / "option_1" / f"trial_{t}") for t in range(3)], 2),
        (2, [str(run / "option_2" / f"trial_{t}") for t in range(3)], 2),
        (3, [str(run / "option_3" / f"trial_{t}") for t in range(2)], 2),
        (3, [], 2),  # no trial at all
        (1, [str(run / "option_1" / "trial_0")], 3),  # more ranks asked for than ran
    ]
    theirs = mlpstorage_aggregates(cases)
    ours = [aggregate_option(*case) for case in cases]
    for case, t, o in zip(cases, theirs, ours):
        assert set(o) == set(t) | set(EXTRA_OPTION_KEYS), case
        assert {k: o[k] for k in t} == t, case
    assert [t["partial_failure"] for t in theirs] == [False, True, True, False, True]  # the tree covers each case
    assert (
        theirs[1]["cpu_tier_ranks"] and theirs[2]["cpu_tier_ranks"] and theirs[3]["aggregated_p95_latency_ms"] is None
    )


def test_the_options_are_mlpstorages_workload_params():
    child = (
        "import json;from mlpstorage_py.benchmarks.kvcache import WORKLOAD_PARAMS; print(json.dumps(WORKLOAD_PARAMS))"
    )
    r = subprocess.run([sys.executable, "-c", child, SRC], capture_output=True, text=True, timeout=120, env=CHILD_ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    theirs = {int(k): v for k, v in json.loads(r.stdout.splitlines()[-1]).items()}
    assert sorted(theirs) == sorted(OPTIONS)
    for number, params in theirs.items():
        flags = OPTIONS[number].flags()
        ours = dict(zip(flags[::2], flags[1::2]))
        assert ours == {f"--{k}": f"{v:g}" if isinstance(v, float) else str(v) for k, v in params.items()}
