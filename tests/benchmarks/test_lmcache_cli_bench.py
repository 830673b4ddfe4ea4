"""benchmarks/lmcache_cli_bench.py: LMCache 0.5.7's `lmcache bench l2` run for real on kvtier's adapter and LMCache's
fs adapter (the CLI from .venv-lmcache057, which `make test` builds), and its user errors."""

import json
import os
from pathlib import Path

import pytest

import benchmarks.lmcache_cli_bench as bench

ROOT = Path(__file__).resolve().parents[2]

needs_cli = pytest.mark.skipif(
    not os.access(bench.DEFAULT_CLI, os.X_OK), reason="no .venv-lmcache057 (make test-lmcache057 builds it)"
)


@pytest.mark.slow
@needs_cli
def test_three_sides_in_one_invocation_all_verified(tmp_path, capsys):
    # Three runs of the tool (about 8 s each here, mostly its imports); the cold-cache load runs (three more, and
    # drop_caches) are left to `make bench-lmcache-cli`.
    args = ["--num-keys", "4", "--in-flight", "2", "--rounds", "1", "--repeats", "1", "--dir", str(tmp_path / "w")]
    rc = bench.main([*args, "--no-cold-load", "--json", str(tmp_path / "r.json")])
    out = capsys.readouterr().out
    assert rc == 0, out
    results = {r["side"]: r for r in json.loads((tmp_path / "r.json").read_text())["results"]}
    assert set(results) == set(bench.SIDES)
    for r in results.values():
        # The tool's own integrity check passed, and every key of every round was stored, found and loaded.
        assert r["ok"] and r["verified"] and r["store_mibps"] > 0 and r["load_mibps"] > 0
        assert r["cold_load_mibps"] is None
    assert "ratio kvtier (direct) / lmcache-fs (use_odirect): store" in out
    assert not (tmp_path / "w" / "kvtier").exists()  # each side's directory is removed after its run


def test_a_failed_side_is_flagged_in_the_table():
    ok = {"store_mibps": 100.0, "lookup_keys_per_s": 1e4, "load_mibps": 200.0, "cold_load_mibps": None}
    rows = [{**ok, "side": s, "verified": True, "ok": s != "kvtier (direct)", "log": None} for s in bench.SIDES]
    text = bench.table(rows)
    assert text.count("FAILED") == 1 and "ratio kvtier (direct) / lmcache-fs (use_odirect): store 1.00x" in text


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--lmcache", "/nonexistent/lmcache"], "no lmcache CLI at /nonexistent/lmcache"),
        (["--data-size-kb", "6", "--no-cold-load"], "multiple of 4"),
        (["--rounds", "0", "--no-cold-load"], "--rounds must be at least 1"),
    ],
)
def test_user_mistakes_are_one_line_and_exit_2(argv, needle, capsys, monkeypatch):
    monkeypatch.setattr(bench.os, "access", lambda p, m: "nonexistent" not in str(p))
    assert bench.main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1
