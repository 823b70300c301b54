"""The results blocks of README.md and docs/ (benchmarks/render.py), rendered from results files
that benchmarks/results.py wrote, in a checkout of their own."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import render
from benchmarks.results import Results

PAGE = """# Guide

Prose that explains stays.

<!-- results: manager_journal -->
a figure typed by hand
<!-- results: end -->

More prose.
"""


def _checkout(tmp_path: Path, page: str = PAGE, readme: str = "# rollflow\n") -> Path:
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "docs" / "guides").mkdir(parents=True)
    for name in ("manager_journal", "manager_overhead"):
        (tmp_path / "benchmarks" / f"{name}.py").write_text(f'"""{name}."""\n')
    (tmp_path / "docs" / "guides" / "guide.md").write_text(page)
    (tmp_path / "README.md").write_text(readme)
    return tmp_path


def _results(root: Path, name: str, headline: bool = True, peer: str | None = "0.3.2") -> None:
    results = Results(name, root / "benchmarks" / "results")
    if peer is not None:
        results.peers["sglang-router"] = peer
    results.goal("CPU per token, journal on / off", 1.04, "<=", 1.1, headline=headline)
    results.goal("tokens lost", 0, "==", 0)
    results.finish()


def test_a_block_without_a_results_file_says_not_yet_measured_and_how_to_measure(tmp_path):
    root = _checkout(tmp_path)
    page = root / "docs" / "guides" / "guide.md"
    rendered = render.render(page.read_text(), page, root)
    assert "a figure typed by hand" not in rendered
    assert "Not yet measured in this checkout: `.venv/bin/python benchmarks/manager_journal.py`" in rendered
    assert rendered.startswith("# Guide\n\nProse that explains stays.\n") and rendered.endswith(
        "More prose.\n"
    )
    assert render.stale(root) == [page]


def test_a_block_renders_its_results_file_goals_and_is_then_current(tmp_path):
    root = _checkout(tmp_path)
    _results(root, "manager_journal")
    page = root / "docs" / "guides" / "guide.md"
    page.write_text(render.render(page.read_text(), page, root))
    text = page.read_text()
    assert "| CPU per token, journal on / off | <= 1.1 | sglang-router 0.3.2 | 1.04 | met |" in text
    assert "| tokens lost | == 0 | sglang-router 0.3.2 | 0 | met |" in text
    assert "[Benchmarks](../benchmarks/index.md#manager-journal)" in text
    assert render.stale(root) == []
    _results(root, "manager_journal", peer="0.4.0")  # a new run: the block is stale again
    assert render.stale(root) == [page]


def test_the_headline_block_shows_only_headline_goals_one_row_each(tmp_path):
    readme = "# rollflow\n\n<!-- results: headline -->\n<!-- results: end -->\n"
    root = _checkout(tmp_path, readme=readme)
    page = root / "README.md"
    empty = render.render(page.read_text(), page, root)
    assert "No headline figure is measured in this checkout yet: `make bench`" in empty
    _results(root, "manager_journal")
    _results(root, "manager_overhead", headline=False)
    rendered = render.render(page.read_text(), page, root)
    link = "[`benchmarks/results/manager_journal.json`](benchmarks/results/manager_journal.json)"
    assert f"| CPU per token, journal on / off | sglang-router 0.3.2 | 1.04 (<= 1.1) | {link} |" in rendered
    assert "tokens lost" not in rendered and "manager_overhead" not in rendered


def test_a_missed_headline_goal_says_so(tmp_path):
    readme = "<!-- results: headline -->\n<!-- results: end -->\n"
    root = _checkout(tmp_path, readme=readme)
    results = Results("manager_journal", root / "benchmarks" / "results")
    results.goal("throughput / sglang-router", 0.8, ">=", 1.0, headline=True)
    results.finish()
    rendered = render.render(readme, root / "README.md", root)
    assert "| throughput / sglang-router | none | 0.8 (>= 1) **missed** |" in rendered


def test_a_block_naming_no_benchmark_is_an_error_naming_the_page(tmp_path):
    root = _checkout(tmp_path, page="<!-- results: vidur -->\n<!-- results: end -->\n")
    with pytest.raises(render.RenderError, match=r"docs/guides/guide.md: `<!-- results: vidur -->` names no"):
        render.stale(root)


def test_a_block_without_its_end_marker_is_an_error(tmp_path):
    root = _checkout(tmp_path, page="<!-- results: manager_journal -->\nno end\n")
    with pytest.raises(render.RenderError, match="without its `<!-- results: end -->`"):
        render.stale(root)


def test_a_table_block_renders_the_named_table_and_a_missing_one_is_an_error(tmp_path):
    page_text = "<!-- results: manager_journal table: RLBoost, settled -->\nold\n<!-- results: end -->\n"
    root = _checkout(tmp_path, page=page_text)
    results = Results("manager_journal", root / "benchmarks" / "results")
    results.goal("tokens lost", 0, "==", 0)
    results.table("Another table", ["a"], [[1]])
    results.table("RLBoost, settled: paper beside rollflow", ["condition", "paper", "rollflow"],
                  [["on-policy", "1.51-1.97x", "1.19 to 1.57x"]])  # fmt: skip
    results.finish()
    page = root / "docs" / "guides" / "guide.md"
    rendered = render.render(page.read_text(), page, root)
    assert rendered.startswith("<!-- results: manager_journal table: RLBoost, settled -->\n")
    assert "**RLBoost, settled: paper beside rollflow**" in rendered
    assert "| on-policy | 1.51-1.97x | 1.19 to 1.57x |" in rendered
    assert "old" not in rendered and "Another table" not in rendered and "tokens lost" not in rendered
    page.write_text(rendered)
    assert render.stale(root) == []
    page.write_text(page_text.replace("RLBoost, settled", "RLinf"))
    with pytest.raises(render.RenderError, match=r"table: RLinf -->` names no table of .*RLBoost, settled"):
        render.stale(root)
