"""The documentation site and what it is generated from: the strict build, the HTTP routes' tables,
the README's length, and the results blocks of the README and docs/ (benchmarks/render.py)."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import render
from rollflow.cli import COMMAND_GROUPS, build_parser
from tools.docs_site import benchmarks_page, cli_reference, config_reference
from tools.docs_site.http_reference import SERVERS, registered_routes

REPO = Path(__file__).resolve().parents[2]
MKDOCS = Path(sys.executable).parent / "mkdocs"


def test_the_site_builds_strictly(tmp_path: Path):
    # --strict: a broken link or anchor, a page missing from the nav or the docs, any warning fails
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    built = subprocess.run(
        [str(MKDOCS), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-6000:]
    for page in ("reference/cli", "reference/config", "reference/http", "reference/metrics", "benchmarks"):
        assert (tmp_path / "site" / page / "index.html").is_file(), f"{page} was not generated"
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    assert "rollflow manager serve" in cli and "--config" in cli


@pytest.mark.parametrize("server", SERVERS, ids=lambda server: server.anchor)
def test_every_route_is_documented_and_every_documented_route_exists(server):
    registered = set(registered_routes(server))
    documented = set(server.docs())
    assert not registered - documented, f"routes without an entry in {server.anchor}'s routes_doc.py"
    assert not documented - registered, f"entries of {server.anchor}'s routes_doc.py that name no route"


def test_the_readme_is_short():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; the manual is the site (docs/)"


def test_every_results_block_in_the_readme_and_docs_is_current():
    stale = [str(page.relative_to(REPO)) for page in render.stale(REPO)]
    assert not stale, f"stale results blocks in {stale}: run .venv/bin/python -m benchmarks.render --write"


def test_a_results_file_renders_with_its_command_and_goals(tmp_path: Path):
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks" / "demo_bench.py").write_text(
        '"""Demo.\n\n    python benchmarks/demo_bench.py --n 3\n"""\n'
    )
    (tmp_path / "benchmarks" / "later.py").write_text('"""Not run.\n\n    python benchmarks/later.py\n"""\n')
    results = {
        "name": "demo_bench",
        "command": ".venv/bin/python benchmarks/demo_bench.py --n 3",
        "goals": [
            {
                "name": "p50 added",
                "target": "<= 1.5x",
                "peer": "sglang-router",
                "measured": "1.1x",
                "met": True,
            }
        ],
    }
    (tmp_path / "benchmarks" / "results" / "demo_bench.json").write_text(__import__("json").dumps(results))
    page = benchmarks_page.page(tmp_path)
    assert (
        ".venv/bin/python benchmarks/demo_bench.py --n 3" in page
        and "| p50 added | <= 1.5x | sglang-router | 1.1x | met |" in page
    )
    assert ".venv/bin/python benchmarks/later.py" in page and "Not yet run" in page


def test_a_file_the_benchmarks_write_renders_with_its_peers(tmp_path: Path):
    """The page reads what benchmarks/results.py writes, not a shape of its own."""
    from benchmarks.results import Results

    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "peer_bench.py").write_text('"""Peer."""\n')
    results = Results("peer_bench", tmp_path / "benchmarks" / "results")
    results.peers["sglang-router"] = "0.3.2"
    results.goal("throughput manager / sglang-router", 1.07, ">=", 1.0)
    assert results.finish() == 0
    page = benchmarks_page.page(tmp_path)
    assert "| throughput manager / sglang-router | >= 1 | sglang-router 0.3.2 | 1.07 | met |" in page


def test_a_results_file_without_its_goals_is_an_error(tmp_path: Path):
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks" / "bad.py").write_text('"""Bad."""\n')
    (tmp_path / "benchmarks" / "results" / "bad.json").write_text('{"name": "bad", "command": "x"}')
    with pytest.raises(benchmarks_page.ResultsError, match="missing goals"):
        benchmarks_page.benchmarks(tmp_path)


def test_the_config_reference_lists_every_key_of_every_file():
    text = config_reference.page()
    for spec in config_reference.CONFIG_FILES:
        model = spec.load()
        section = text.split(f"{{#{spec.anchor}}}", 1)[1]
        for name in model.model_fields:
            row = re.compile(rf'\| (<span id="[^"]+"></span>)?`{name}` \|')
            assert row.search(section), f"{spec.anchor}: key {name} is missing"
    assert "| `cluster.replicas` | `int` | `1` |" in text  # nested keys, with type and default


def test_the_cli_reference_lists_every_command_and_flag():
    text = cli_reference.page()

    def check(prog: str, parser: argparse.ArgumentParser) -> None:
        section = text.split(f"{{#{prog.replace(' ', '-')}}}", 1)[1]
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            for option in action.option_strings:
                assert option in section, f"{prog}: flag {option} is missing"
        for name, child in cli_reference._subcommands(parser).items():
            check(f"{prog} {name}", child)

    for group in COMMAND_GROUPS:
        check(f"rollflow {group}", cli_reference._subcommands(build_parser([group]))[group])
