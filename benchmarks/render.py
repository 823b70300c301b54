"""The tables of measured figures in README.md and docs/, rendered between markers from the results files.

    .venv/bin/python -m benchmarks.render --write   # after `make bench`: every block anew
    .venv/bin/python -m benchmarks.render --check   # exit 1 naming each page whose blocks are stale

A block is two markers on lines of their own; what lies between them is rewritten:

    <!-- results: vidur_compare -->      the goals of benchmarks/results/vidur_compare.json
    <!-- results: end -->
    <!-- results: headline -->           every results file's headline goals (the README's front page)
    <!-- results: end -->
    <!-- results: rl_paper_claims table: RLBoost, settled -->   the table of that file whose title
    <!-- results: end -->                                         starts with the text after `table:`

A benchmark that has no results file in the checkout renders as a line saying it is not yet measured
and the command that measures it, so a page never shows a figure that no file backs. Blocks are
committed (README.md is read on GitHub, where nothing renders at build time); tests/docs/test_site.py
fails when one differs from what its results file gives.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from collections.abc import Iterable
from pathlib import Path

from benchmarks.suite import BENCHMARKS
from tools.docs_site.benchmarks_page import REPO, Benchmark, benchmarks, goals_table, peers, provenance
from tools.docs_site.markdown import cell, code, table

# Markers are whole lines, so a page may name one in prose (`<!-- results: NAME -->`) without opening a block.
BLOCK = re.compile(
    r"^<!-- results: (?P<name>[a-z0-9_]+)(?: table: (?P<table>[^\n]+?))? -->\n.*?^<!-- results: end -->$",
    re.DOTALL | re.MULTILINE,
)
OPENER = re.compile(r"^<!-- results: (?!end -->$).*$", re.MULTILINE)
HEADLINE = "headline"


class RenderError(ValueError):
    """A marker block that cannot be rendered: unclosed, or naming no benchmark."""


def pages(root: Path = REPO) -> list[Path]:
    """Every page a block may sit in: README.md and the site's sources."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def render(text: str, page: Path, root: Path = REPO) -> str:
    """`text` (the contents of `page`) with every block rendered anew."""
    if len(OPENER.findall(text)) != len(BLOCK.findall(text)):
        raise RenderError(
            f"{_shown(page, root)}: a `<!-- results: NAME -->` line without its `<!-- results: end -->`"
        )
    if not BLOCK.search(text):
        return text
    found = {bench.name: bench for bench in benchmarks(root)}

    def body(match: re.Match[str]) -> str:
        name, title = match["name"], match["table"]
        opener = match[0].partition("\n")[0]
        if title and name in found:
            rendered = table_block(found[name], title, page, root)
        elif name == HEADLINE:
            rendered = headline_table(found.values(), page, root)
        elif name in found:
            rendered = goals_block(found[name], page, root)
        else:
            raise RenderError(
                f"{_shown(page, root)}: `<!-- results: {name} -->` names no benchmark "
                f"(benchmarks/{name}.py does not exist; one of: {', '.join(found)})"
            )
        return f"{opener}\n{rendered}<!-- results: end -->"

    return BLOCK.sub(body, text)


def goals_block(bench: Benchmark, page: Path, root: Path) -> str:
    """One benchmark's goals as its results file states them, or a line saying it has none yet."""
    if bench.results is None:
        return (
            f"Not yet measured in this checkout: `{measure_command(bench)}` (or `make bench`) writes "
            f"`{bench.results_path}`, then `.venv/bin/python -m benchmarks.render --write` puts its "
            "figures here.\n"
        )
    where = (
        f"[`{bench.results_path}`]({bench.results_path})" if page.parent == root else code(bench.results_path)
    )
    lines = [
        f"Measured by `{bench.results['command']}`{provenance(bench.results)}; from {where} "
        f"(all its figures: {_benchmarks_page_link(bench, page, root)}):\n",
        goals_table(bench.results["goals"], peers(bench.results)),
    ]
    return "\n".join(lines)


def table_block(bench: Benchmark, title: str, page: Path, root: Path) -> str:
    """The table of a benchmark's results file whose title starts with `title`, under the same
    provenance line as its goals; a file that has none is a render error (the page names a table
    the benchmark no longer writes)."""
    if bench.results is None:
        return goals_block(bench, page, root)
    found = [extra for extra in bench.results.get("tables", []) if extra["title"].startswith(title)]
    if not found:
        raise RenderError(
            f"{_shown(page, root)}: `<!-- results: {bench.name} table: {title} -->` names no table of "
            f"{bench.results_path} (its tables: {'; '.join(t['title'] for t in bench.results.get('tables', []))})"
        )
    extra = found[0]
    return "\n".join([
        f"From {code(bench.results_path)}{provenance(bench.results)}, **{cell(extra['title'])}**:\n",
        table(map(cell, extra["columns"]), ([cell(v) for v in row] for row in extra["rows"])),
    ])  # fmt: skip


def measure_command(bench: Benchmark) -> str:
    """The full run's command: the suite's, else the one the script's docstring gives."""
    registered = BENCHMARKS.get(bench.name)
    if registered is None:
        return bench.command
    return shlex.join([".venv/bin/python", f"benchmarks/{bench.name}.py", *registered.args])


def _benchmarks_page_link(bench: Benchmark, page: Path, root: Path) -> str:
    """A link to the benchmark's section of the site's Benchmarks page, from a page of the site; from
    the README (read on GitHub, where that page is not built) the command that builds it."""
    if page.parent == root:
        return "`make docs`, then `site/benchmarks/index.html`"
    target = os.path.relpath(root / "docs" / "benchmarks" / "index.md", page.parent)
    return f"[Benchmarks]({target}#{bench.name.replace('_', '-')})"


def headline_table(found: Iterable[Benchmark], page: Path, root: Path) -> str:
    """One row per headline goal of every results file: goal, peer, measured against target, file."""
    in_readme = page.parent == root
    rows = [
        (
            cell(goal["name"]),
            cell(goal.get("peer", peers(bench.results)) or "none"),
            cell(f"{goal['measured']} ({goal['target']})") + ("" if goal["met"] else " **missed**"),
            f"[`{bench.results_path}`]({bench.results_path})" if in_readme else code(bench.results_path),
        )
        for bench in found
        if bench.results is not None
        for goal in bench.results["goals"]
        if goal.get("headline")
    ]
    if not rows:
        return (
            "No headline figure is measured in this checkout yet: `make bench` measures them (about an "
            "hour on 2 cores), then `.venv/bin/python -m benchmarks.render --write` fills this table.\n"
        )
    return table(["goal", "peer", "measured (target)", "results file"], rows)


def stale(root: Path = REPO) -> list[Path]:
    """The pages whose blocks differ from what the results files give."""
    return [page for page in pages(root) if render(text := page.read_text(), page, root) != text]


def _shown(page: Path, root: Path) -> str:
    return str(page.relative_to(root)) if page.is_relative_to(root) else str(page)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.render",
        description="Render the `<!-- results: NAME -->` ... `<!-- results: end -->` blocks of README.md "
        "and docs/**/*.md from benchmarks/results/<NAME>.json (`headline`: every file's headline goals).",
    )
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite every stale block in place")
    mode.add_argument("--check", action="store_true", help="change nothing; exit 1 naming each stale page")
    args = parser.parse_args(argv)
    try:
        outdated = stale()
        if args.write:
            for page in outdated:
                page.write_text(render(page.read_text(), page))
                print(f"rendered {_shown(page, REPO)}")
            return 0
    except RenderError as exc:
        print(f"benchmarks.render: {exc}", file=sys.stderr)
        return 1
    for page in outdated:
        print(f"stale: {_shown(page, REPO)}: run .venv/bin/python -m benchmarks.render --write")
    return 1 if outdated else 0


if __name__ == "__main__":
    sys.exit(main())
