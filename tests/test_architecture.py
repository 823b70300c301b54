"""rollflow's modules import one another without circles (tools/import_cycles.py): a module that
needs a piece of another that needs it back means the piece belongs in a third module."""

from __future__ import annotations

import ast
from pathlib import Path

from tools.import_cycles import circles, import_graph

REPO = Path(__file__).resolve().parents[1]


def test_rollflow_has_no_import_circle():
    found = circles(import_graph())
    assert not found, (
        "import circles in rollflow/ (move what the modules share into a module of its own; "
        f"run `python tools/import_cycles.py` to list them): {found}"
    )


def test_benchmarks_never_import_tests():
    """What benchmarks and tests share lives in rollflow (e.g. runtime/launch/servers.py) or benchmarks/."""
    found = []
    for path in sorted((REPO / "benchmarks").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            found += [
                f"{path.relative_to(REPO)}:{node.lineno} {name}"
                for name in names
                if name.split(".")[0] == "tests"
            ]
    assert not found, f"benchmarks importing tests: {found}"


MAX_CLASS_LINES = 400  # a class longer than this does several jobs: split it into parts that own their state


def test_no_class_is_over_400_lines():
    found = []
    for path in sorted((REPO / "rollflow").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES:
                lines = node.end_lineno - node.lineno + 1
                found.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({lines} lines)")
    assert not found, (
        f"classes over {MAX_CLASS_LINES} lines (split each into parts that own their state): {found}"
    )


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_a_circle_through_a_function_level_import_is_found(tmp_path):
    write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg.b import f\n",
            "pkg/b.py": "def f():\n    from pkg import c\n",
            "pkg/c.py": "import pkg.a\n",
            "pkg/d.py": "from pkg.a import f\n",  # imports into the circle, not part of it
        },
    )
    assert circles(import_graph(tmp_path, "pkg")) == [["pkg.a", "pkg.b", "pkg.c"]]


def test_relative_imports_count_and_annotation_only_imports_do_not(tmp_path):
    write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/sub/__init__.py": "from . import x\n",
            "pkg/sub/x.py": "from ..y import Y\n",
            "pkg/y.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from pkg.sub.x import X\nelse:\n    import pkg.z\n"
            ),
            "pkg/z.py": "from .sub import x\n",
        },
    )
    assert circles(import_graph(tmp_path, "pkg")) == [["pkg.sub.x", "pkg.y", "pkg.z"]]
    with_annotations = circles(import_graph(tmp_path, "pkg", type_checking=True))
    assert with_annotations == [["pkg.sub.x", "pkg.y", "pkg.z"]]
    # without the else branch's import, only the annotations close a circle
    (tmp_path / "pkg/y.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.sub.x import X\n"
    )
    assert circles(import_graph(tmp_path, "pkg")) == []
    assert circles(import_graph(tmp_path, "pkg", type_checking=True)) == [["pkg.sub.x", "pkg.y"]]
