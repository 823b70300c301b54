"""Import circles among a package's modules, read from the source (nothing is imported).

    .venv/bin/python tools/import_cycles.py [--type-checking] [--package rollflow]

Every import of the package counts, at module level or inside a function (an import moved into a
function to dodge a circle still is one); imports under `if TYPE_CHECKING:` are annotations only
and count only with `--type-checking`. Each circle is printed as its modules (a strongly connected
component of the import graph); the command exits 1 when there is one. tests/test_architecture.py
runs it on rollflow, so a new circle fails the tests.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def package_modules(root: Path, package: str) -> dict[str, Path]:
    """Every module of `package` (a folder under `root`) by dotted name; a package by its own name."""
    modules = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def imported_modules(name: str, path: Path, modules: dict[str, Path], type_checking: bool) -> set[str]:
    """The modules in `modules` that module `name` (at `path`) imports; `from a import b` names
    module a.b when there is one, else a."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()

    def absolute(node: ast.ImportFrom) -> str:
        if node.level == 0:
            return node.module or ""
        parts = name.split(".")[: len(name.split(".")) - node.level + is_package]
        return ".".join([*parts, node.module] if node.module else parts)

    def visit(nodes: Iterable[ast.AST]) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.body if type_checking else [])
                visit(node.orelse)  # what runs
                continue
            if isinstance(node, ast.ImportFrom):
                base = absolute(node)
                for alias in node.names:
                    found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            visit(ast.iter_child_nodes(node))

    visit([ast.parse(path.read_text(), filename=str(path))])
    return found & modules.keys()


def import_graph(
    root: Path = REPO, package: str = "rollflow", type_checking: bool = False
) -> dict[str, set[str]]:
    """Module -> the package's modules it imports."""
    modules = package_modules(root, package)
    return {name: imported_modules(name, path, modules, type_checking) for name, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each set of modules that import one another, directly or round a circle (Tarjan's strongly
    connected components of more than one module), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(graph[module]):
            if target not in index:
                connect(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:  # a module's import of itself (its `__main__` block) is no circle
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 4 * len(graph) + 100))  # one frame per module on the deepest path
    try:
        for module in sorted(graph):
            if module not in index:
                connect(module)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--package", default="rollflow", help="a folder at the repository's root")
    parser.add_argument("--type-checking", action="store_true", help="count imports under TYPE_CHECKING too")
    args = parser.parse_args()
    found = circles(import_graph(REPO, args.package, args.type_checking))
    for circle in found:
        print(" <-> ".join(circle))
    print(f"{len(found)} import circle(s) in {args.package}/")
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
