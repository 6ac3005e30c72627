"""No circle in the imports of ``keyorder`` and ``keyorder_operator`` (issue 41).

A circle between two modules means neither can be read, tested or moved without the other: each is
half of one room. import-linter's contracts check the layers we named; this test checks the rule
that holds everywhere, whatever the layers: the module import graph has no cycle. The graph is read
from the source with :mod:`ast`, without importing anything, and counts every import: at module level,
inside functions (a function-level import is still a dependency, only a late one) and under
``TYPE_CHECKING`` (a type a module names is part of what a reader must know). ``from package import
name`` is an edge to ``package.name`` when that is a module, else to the package's ``__init__``.

Offline and fast (about 0.1 s): it parses files and runs Tarjan's algorithm.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IMPORT_ROOTS = {
    "keyorder": ROOT / "consumer" / "keyorder",
    "keyorder_operator": ROOT / "operator" / "keyorder_operator",
}
"""The two import roots (consumer/ and operator/ themselves are not packages: see ARCHITECTURE.md)."""


def module_files(roots: dict[str, Path] = IMPORT_ROOTS) -> dict[str, Path]:
    """Every module of the given packages, by dotted name (a package by its ``__init__``'s)."""
    modules: dict[str, Path] = {}
    for package, folder in roots.items():
        for path in sorted(folder.rglob("*.py")):
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _base(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` statement names (relative levels resolved)."""
    if not node.level:
        return node.module or ""
    parts = module.split(".") if is_package else module.split(".")[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join([*parts, node.module] if node.module else parts)


def imports_of(module: str, path: Path, modules: Iterable[str]) -> set[str]:
    """The modules among ``modules`` that ``module`` (read from ``path``) imports anywhere, never itself."""
    known = set(modules)
    tree = ast.parse(path.read_text(), filename=str(path))
    targets: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = _base(module, path.name == "__init__.py", node)
            for alias in node.names:
                # `from pkg import name`: the submodule pkg.name if there is one, else pkg itself.
                submodule = f"{base}.{alias.name}"
                targets.add(submodule if submodule in known else base)
    return (targets & known) - {module}


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of ``modules`` it imports."""
    return {module: imports_of(module, path, modules) for module, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted, largest first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:
        # Iterative, so a deep graph cannot hit the recursion limit.
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found, key=lambda component: (-len(component), component))


def describe(graph: dict[str, set[str]], component: Iterable[str]) -> str:
    """One circle's edges, for the failure message: ``a -> b, c`` per member."""
    members = set(component)
    return "; ".join(f"{module} -> {', '.join(sorted(graph[module] & members))}" for module in sorted(members))


def test_the_import_graph_has_no_circle():
    graph = import_graph(module_files())
    found = cycles(graph)
    assert not found, "import circles (move what both sides need to a module below both):\n" + "\n".join(
        describe(graph, component) for component in found
    )


def test_the_finder_sees_a_circle_through_a_function_level_import(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.b import thing\n")
    (package / "b.py").write_text("def thing():\n    from . import a\n    return a\n")
    (package / "c.py").write_text("from pkg import a\n")
    graph = import_graph(module_files({"pkg": package}))
    assert graph["pkg.a"] == {"pkg.b"}
    assert graph["pkg.c"] == {"pkg.a"}
    assert cycles(graph) == [["pkg.a", "pkg.b"]]
