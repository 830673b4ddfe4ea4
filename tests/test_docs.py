"""The repository's documents: every relative link resolves, and nothing points outside the repository (a user who
clones it has no development machine's paths, no tracker, no notes beside it)."""

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")
# what only the development setup had: a sibling folder, the project's tracker, this machine's work tree
OUTSIDE = re.compile(
    r"\.\./shared/|shared/reference|\bseeds/|\bseed 00\d|\b[Ii]ssue #?\d+|\b[Ii]ssues #\d+|/work/main|/check/work"
)


def _tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", *patterns], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [REPO / line for line in out.splitlines()]


def _text_files() -> list[Path]:
    binary = {".png", ".json", ".csv", ".xlsx", ".lock", ".gz"}
    return [p for p in _tracked() if p.suffix not in binary and p.is_file()]


def test_every_relative_link_in_the_markdown_resolves():
    broken = []
    for doc in _tracked("*.md"):
        for target in LINK.findall(doc.read_text()):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue
            if not (doc.parent / target.split("#")[0]).exists():
                broken.append(f"{doc.relative_to(REPO)}: {target}")
    assert not broken, "\n".join(broken)


def test_nothing_points_outside_the_repository():
    found = []
    for path in _text_files():
        if path == Path(__file__):
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if OUTSIDE.search(line):
                found.append(f"{path.relative_to(REPO)}:{n}: {line.strip()[:100]}")
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    "line",
    [
        "see ../shared/reference/lmcache.md",
        "as seed 001 measured",
        "the seeds/ folder",
        "fixed in issue 12",
        "issues #14 and #15",
        "from /work/main/tests",
    ],
)
def test_the_outside_pattern_catches_what_it_is_for(line):
    assert OUTSIDE.search(line)
