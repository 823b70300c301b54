"""The docs-test rule itself: which blocks run, which are skipped, and that a failing command fails."""

from __future__ import annotations

import os

import pytest

from tests.docs.readme_blocks import ReadmeError, Section, run_section, sections

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
text
```bash
echo two-b
```
## Three
<!-- docs-test: skip: needs a GPU -->
```bash
nvidia-smi
```
"""


def test_blocks_group_by_section_and_markers_skip_the_next_block():
    found = sections(TEXT)
    assert [(s.title, s.blocks, s.skipped) for s in found] == [
        ("One", ["echo one"], [("too slow", "sleep 1000")]),
        ("Two", ["echo two-a", "echo two-b"], []),
        ("Three", [], [("needs a GPU", "nvidia-smi")]),
    ]


@pytest.mark.parametrize(
    "text",
    [
        "<!-- docs-test: skip: reason -->\ntext\n```bash\necho\n```\n",
        "<!-- docs-test: skip: -->\n```bash\necho\n```\n",
    ],
)
def test_a_marker_without_its_block_or_reason_is_an_error(text):
    with pytest.raises(ReadmeError):
        sections(text)


def test_a_failing_command_fails_the_section_and_stops_it(tmp_path):
    section = Section("s", ["echo before", "false", "touch after"])
    run = run_section(section, tmp_path, dict(os.environ), timeout_s=30)
    assert run.returncode != 0 and "before" in run.output
    assert not (tmp_path / "after").exists()


def test_a_failing_command_in_a_pipe_fails_the_section(tmp_path):
    run = run_section(Section("s", ["false | cat"]), tmp_path, dict(os.environ), timeout_s=30)
    assert run.returncode != 0


def test_background_servers_are_ended_and_reported(tmp_path):
    stopped = run_section(Section("s", ["sleep 300 &", "kill $(jobs -p)"]), tmp_path, dict(os.environ), 30)
    assert stopped.returncode == 0 and not stopped.left_running
    left = run_section(Section("s", ["sleep 300 &", "echo started"]), tmp_path, dict(os.environ), 30)
    assert left.returncode == 0 and left.left_running
