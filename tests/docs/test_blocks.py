"""The docs-test rule itself: which blocks run, which are skipped, and that a failing command fails."""

from __future__ import annotations

import concurrent.futures
import os
from pathlib import Path

import pytest

from tests.docs.blocks import Block, Page, PageError, isolated, parse, run_page

REPO = Path(__file__).resolve().parents[2]

TEXT = """# title
## One
```bash
echo one
```
<!-- docs-test: skip: too slow -->

```bash
sleep 1000
```
```python
not bash
```
### Two
```bash
echo two-a
```
"""


def page_of(*bodies: str) -> Page:
    return Page("page.md", [Block(index + 1, "s", body) for index, body in enumerate(bodies)])


def test_blocks_run_in_order_and_markers_skip_the_next_block():
    page = parse(TEXT, "page.md")
    assert [(b.line, b.section, b.body) for b in page.blocks] == [
        (3, "One", "echo one"),
        (15, "Two", "echo two-a"),
    ]
    assert [(reason, b.body) for reason, b in page.skipped] == [("too slow", "sleep 1000")]


@pytest.mark.parametrize(
    "text",
    [
        "<!-- docs-test: skip: reason -->\ntext\n```bash\necho\n```\n",
        "<!-- docs-test: skip: -->\n```bash\necho\n```\n",
    ],
)
def test_a_marker_without_its_block_or_reason_is_an_error(text):
    with pytest.raises(PageError):
        parse(text, "page.md")


def test_a_failing_command_fails_the_page_and_names_its_block(tmp_path):
    run = run_page(page_of("echo before", "false", "touch after"), tmp_path, dict(os.environ), 30, False)
    assert run.returncode != 0 and "before" in run.output
    assert "the block at page.md:2 (s) failed" in run.output
    assert not (tmp_path / "after").exists()


def test_a_failing_command_in_a_pipe_fails_the_page(tmp_path):
    assert run_page(page_of("false | cat"), tmp_path, dict(os.environ), 30, False).returncode != 0


def test_blocks_share_one_shell(tmp_path):
    run = run_page(
        page_of("X=42", 'test "$X" = 42 && echo same-shell'), tmp_path, dict(os.environ), 30, False
    )
    assert run.returncode == 0 and "same-shell" in run.output


def test_background_servers_are_ended_and_reported(tmp_path):
    stopped = run_page(page_of("sleep 300 &", "PID=$!; kill $PID"), tmp_path, dict(os.environ), 30, False)
    assert stopped.returncode == 0 and not stopped.left_running
    left = run_page(page_of("sleep 300 &", "echo started"), tmp_path, dict(os.environ), 30, False)
    assert left.returncode == 0 and left.left_running


@pytest.mark.skipif(not isolated(), reason="network namespaces need root, unshare and ip")
def test_isolated_pages_can_listen_on_the_same_port(tmp_path):
    # two pages at once, each serving on port 30000 in its own namespace
    serve = page_of(
        ".venv/bin/python -m http.server 30000 --bind 127.0.0.1 >/dev/null 2>&1 & PID=$!",
        "curl -sf -o /dev/null --retry 30 --retry-connrefused --retry-delay 1 localhost:30000/ && echo served",
        "kill $PID",
    )
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / ".venv").symlink_to(REPO / ".venv")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda n: run_page(serve, tmp_path / n, dict(os.environ), 60, True), ("a", "b")))
    assert all(run.returncode == 0 and "served" in run.output for run in runs), [r.output for r in runs]
