"""Every committed figure JSON says which kvtier made it: its version and the commit (recorded by the run, or for runs
that predate the record, the commit the figure was added in). Every benchmark writes its results JSON one way,
`replay.outputs.provenance.write_run_json` (atomic, fsynced, NaN as null, the run recorded): read from the source with
ast, so a script that goes back to json.dump into open() fails here without running."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ROOT / "benchmarks" / "figures"
SCRIPTS = sorted(p for p in (ROOT / "benchmarks").glob("*.py") if p.name != "__init__.py")
SHA = re.compile(r"^[0-9a-f]{40}$")
WRITER = "write_run_json"


@pytest.mark.parametrize("path", sorted(FIGURES.rglob("*.json")), ids=lambda p: str(p.relative_to(FIGURES)))
def test_the_figure_carries_its_provenance(path):
    p = json.loads(path.read_text()).get("provenance")
    assert p, "no provenance: write it with replay.outputs.provenance.write_run_json()"
    assert re.match(r"^\d+\.\d+", p["kvtier_version"]), p
    assert SHA.match(p.get("commit") or p.get("committed_in") or ""), p


# ---- how the scripts write JSON -----------------------------------------------------------------------------------


def _mentions_json(node: ast.AST) -> bool:
    """An expression that names a JSON file: a string with ".json" in it, or an attribute/name called json (a.json)."""
    for n in ast.walk(node):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and ".json" in n.value:
            return True
        if (isinstance(n, ast.Attribute) and n.attr == "json") or (isinstance(n, ast.Name) and n.id == "json"):
            return True
    return False


def _is_json_dumps(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "dumps"


def _writing_mode(call: ast.Call) -> bool:
    mode = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "mode"), None)
    return isinstance(mode, ast.Constant) and isinstance(mode.value, str) and bool(set(mode.value) & set("wxa"))


def json_written_by_hand(source: str) -> list[str]:
    """Where `source` writes JSON other than through write_run_json: json.dump, json.dumps into write_text/write,
    <a .json path>.write_text, open(<a .json path>, "w"), atomic_path(..., suffix=".json...").
    Each as "line N: what"."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name == "dump" and isinstance(func, ast.Attribute) and _mentions_json(func.value):
            found.append(f"line {node.lineno}: json.dump")
        elif name in ("write_text", "write") and any(_is_json_dumps(n) for a in node.args for n in ast.walk(a)):
            found.append(f"line {node.lineno}: {name}(json.dumps(...))")
        elif name == "write_text" and isinstance(func, ast.Attribute) and _mentions_json(func.value):
            found.append(f"line {node.lineno}: <a .json path>.write_text")
        elif name == "open" and node.args and _writing_mode(node) and _mentions_json(node.args[0]):
            found.append(f"line {node.lineno}: open(<a .json path>, writing)")
        elif name == "atomic_path" and any(_mentions_json(k.value) for k in node.keywords if k.arg == "suffix"):
            found.append(f"line {node.lineno}: atomic_path(..., suffix='.json...')")
    return found


def takes_a_results_path(source: str) -> bool:
    """The script takes --json FILE or --out PATH (a flag like crash_loop's `--json` that prints does not count)."""
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
            and any(isinstance(a, ast.Constant) and a.value in ("--json", "--out") for a in node.args)
        ):
            action = next((k.value for k in node.keywords if k.arg == "action"), None)
            if not (isinstance(action, ast.Constant) and action.value in ("store_true", "store_false")):
                return True
    return False


def calls_the_writer(source: str) -> bool:
    return any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == WRITER
        for n in ast.walk(ast.parse(source))
    )


@pytest.mark.parametrize(
    "snippet",
    [
        "json.dump(doc, fh, indent=2)",
        "Path(a.json).write_text(json.dumps(doc, indent=2))",
        "(out / 'collapse.json').write_text(json.dumps(doc) + '\\n')",
        "with open(a.json, 'w') as fh:\n    fh.write(text)",
        "with open(out / 'r.json', mode='x') as fh:\n    pass",
        "with atomic_path(p, suffix='.json.tmp') as tmp:\n    pass",
        "f.write(json.dumps(doc))",
        "text = json.dumps(doc)\nPath(a.json).write_text(text)",
    ],
)
def test_the_scan_finds_json_written_by_hand(snippet):
    assert json_written_by_hand(snippet), snippet


@pytest.mark.parametrize(
    "snippet",
    [
        "write_run_json(a.json, doc)",
        "print(json.dumps(doc, indent=1))",
        "body = json.dumps({'prompt': p})",
        "doc = json.loads(Path(a.json).read_text())",
        "with open(a.json) as fh:\n    doc = json.load(fh)",
        "log = open(out.parent / f'{out.name}.log', 'w')",
        "(work / 'replay.fio').write_text(job_text)",
    ],
)
def test_the_scan_lets_reads_prints_and_the_writer_through(snippet):
    assert json_written_by_hand(snippet) == [], snippet


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_the_script_writes_its_json_only_through_write_run_json(script):
    source = script.read_text()
    assert json_written_by_hand(source) == [], f"{script.name}: use replay.outputs.provenance.{WRITER}"
    if takes_a_results_path(source):
        assert calls_the_writer(source), f"{script.name} takes a results path but never calls {WRITER}"


def test_the_scan_sees_the_writers():
    # the checks above are only as good as this: the scripts that take a results path are found and call the writer
    writers = [s.name for s in SCRIPTS if calls_the_writer(s.read_text())]
    assert len(writers) >= 16, writers
    assert not takes_a_results_path('ap.add_argument("--json", action="store_true")')  # crash_loop's: it prints
