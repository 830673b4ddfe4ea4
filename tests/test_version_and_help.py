"""`kvtier --version` / `-V` print the version (and the commit of the checkout it runs from); `kvtier help [SUB]`
prints what `--help` prints; anything else after `help` is one line and exit 2."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from replay.cli import SUBCOMMANDS, USAGE
from replay.cli import main as kvtier

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version(capsys, flag):
    assert kvtier([flag]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith(f"kvtier {version('kvtier')}")
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:  # a checkout: its commit is named
        assert f"(commit {head.stdout.strip()[:12]}" in out


def test_help_alone_is_the_usage(capsys):
    assert kvtier(["help"]) == 0
    assert capsys.readouterr().out.strip() == USAGE.strip()


@pytest.mark.slow
@pytest.mark.parametrize("sub", ["bench", "compare", "report", "merge", "check", "distill"])
def test_help_of_a_subcommand_is_its_help(sub):
    def run(*argv):
        r = subprocess.run([sys.executable, "-m", "replay.cli", *argv], capture_output=True, text=True, cwd=REPO)
        assert r.returncode == 0 and not r.stderr, r.stderr
        return r.stdout

    via_help = run("help", sub)
    assert via_help == run(sub, "--help") and via_help.startswith(f"usage: kvtier {sub}")


@pytest.mark.parametrize("argv", [["help", "nope"], ["help", "bench", "extra"], ["help", "--version"]])
def test_help_of_something_else_is_one_line_and_exit_2(capsys, argv):
    assert kvtier(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"kvtier: help {' '.join(argv[1:])}: not a subcommand")
    assert all(s in err[0] for s in SUBCOMMANDS)


@pytest.mark.parametrize("columns", ["60", "100"])
@pytest.mark.parametrize("sub", sorted(SUBCOMMANDS))
def test_no_help_splits_a_flag_over_two_lines(sub, columns, capsys, monkeypatch):
    # argparse wraps with textwrap, which by default also breaks at hyphens: "--target-hit-" / "rate"
    monkeypatch.setenv("COLUMNS", columns)
    with pytest.raises(SystemExit):
        kvtier([sub, "--help"])
    out = capsys.readouterr().out
    assert out.startswith(f"usage: kvtier {sub}")
    split = [line for line in out.splitlines() if re.search(r"(?<![\w-])--[a-z][a-z0-9-]*-$", line)]
    assert not split, split
