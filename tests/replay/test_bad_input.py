"""Every subcommand answers a user's mistake the same way: exit 2, one line on stderr naming what is wrong, no
traceback, and nothing left on disk (no results file, no cache directory, no temp file).

The table runs each case in-process through the `kvtier` dispatcher (an exception escaping it fails the test with
its traceback); one case per subcommand also runs as a real subprocess.
"""

import json
import os
import subprocess
import sys

import pytest

from replay import cli


@pytest.fixture
def files(tmp_path):
    """Bad inputs of every kind a user hands over by mistake, made fresh for each test."""
    d = tmp_path / "inputs"
    d.mkdir()
    (d / "list.json").write_text("[1, 2]")
    (d / "heads0.json").write_text(json.dumps({"num_hidden_layers": 4, "num_attention_heads": 0, "hidden_size": 128}))
    (d / "binary.bin").write_bytes(bytes(range(256)) * 64)
    (d / "list.yaml").write_text("- 1\n- 2\n")
    (d / "empty.txt").write_text("")
    (d / "garbage.txt").write_text("this is not a trace\n" * 5)
    (d / "a_file").write_text("x")
    (d / "a_dir").mkdir()
    os.mkfifo(d / "a_fifo")  # reading it would block forever
    return d


def _cases(f) -> list[tuple[str, list[str], dict]]:
    """(id, argv, extra environment) for each mistake. `f` is the inputs directory."""
    bench = [
        ("bogus-flag", ["--bogus"]),
        ("negative-seed", ["--seed", "-1"]),
        ("not-a-number", ["--num-users", "x"]),
        ("inf-rate", ["--request-rate", "inf"]),
        ("nan-duration", ["--duration", "nan"]),
        ("model-json-list", ["--model", f"{f}/list.json"]),
        ("model-zero-heads", ["--model", f"{f}/heads0.json"]),
        ("model-missing", ["--model", f"{f}/nothere.json"]),
        ("config-binary", ["--config", f"{f}/binary.bin"]),
        ("config-list", ["--config", f"{f}/list.yaml"]),
        ("output-is-dir", ["--output", f"{f}/a_dir"]),
        ("output-under-proc", ["--output", "/proc/kvtier/r.json"]),
        ("output-under-file", ["--output", f"{f}/a_file/r.json"]),
        ("xlsx-is-dir", ["--xlsx-output", f"{f}/a_dir"]),
        ("csv-under-proc", ["--csv-output", "/proc/r.csv"]),
        ("trace-log-is-dir", ["--io-trace-log", f"{f}/a_dir"]),
        ("plots-is-file", ["--plots", f"{f}/a_file"]),
        ("cache-dir-is-file", ["--cache-dir", f"{f}/a_file"]),
        ("cache-dir-proc", ["--cache-dir", "/proc"]),
        ("burst-trace-binary", ["--use-burst-trace", "--burst-trace-path", f"{f}/binary.bin"]),
        ("burst-trace-missing", ["--use-burst-trace", "--burst-trace-path", f"{f}/nothere.csv"]),
        ("dataset-missing", ["--dataset-path", f"{f}/nothere.json"]),
        ("dataset-fifo", ["--dataset-path", f"{f}/a_fifo"]),
        ("config-fifo", ["--config", f"{f}/a_fifo"]),
        ("model-fifo", ["--model", f"{f}/a_fifo"]),
        ("prefill-and-decode", ["--prefill-only", "--decode-only"]),
    ]
    out = [(f"bench-{name}", ["bench", "--duration", "1", *argv], {}) for name, argv in bench]
    out += [
        ("bench-env-unparsable", ["bench", "--duration", "1"], {"KVTIER_NUM_USERS": "["}),
        ("bench-env-out-of-range", ["bench", "--duration", "1"], {"KVTIER_NUM_USERS": "0"}),
        ("bench-env-list", ["bench", "--duration", "1"], {"KVTIER_DURATION": "[1, 2]"}),
        ("kvtier-unknown-subcommand", ["benchh"], {}),
        ("compare-bogus-flag", ["compare", "--bogus", f"{f}/a_file"], {}),
        ("compare-missing-file", ["compare", f"{f}/nothere.json"], {}),
        ("compare-garbage", ["compare", f"{f}/garbage.txt"], {}),
        ("compare-fifo", ["compare", f"{f}/a_fifo"], {}),
        ("compare-json-out-is-dir", ["compare", f"{f}/garbage.txt", "--json", f"{f}/a_dir"], {}),
        ("replay-bogus-flag", ["replay", "--bogus"], {}),
        ("replay-missing-required", ["replay", "--model", "m"], {}),
        ("distill-bogus-flag", ["distill", "--bogus"], {}),
        ("distill-missing-file", ["distill", f"{f}/nothere.txt"], {}),
        ("distill-empty", ["distill", f"{f}/empty.txt"], {}),
        ("distill-garbage", ["distill", f"{f}/garbage.txt"], {}),
        ("distill-binary", ["distill", f"{f}/binary.bin"], {}),
        ("distill-fifo", ["distill", f"{f}/a_fifo"], {}),
    ]
    return out


CASE_IDS = [c[0] for c in _cases("F")]


def _leftovers(cwd) -> set[str]:
    """What a run could leave behind: files under the working directory, which holds the run's scratch directory
    ($TMPDIR, where kvtier's own directories go): a look at the machine's /var/tmp would see other tests' runs."""
    return {os.path.relpath(os.path.join(root, n), cwd) for root, dirs, names in os.walk(cwd) for n in dirs + names}


@pytest.mark.parametrize("case_id", CASE_IDS)
def test_mistake_is_one_line_exit_2_and_leaves_nothing(case_id, files, tmp_path, monkeypatch, capsys):
    _, argv, env = next(c for c in _cases(str(files)) if c[0] == case_id)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "scratch").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "scratch"))
    before = _leftovers(tmp_path)
    try:
        rc = cli.main(argv)
    except SystemExit as exc:  # argparse's own exit
        rc = exc.code
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, f"exit {rc}: {err}"
    assert len(lines) == 1, err
    sub = argv[0] if argv[0] in cli.SUBCOMMANDS else None
    assert lines[0].startswith(f"kvtier {sub}:" if sub else "kvtier:"), lines[0]
    assert _leftovers(tmp_path) == before


@pytest.mark.parametrize("sub", ["bench", "replay", "compare", "distill"])
@pytest.mark.slow
def test_bad_flag_as_a_real_process(sub, tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "replay.cli", sub, "--bogus"], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and r.stderr.startswith(f"kvtier {sub}: "), r.stderr
    assert "--help" in r.stderr
