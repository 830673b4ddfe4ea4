"""`kvtier check` and mlpstorage's own kvcache checks on the same hand-altered run directories.

mlpstorage at hazemawadalla/storage rules-pr 2f65ef1 has two kvcache checks: the submission checker's KVCacheCheck
(mlpstorage_py/submission_checker/checks/kvcache_checks.py), a stub whose one check returns True for any tree (its
docstring: Rules.md section 6 had no IDs when it was written), and the run-rules checker KVCacheRunRulesChecker
(mlpstorage_py/rules/run_checkers/kvcache.py, through BenchmarkVerifier), which reads only the metadata's
`parameters` (never the rank files, trials, seeds or cache directories) and calls `gpu_mem_gb` below 1 GiB and a
duration under 30 s INVALID, so it finds Table KVCache-1 itself (gpu-mem-gb 0) INVALID. Neither can tell the trees
apart; Rules.md 6.3 says so ("the kvcache submission checker is currently a stub"). This test runs both from a
checkout named by KVTIER_MLPSTORAGE_SRC on the good tree and on the five trees kvtier rejects (a missing rank,
2 trials in CLOSED, a changed Option parameter, two ranks sharing a cache dir, all ranks CPU-tier), and holds what
each says: kvtier accepts the one and rejects the five by rule ID; mlpstorage's verdict is the same for all six.
When a later mlpstorage implements the checks, the last assertion fails and this test is to be turned round.
Skipped without a checkout: the suite cannot reach GitHub."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlperf_helpers import edit_rank, finish, harness_tree, rank_file, write_metadata

from replay.check import main

SRC = os.environ.get("KVTIER_MLPSTORAGE_SRC", "")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (SRC and (Path(SRC) / "mlpstorage_py" / "rules" / "verifier.py").is_file()),
        reason="no mlpstorage checkout: set KVTIER_MLPSTORAGE_SRC to one of hazemawadalla/storage at 2f65ef1",
    ),
]

CHILD = """
import json, logging, sys, types
src, dirs = sys.argv[1], json.loads(sys.argv[2])
from mlpstorage_py.rules.verifier import BenchmarkVerifier
from mlpstorage_py.submission_checker.checks.kvcache_checks import KVCacheCheck
log = logging.getLogger("mlpstorage")
log.status = log.verbose = log.verboser = log.ridiculous = log.info
stub = KVCacheCheck.__new__(KVCacheCheck)
stub.init_checks()
out = []
for d in dirs:
    v = BenchmarkVerifier(d, logger=log)
    verdict = v.verify()
    out.append({"verifier": str(verdict), "issues": sorted(i.message for i in v.issues),
                "submission_checks": [bool(c()) for c in stub.checks]})
print(json.dumps(out))
"""


def trees(root: Path) -> dict[str, Path]:
    cache, results = Path("/nonexistent-cache"), root
    made = {}

    def tree(name, trials=3):
        run = root / name
        return run, harness_tree(run, cache, results, trials=trials)

    run, _ = tree("good")
    made["good"] = run
    run, _ = tree("missing rank")
    rank_file(run, 2, 1, 1).unlink()
    made["missing rank"] = run
    run, meta = tree("2 trials", trials=2)
    meta["args"]["trials"] = 2
    write_metadata(run, meta)
    made["2 trials"] = run
    run, meta = tree("changed parameter")
    for c in meta["command_output_files"]:
        c["command"] = c["command"].replace("--num-users 200", "--num-users 100")
    write_metadata(run, meta)
    for t in range(3):
        for r in range(2):
            edit_rank(run, 1, t, r, lambda d: d["config"].update(num_users=100))
    made["changed parameter"] = run
    run, _ = tree("shared cache")
    edit_rank(run, 1, 0, 1, lambda d: d["config"].update(cache_dir=d["config"]["cache_dir"][:-1] + "0"))
    made["shared cache"] = run
    run, _ = tree("all CPU-tier")
    for t in range(3):
        for r in range(2):
            edit_rank(run, 2, t, r, lambda d: d["summary"]["cache_stats"].update(storage_entries=0))
    made["all CPU-tier"] = run
    for name, run in made.items():
        finish(run, 2, 2 if name == "2 trials" else 3)
    return made


def test_kvtier_tells_the_trees_apart_and_mlpstorages_checks_at_the_pinned_commit_cannot(tmp_path, capsys):
    made = trees(tmp_path)
    ours = {}
    for name, run in made.items():
        ours[name] = main([str(run)])
        capsys.readouterr()
    assert ours == {name: 0 if name == "good" else 1 for name in made}
    r = subprocess.run(
        [sys.executable, "-c", CHILD, SRC, json.dumps([str(d) for d in made.values()])],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": SRC},  # the checkout (not installed) on the child's path
    )
    assert r.returncode == 0, r.stderr[-3000:]
    theirs = dict(zip(made, json.loads(r.stdout.splitlines()[-1])))
    assert all(t["submission_checks"] == [True] for t in theirs.values())  # the stub passes everything
    assert "GPU memory must be at least 1.0GiB" in theirs["good"]["issues"]  # Table KVCache-1's gpu-mem-gb 0
    assert len({json.dumps(t, sort_keys=True) for t in theirs.values()}) == 1, theirs  # one verdict for all six
