"""`kvtier conformance` on real LMCache L2 adapters, built by LMCache's own registry: kvtier's adapter passes every
case; LMCache's fs adapter runs through the same cases (its verdicts are findings, published in
benchmarks/pages/conformance.md, not asserted here beyond the round trip); each case can fail (a damaged object
served, a lost acknowledged one, a capacity overrun are counted from what the adapter returned). `make test` runs the
two adapter runs on LMCache 0.5.7rc2 too (LMC057_TESTS)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("lmcache")
from replay import conformance

pytestmark = pytest.mark.slow  # each run builds adapters five times and starts a child: 15-25 s here


def run(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "replay.cli", "conformance", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def verdicts(stdout: str) -> dict[str, str]:
    return {
        line.split()[1].rstrip(":"): line.split()[0]
        for line in stdout.splitlines()
        if line.split()[:1] and line.split()[0] in ("PASS", "FAIL", "N/A")
    }


def test_kvtier_adapter_passes_every_case(tmp_path):
    p = run("--adapter", "kvtier", "--medium", str(tmp_path / "m"), "--json", str(tmp_path / "v.json"))
    assert p.returncode == 0, p.stdout + p.stderr[-2000:]
    assert verdicts(p.stdout) == dict.fromkeys(
        ["round_trip", "restart_keeps_acknowledged", "flipped_byte_not_served", "kill9_mid_store", "capacity_held"],
        "PASS",
    )
    doc = json.loads((tmp_path / "v.json").read_text())
    assert doc["provenance"]["argv"][:2] == ["kvtier", "conformance"] and len(doc["cases"]) == 5


def test_lmcache_fs_adapter_runs_every_case_and_exits_by_its_verdicts(tmp_path):
    p = run("--adapter", "fs", "--medium", str(tmp_path / "m"))
    seen = verdicts(p.stdout)
    assert len(seen) == 5 and seen["round_trip"] == "PASS", p.stdout + p.stderr[-2000:]
    assert seen["capacity_held"] == "N/A"  # it has no capacity of its own: LMCache's MP server evicts for it
    assert p.returncode == (1 if "FAIL" in seen.values() else 0)


def test_a_damaged_object_served_fails_the_case(tmp_path, monkeypatch):
    """The flipped-byte case counts what a load returned against what was stored: an adapter that serves the
    damaged bytes (here kvtier's, its check turned off by serving the raw file) fails it."""
    cfg = conformance.adapter_config("kvtier", None, tmp_path)
    a = conformance.build(cfg)
    try:
        assert conformance.store(a, [1, 2])
        real_load = conformance.load
        monkeypatch.setattr(
            conformance, "load", lambda a, idx: {i: b[:-1] + bytes([b[-1] ^ 1]) for i, b in real_load(a, idx).items()}
        )
        assert conformance.served(a, [1, 2]) == (0, 2, 0)  # (intact, damaged, missing)
    finally:
        a.close()


@pytest.mark.parametrize(
    "args, said",
    [
        (["--adapter", "kvtier", "--config", '{"type": "fs"}'], "one of them"),
        (["--config", "{not json"], "--config: not JSON"),
        (["--config", '["fs"]'], 'a JSON object with a "type"'),
        (["--config", '{"type": "no-such-adapter"}'], "no LMCache L2 adapter type 'no-such-adapter' (LMCache has "),
        (["--config", '{"type": "fs"}'], "could not be built"),  # fs without its base_path
        (["--adapter", "kvtier", "--capacity-mib", "0"], "must be above 0"),
    ],
)
def test_mistakes_are_one_line_and_exit_2(tmp_path, args, said):
    p = run(*args, "--medium", str(tmp_path / "m"))
    assert p.returncode == 2 and said in p.stderr, p.stderr
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("kvtier conformance: ")
    assert not (tmp_path / "m").exists()  # nothing made for a refused run


def test_a_medium_holding_files_is_refused_and_left_as_it_was(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "precious").write_bytes(b"user data")
    p = run("--adapter", "fs", "--medium", str(tmp_path / "m"))
    assert p.returncode == 2 and "not an empty directory" in p.stderr
    assert (tmp_path / "m" / "precious").read_bytes() == b"user data"


def test_a_storing_process_that_acknowledges_nothing_fails_the_kill_case_without_waiting_forever(monkeypatch):
    monkeypatch.setattr(conformance, "KILL_WITHIN_S", 20.0)
    case = conformance.kill9_case({"type": "fs", "base_path": "/proc/kvtier-conformance-cannot-write-here"})
    assert case.verdict == "fail" and case.figure.startswith("0 stores acknowledged"), case
