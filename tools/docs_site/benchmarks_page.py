"""`benchmarks/index.md`: each benchmark's goals, read from the results file it writes (`benchmarks/results/<name>.json`), never typed by hand.

A results file is what `benchmarks/results.py` writes: `{"name", "command", "commit", "machine",
"peers", "figures", "goals": [{"name", "target", "measured", "met"}, ...]}`; `peers` (name -> version,
null when it did not run) says what the goals are measured against; a goal may add `"peer"` of its own,
and the file may add `"tables"` (`[{"title", "columns", "rows"}]`) for the figures behind the goals. A benchmark without a results
file is listed with the command that makes one and "not yet run".
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.docs_site.markdown import cell, code, table

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"
RESULTS = BENCHMARKS / "results"
# benchmarks/ modules that are not benchmarks: an engine they start, the results file they write, the
# suite that runs them (make bench), the renderer of their tables into the docs
HELPERS = frozenset({"canned_engine", "results", "suite", "render", "vidur_peer"})


class ResultsError(ValueError):
    """A results file that does not hold the keys the page is rendered from."""


@dataclass(frozen=True)
class Benchmark:
    name: str
    summary: str  # the first line of the script's docstring
    command: str  # how to run it: the results file's, else the script's docstring's first usage line
    results: dict[str, Any] | None  # the results file, when the benchmark has written one

    @property
    def results_path(self) -> str:
        return f"benchmarks/results/{self.name}.json"


def benchmarks(root: Path = REPO) -> list[Benchmark]:
    found = []
    for script in sorted((root / "benchmarks").glob("*.py")):
        if script.stem in HELPERS or script.stem.startswith("_"):
            continue
        doc = ast.get_docstring(ast.parse(script.read_text())) or ""
        results_file = root / "benchmarks" / "results" / f"{script.stem}.json"
        results = _load(results_file) if results_file.is_file() else None
        command = results["command"] if results else _usage(doc, script.name)
        found.append(Benchmark(script.stem, doc.split("\n\n")[0].replace("\n", " "), command, results))
    return found


def _load(path: Path) -> dict[str, Any]:
    try:
        results = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ResultsError(f"{path}: not JSON: {exc}") from None
    missing = [key for key in ("name", "command", "goals") if key not in results]
    if missing:
        raise ResultsError(f"{path}: missing {', '.join(missing)} (see tools/docs_site/benchmarks_page.py)")
    for goal in results["goals"]:
        absent = [key for key in ("name", "target", "measured", "met") if key not in goal]
        if absent:
            raise ResultsError(f"{path}: goal {goal.get('name', goal)!r} lacks {', '.join(absent)}")
    return results


def _usage(doc: str, script: str) -> str:
    """The first line of the docstring that runs the script, written with the venv's python."""
    for line in doc.splitlines():
        if f"benchmarks/{script}" in line:
            command = line.split("#")[0].strip().rstrip("\\").strip()
            rest = command[command.index(f"benchmarks/{script}") :]
            prefix = command[: command.index(f"benchmarks/{script}")]
            env = " ".join(word for word in prefix.split() if "=" in word)
            return " ".join(part for part in (env, ".venv/bin/python", rest) if part)
    return f".venv/bin/python benchmarks/{script}"


def _met(goal: dict[str, Any]) -> str:
    return "met" if goal["met"] else "**missed**"


def page(root: Path = REPO) -> str:
    found = benchmarks(root)
    parts = [
        "# Benchmarks\n",
        "Each benchmark writes its goals and figures to `benchmarks/results/<name>.json` and exits "
        "non-zero when it misses a goal; the tables below are read from those files when the site is "
        "built. A benchmark listed as *not yet run* has no results file in this checkout: its command "
        "makes one, and `make bench` runs them all ([Running the benchmarks](../guides/benchmarks.md)).\n",
        table(
            ["benchmark", "what it measures", "results"],
            [
                (
                    f"[`{b.name}`](#{b.name.replace('_', '-')})",
                    cell(b.summary),
                    "not yet run" if b.results is None else code(b.results_path),
                )
                for b in found
            ],
        ),
    ]
    for bench in found:
        parts.append(f"## `{bench.name}` {{#{bench.name.replace('_', '-')}}}\n")
        parts.append(bench.summary + "\n")
        parts.append(f"```text\n{bench.command}\n```\n")
        if bench.results is None:
            parts.append(f"Not yet run: no `{bench.results_path}` in this checkout.\n")
            continue
        parts.append(f"From `{bench.results_path}`{provenance(bench.results)}:\n")
        parts.append(goals_table(bench.results["goals"], peers(bench.results)))
        for extra in bench.results.get("tables", []):
            parts.append(f"**{cell(extra['title'])}**\n")
            parts.append(
                table(map(cell, extra["columns"]), ([cell(v) for v in row] for row in extra["rows"]))
            )
    return "\n".join(parts)


def peers(results: dict[str, Any]) -> str:
    """The systems a file's goals are measured against, with their versions."""
    return ", ".join(f"{name} {version}" for name, version in (results.get("peers") or {}).items())


def provenance(results: dict[str, Any]) -> str:
    """What a run was made on, for the reader: the machine's cores. The commit and the load average
    stay in the results file the text links to (user docs carry no commit hashes or load diaries)."""
    cores = (results.get("machine") or {}).get("cores")
    return f" ({cores} cores)" if cores else ""


def goals_table(goals: list[dict[str, Any]], peers: str = "") -> str:
    with_peer = bool(peers) or any("peer" in goal for goal in goals)
    header = ["goal", "target", *(["peer"] if with_peer else []), "measured", ""]
    rows = [
        (
            cell(g["name"]),
            cell(g["target"]),
            *([cell(g.get("peer", peers))] if with_peer else []),
            cell(g["measured"]),
            _met(g),
        )
        for g in goals
    ]
    return table(header, rows)
