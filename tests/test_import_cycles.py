"""No import cycle anywhere in kvtier's packages, counting the imports hidden inside functions (the usual way a cycle is
papered over: it runs, until someone moves the import to the top). Read from the source with ast, so it needs nothing
imported and names the cycle it finds."""

from __future__ import annotations

import pytest
from import_graph import import_graph, project_modules


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a list of modules (first == last), or None. Iterative DFS, three colours."""
    state: dict[str, int] = {}
    for start in sorted(graph):
        if state.get(start):
            continue
        stack = [(start, iter(sorted(graph[start])))]
        path = [start]
        state[start] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[node] = 2
                stack.pop()
                path.pop()
            elif state.get(child) == 1:
                return path[path.index(child) :] + [child]
            elif not state.get(child):
                state[child] = 1
                path.append(child)
                stack.append((child, iter(sorted(graph[child]))))
    return None


def _package_edges_removed(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """A package's __init__ importing its own submodules is not a cycle with them (a submodule importing a sibling
    through the package is): drop only the edges from a module to the packages that contain it."""
    return {m: {t for t in targets if not m.startswith(t + ".")} for m, targets in graph.items()}


@pytest.mark.slow
def test_no_import_cycle():
    graph = _package_edges_removed(import_graph(project_modules()))
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


@pytest.mark.parametrize(
    "sources, expect_cycle",
    [
        ({"a": "from . import b\n", "b": "def f():\n    from .a import g\n"}, True),
        ({"a": "import pkg.b\n", "b": "import pkg.c\n", "c": "from pkg.a import x\n"}, True),
        ({"a": "from .b import f\n", "b": "from .c import g\n", "c": "import os\n"}, False),
    ],
    ids=["hidden-in-function", "three-long", "chain"],
)
def test_the_checker_sees_cycles(tmp_path, sources, expect_cycle):
    """The checker itself: a cycle through an import inside a function is found; a chain is not a cycle."""
    modules = {}
    for stem, text in sources.items():
        (tmp_path / f"{stem}.py").write_text(text)
        modules[f"pkg.{stem}"] = tmp_path / f"{stem}.py"
    (tmp_path / "__init__.py").write_text("")
    modules["pkg"] = tmp_path / "__init__.py"
    assert (find_cycle(_package_edges_removed(import_graph(modules))) is not None) is expect_cycle
