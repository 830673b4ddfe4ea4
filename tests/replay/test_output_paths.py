"""Output paths, for every subcommand: one check before a run (`claim_outputs`) refuses two outputs on one file
(however the second is spelled: `./`, `..`, an absolute path, a symlink, a hard link), an output that is an input, an
existing file where the command never replaces one (merge without --force, sweep), and a path another running kvtier
command holds; the claim is atomic (a flock), so concurrent commands on one output give one winner and clear errors,
and a killed holder's claim is taken over. Refused commands create nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from bench_helpers import run, write_config

from kvconnector.errors import ConfigError
from replay.outputs.paths import claim_outputs

PY = sys.executable


def listing(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# Ways to name one file twice; each gets (tmp_path) and returns the second spelling of tmp_path/"out.json".
def _symlink(t):
    (t / "link.json").symlink_to(t / "out.json")
    return t / "link.json"


def _symlinked_dir(t):
    (t / "d").symlink_to(t)
    return t / "d" / "out.json"


def _hard_link(t):
    (t / "out.json").write_text("{}")
    os.link(t / "out.json", t / "hard.json")
    return t / "hard.json"


def _existing_symlink(t):
    (t / "out.json").write_text("{}")
    return _symlink(t)


SECOND_SPELLINGS = {
    "same string": lambda t: t / "out.json",
    "./": lambda t: t / "." / "out.json",
    "sub/..": lambda t: (t / "sub").mkdir() or t / "sub" / ".." / "out.json",
    "relative": lambda t: os.path.relpath(t / "out.json"),
    "dangling symlink": _symlink,
    "symlink to an existing file": _existing_symlink,
    "symlinked directory": _symlinked_dir,
    "hard link": _hard_link,
}


@pytest.mark.parametrize("spelling", SECOND_SPELLINGS)
def test_two_outputs_on_one_file_are_refused_and_nothing_is_created(tmp_path, spelling):
    second = str(SECOND_SPELLINGS[spelling](tmp_path))
    before = listing(tmp_path)
    with pytest.raises(ConfigError, match="also given to --output"):
        claim_outputs({"--output": str(tmp_path / "out.json"), "--csv-output": second})
    with pytest.raises(ConfigError, match="also given to --output"):  # a file output where a directory goes
        claim_outputs({"--output": str(tmp_path / "out.json")}, {"--plots": second})
    assert listing(tmp_path) == before


@pytest.mark.parametrize("spelling", ["same string", "./", "symlink to an existing file", "hard link"])
def test_an_input_is_never_an_output(tmp_path, spelling):
    (tmp_path / "out.json").write_text("{}")
    second = str(SECOND_SPELLINGS[spelling](tmp_path))
    with pytest.raises(ConfigError, match="is also the input --dataset-path"):
        claim_outputs({"--output": second}, inputs={"--dataset-path": str(tmp_path / "out.json")})
    assert (tmp_path / "out.json").read_text() == "{}"


def test_a_claim_holds_until_released_and_leaves_nothing(tmp_path):
    out = tmp_path / "new" / "deeper" / "out.json"
    claim = claim_outputs({"--output": str(out)})
    assert out.parent.is_dir() and not out.exists()  # the directory made for the claim, the file not yet
    with pytest.raises(ConfigError, match=rf"another kvtier command \(pid {os.getpid()}\) is writing it"):
        claim_outputs({"-o": str(out)})
    claim.release()
    assert listing(tmp_path) == []  # claim file and the directories made for it gone: nothing was written
    with claim_outputs({"-o": str(out)}):  # free again
        out.write_text("x")
    assert listing(tmp_path) == ["new", "new/deeper", "new/deeper/out.json"]


@pytest.mark.parametrize("replace, ok", [(True, True), (False, False), (["--csv"], False), (["--output"], True)])
def test_an_existing_file_is_replaced_only_where_the_command_says(tmp_path, replace, ok):
    (tmp_path / "out.json").write_text("old")
    if ok:
        claim_outputs({"--output": str(tmp_path / "out.json")}, replace=replace).release()
    else:
        with pytest.raises(ConfigError, match=r"out\.json: exists; give a new path"):
            claim_outputs({"--output": str(tmp_path / "out.json")}, replace=replace)
    assert listing(tmp_path) == ["out.json"] and (tmp_path / "out.json").read_text() == "old"


HOLD = """
import os, sys, time
from replay.outputs.paths import claim_outputs
claim = claim_outputs({"--output": sys.argv[1]})
print("held", flush=True)
time.sleep(600)
"""


def test_a_killed_holders_claim_is_taken_over(tmp_path):
    out = tmp_path / "out.json"
    holder = subprocess.Popen([PY, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError, match=rf"pid {holder.pid}\) is writing it"):
            claim_outputs({"--output": str(out)})
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    assert (tmp_path / ".out.json.kvtier-claim").exists()  # left by the kill; the kernel dropped its lock
    claim_outputs({"--output": str(out)}).release()
    assert listing(tmp_path) == []


def test_a_killed_commands_claims_are_removed_by_the_next_command_in_that_directory(tmp_path):
    """Claims of outputs the next command does not write (a killed run's --csv-output) go too; a live one stays."""
    killed = subprocess.Popen([PY, "-c", HOLD, str(tmp_path / "a.csv")], stdout=subprocess.PIPE, text=True)
    live = subprocess.Popen([PY, "-c", HOLD, str(tmp_path / "b.json")], stdout=subprocess.PIPE, text=True)
    try:
        assert killed.stdout.readline().strip() == "held" and live.stdout.readline().strip() == "held"
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=30)
        with claim_outputs({"--output": str(tmp_path / "c.json")}):
            assert listing(tmp_path) == [".b.json.kvtier-claim", ".c.json.kvtier-claim"]
        with pytest.raises(ConfigError, match=rf"pid {live.pid}\) is writing it"):  # the live one still holds
            claim_outputs({"--output": str(tmp_path / "b.json")})
    finally:
        live.send_signal(signal.SIGKILL)
        live.wait(timeout=30)


@pytest.fixture(scope="module")
def two_results(tmp_path_factory):
    paths = []
    for seed in (11, 12):
        tmp = tmp_path_factory.mktemp(f"run-{seed}")
        assert run(tmp, seed=seed, duration=0.5).pop("_rc") == 0
        paths.append(str(tmp / "out.json"))
    return paths


@pytest.mark.parametrize("force", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_concurrent_merges_into_one_file_give_one_winner_and_clear_errors(two_results, tmp_path, force):
    out = tmp_path / "X.json"
    cmd = [PY, "-m", "replay.cli", "merge", *two_results, "-o", str(out), *(["--force"] if force else [])]
    procs = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
    codes = sorted(rc for rc, _ in results)
    if force:  # --force replaces: each may win in turn, but never two at once
        assert all(rc == 0 or "is writing it" in err for rc, err in results), results
    else:
        assert codes == [0, 2, 2], results
        for rc, err in results:
            if rc:
                assert ("is writing it" in err or "exists; pass --force" in err) and len(err.splitlines()) == 1, err
    assert json.loads(out.read_text())["summary"]["num_clients"] == 2
    assert listing(tmp_path) == ["X.json"]


# ---- every subcommand refuses two outputs on one file before it runs (exit 2, one line, nothing created) --------


def _bench(t, *flags):
    return [PY, "-m", "replay.cli", "bench", "--config", write_config(t), *flags]


COMMANDS = {
    "bench --output/--csv-output": lambda t: _bench(t, "--output", t / "a.json", "--csv-output", t / "./a.json"),
    "bench --xlsx-output/--output": lambda t: _bench(t, "--output", t / "a.json", "--xlsx-output", t / "a.json"),
    "bench --io-trace-log/--csv-output": lambda t: _bench(t, "--io-trace-log", t / "l", "--csv-output", t / "l"),
    "bench --io-op-log/--output": lambda t: _bench(t, "--io-op-log", t / "a.json", "--output", t / "a.json"),
    "bench --dataset-path as --output": lambda t: _bench(
        t, "--dataset-path", t / "config.yaml", "--output", t / "config.yaml"
    ),
    # the trials' own files: trial 1's results (x-trial1.json) and its CSV (from x.json) are one file
    "bench --trials file": lambda t: _bench(t, "--trials", "2", "--output", t / "x", "--csv-output", t / "x.json"),
    "replay --output/--detail": lambda t: [
        *("kvtier-replay", "--base-url", "http://127.0.0.1:9", "--model", "m", "--source", "synthetic"),
        *("--output", t / "z.json", "--detail", t / "z.json"),
    ],
    "replay --csv/--output": lambda t: [
        *("kvtier-replay", "--base-url", "http://127.0.0.1:9", "--model", "m", "--source", "synthetic"),
        *("--output", t / "z.json", "--csv", t / "sub" / ".." / "z.json"),
    ],
    "plan --plots/--output": lambda t: [
        *(PY, "-m", "replay.cli", "plan", "--concurrency", "4", "--rounds", "2", "--input-len", "50"),
        *("--output-len", "50", "--block-size", "16", "--kv-bytes-per-token", "1KB", "--tier", "dram=1GB"),
        *("--output", t / "p", "--plots", t / "p"),
    ],
    "compare --json an input": lambda t: [PY, "-m", "replay.cli", "compare", t / "r.json", "--json", t / "r.json"],
    "merge -o an input": lambda t: [PY, "-m", "replay.cli", "merge", t / "r.json", t / "s.json", "-o", t / "r.json"],
    "merge --csv-output/-o": lambda t: [
        *(PY, "-m", "replay.cli", "merge", t / "r.json", t / "s.json"),
        *("-o", t / "m.json", "--csv-output", t / "m.json"),
    ],
    "distill -o/--dump-json": lambda t: [
        *(PY, "-m", "replay.cli", "distill", "-i", t / "trace.txt", "-o", t / "j.fio", "--dump-json", t / "./j.fio"),
    ],
}


@pytest.mark.parametrize("name", COMMANDS)
@pytest.mark.slow
def test_every_subcommand_refuses_two_outputs_on_one_file(tmp_path, name):
    for f in ("r.json", "s.json", "trace.txt"):
        (tmp_path / f).write_text("{}")
    argv = [str(a) for a in COMMANDS[name](tmp_path)]
    if argv[0] == "kvtier-replay":
        argv[:1] = [PY, "-m", "replay.cli", "replay"]
    before = listing(tmp_path)
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and ("also" in lines[0] or "same file" in lines[0]), r.stderr
    assert listing(tmp_path) == before


def _sweep(t, *flags):
    return [PY, "-m", "replay.cli", "sweep", "--bw", "1GB/s", "--lat-ms", "0", "--driver", "bench", *flags]


@pytest.mark.parametrize(
    "existing, says",
    [
        ("s.json", "s.json: exists; give a new --output"),
        ("s.runs", "s.runs exists (an earlier sweep's runs)"),
    ],
)
@pytest.mark.slow
def test_a_sweep_run_again_never_replaces_the_earlier_one(tmp_path, existing, says):
    (tmp_path / existing).mkdir() if existing.endswith(".runs") else (tmp_path / existing).write_text("earlier")
    before = listing(tmp_path)
    r = subprocess.run(_sweep(tmp_path, "--output", str(tmp_path / "s.json")), capture_output=True, text=True)
    assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert listing(tmp_path) == before


@pytest.mark.slow
def test_a_sweep_on_a_claimed_output_is_refused(tmp_path):
    out = tmp_path / "s.json"
    with claim_outputs({"--output": str(out)}):
        t0 = time.monotonic()
        r = subprocess.run(_sweep(tmp_path, "--output", str(out)), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and f"pid {os.getpid()}) is writing it" in r.stderr, r.stderr
    assert time.monotonic() - t0 < 100  # refused at once, not after waiting for the holder


@pytest.mark.parametrize("name", ["x" * 250 + ".json", "é" * 121 + ".json", "with space & $sign.json", "-dash.json"])
def test_any_name_a_file_can_have_can_be_claimed(tmp_path, name):
    out = tmp_path / name
    with claim_outputs({"--output": str(out)}):
        with pytest.raises(ConfigError, match="is writing it"):
            claim_outputs({"--output": str(out)})
        out.write_text("x")
    assert listing(tmp_path) == [name]


# ---- the one rule on missing directories: made below an existing directory, never at the top of the filesystem -----

TOP = f"/kvtier-test-no-such-top-{os.getpid()}"  # a top-level directory no machine has


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_a_new_top_level_directory_is_never_made(depth):
    path = os.path.join(TOP, *["d"] * (depth - 1), "x.csv")
    with pytest.raises(ConfigError, match=rf"--io-trace-log: {TOP} does not exist \(kvtier makes missing"):
        claim_outputs({"--io-trace-log": path})
    with pytest.raises(ConfigError, match=f"--plots: {TOP} does not exist"):
        claim_outputs({}, {"--plots": os.path.dirname(path)})
    assert not os.path.lexists(TOP)


@pytest.mark.parametrize(
    "flag",
    ["--output", "--io-trace-log", "--io-op-log", "--html-output", "--xlsx-output", "--csv-output", "--plots"],
)
def test_every_bench_output_flag_follows_the_rule_before_the_run(tmp_path, capsys, flag):
    from replay.cli import main as kvtier

    rc = kvtier(["bench", "--config", write_config(tmp_path), flag, f"{TOP}/dir/out"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == [
        f"kvtier bench: {flag}: {TOP} does not exist (kvtier makes missing directories, but "
        "not at the top of the filesystem)"
    ]
    assert not os.path.lexists(TOP) and not (tmp_path / "out.json").exists()


def test_the_cache_dir_follows_the_same_rule(tmp_path, capsys):
    from replay.cli import main as kvtier

    rc = kvtier(["bench", "--config", write_config(tmp_path), "--cache-dir", f"{TOP}/cache"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith(f"kvtier bench: --cache-dir {TOP}/cache: {TOP} does not")
    assert not os.path.lexists(TOP)


def test_missing_directories_below_an_existing_one_are_still_made(tmp_path):
    out = tmp_path / "a" / "b" / "c" / "x.csv"  # three levels below an existing directory: fine
    with claim_outputs({"--io-trace-log": str(out)}):
        assert out.parent.is_dir()
    assert listing(tmp_path) == []
