"""kvtier's import graph read from the source with ast (nothing imported), counting the imports hidden inside
functions: what tests/test_import_cycles.py and tests/test_layers.py check."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("kvconnector", "replay", "tracing", "deploy", "benchmarks")


def project_modules(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """{dotted module name: path} of every module of the project's packages."""
    found = {}
    for package in packages:
        for path in (root / package).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            if any(p.startswith(".") or p == "__pycache__" for p in parts):
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def imports(name: str, path: Path) -> Iterator[tuple[str, bool]]:
    """(dotted name imported, whether at import time) for each import of module `name` at `path`; relative imports
    resolved, `from pkg import mod` as `pkg.mod`. At import time: not inside a function (a class body counts)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def walk(node: ast.AST, at_import_time: bool) -> Iterator[tuple[str, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield alias.name, at_import_time
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (child.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                # `from pkg import mod` imports the submodule; `from mod import func` imports mod.
                for alias in child.names:
                    yield f"{base}.{alias.name}", at_import_time
            else:
                inside = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
                yield from walk(child, at_import_time and not inside)

    yield from walk(ast.parse(path.read_text(), str(path)), True)


def _target(name: str, modules: dict[str, Path]) -> str | None:
    """The deepest kvtier module a dotted name denotes (`replay.x.func` -> `replay.x`)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """{module: the project's modules it imports, anywhere in it}."""
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for imported, _ in imports(name, path):
            target = _target(imported, modules)
            if target is not None and target != name:
                graph[name].add(target)
    return graph
