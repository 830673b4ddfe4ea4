"""Every benchmark script (benchmarks/*.py) has a make target that runs it, listed in benchmarks/README.md's table:
read from the Makefile's text, nothing is run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py") if p.name != "__init__.py")
TARGET = re.compile(r"^([A-Za-z0-9_.-]+)\s*:(?!=)")  # `name:` or `name: deps`, not `NAME := value`
RUNS = re.compile(r"benchmarks(?:/|\.)(\w+)(?:\.py)?\b")  # python benchmarks/x.py or python -m benchmarks.x


def targets_running(makefile: str) -> dict[str, set[str]]:
    """{script stem: the targets whose recipe runs it}."""
    found: dict[str, set[str]] = {}
    target = None
    for line in makefile.splitlines():
        if line.startswith("\t"):
            if target is not None:
                for stem in RUNS.findall(line):
                    found.setdefault(stem, set()).add(target)
        elif m := TARGET.match(line):
            target = None if m.group(1).startswith(".") else m.group(1)
        elif line.strip() and not line.startswith("#"):
            target = None  # a variable or anything else ends the recipe
    return found


def test_the_parser_finds_both_ways_of_running_a_script():
    text = "X := 1\nbench-a: $(STAMP)\n\t$(BIN)/python benchmarks/a_b.py --x\n\nbench-c:\n\tpython -m benchmarks.c\n"
    assert targets_running(text) == {"a_b": {"bench-a"}, "c": {"bench-c"}}


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_script_has_a_make_target_listed_in_the_readme(script):
    targets = targets_running((ROOT / "Makefile").read_text()).get(script, set())
    assert targets, f"benchmarks/{script}.py: no make target runs it (add a bench-* target beside the others)"
    assert all(t.startswith("bench-") for t in targets), targets
    readme = (ROOT / "benchmarks" / "README.md").read_text()
    assert any(f"`make {t}`" in readme for t in targets), f"{sorted(targets)} not in benchmarks/README.md's table"
