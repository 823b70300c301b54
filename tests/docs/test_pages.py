"""README.md and the site's pages as a new user runs them: every page's command blocks in one shell,
in a copy of the repository of its own (see blocks.py for the rule).

Each page runs in a fresh copy (the checkout's files as they are in the working tree, so an edited
page is what runs), so a page builds what it needs itself (the tiny model, say) and pages run side
by side under pytest-xdist. A page must end with its servers stopped, and must not change a file of
the checkout (a command that overwrites a shipped policy, say, fails here).
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import pytest

from tests.docs.blocks import Page, copy_checkout, isolated, pages, run_page

REPO = Path(__file__).resolve().parents[2]
PAGES = pages(REPO)
RUNNABLE = [page for page in PAGES if page.blocks]
SKIPPED = [(page, reason, block) for page in PAGES for reason, block in page.skipped]
# a bound for hangs, not a speed check: a page of several sections can take minutes on a busy 2-core
# machine (the trainer guide: 4.5 minutes alone, over 15 beside the rest of `make test` on 2 cores)
PAGE_TIMEOUT_S = 1500


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def environment(copy: Path) -> dict[str, str]:
    """The caller's environment, importing the copy's rollflow, offline, with no venv activated."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
    env.update(PYTHONPATH=str(copy), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    # pages run beside each other and the other tiers: torch's thread pools would spin against each
    # other on the machine's few cores (a value the caller set wins)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


@pytest.mark.parametrize("page", RUNNABLE, ids=lambda page: page.path)
def test_page_runs_as_written(page: Page, tmp_path: Path):
    if needs_shared(page) and not (REPO.parent / "shared").is_dir():
        pytest.skip(f"{page.path} needs ../shared (Vidur's data), absent beside {REPO}")
    copy = copy_checkout(REPO, tmp_path)
    before = {name: digest(copy / name) for name in _files(copy)}
    run = run_page(page, copy, environment(copy), PAGE_TIMEOUT_S, isolate=isolated())
    assert run.returncode == 0, f"{page.path} failed:\n{run.output[-6000:]}"
    assert not run.left_running, f"{page.path} left processes running:\n{run.output[-3000:]}"
    changed = [
        name for name, value in before.items() if not (copy / name).is_file() or digest(copy / name) != value
    ]
    assert not changed, f"{page.path}'s commands changed or removed files of the checkout: {changed}"


def needs_shared(page: Page) -> bool:
    """Whether the page reads ../shared, itself or through a config file of the repository it names."""
    script = page.script()
    named = [REPO / name for name in re.findall(r"(?:examples|benchmarks)/[\w./-]+\.(?:ya?ml|py)", script)]
    return "../shared" in script or any(p.is_file() and "../shared" in p.read_text() for p in named)


def _files(copy: Path) -> list[str]:
    return [str(p.relative_to(copy)) for p in copy.rglob("*") if p.is_file() and ".venv" not in p.parts]


# The one list of the blocks that do not run, each with its reason (pytest -ra prints them all).
@pytest.mark.parametrize(
    ("page", "reason", "block"), SKIPPED, ids=[block.where(page.path) for page, _, block in SKIPPED]
)
def test_skipped_block(page, reason, block):
    pytest.skip(f"{block.where(page.path)}: {reason}")


BARE = re.compile(r"(?:^|[\s;&|(])(rollflow|torchrun|tensorboard|ray|pip|python)\s")
CHECK = re.compile(r"\bgrep\b[^|;&]*\s-\w*[qc]|\btest\s|\[\[? |\bassert\b|\bcmp\s|\bdiff\s")


def _commands(block: str) -> list[str]:
    lines = []
    for line in block.splitlines():
        command = re.sub(r"\s#.*$|^\s*#.*$", "", line)
        lines.append(re.sub(r"'[^']*'|\"[^\"]*\"", "''", command))  # arguments in quotes are data
    return lines


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.path)
def test_commands_name_the_venv_executables(page: Page):
    # one form: .venv/bin/rollflow, .venv/bin/torchrun, .venv/bin/python ... (no activated venv needed)
    for block in page.blocks + [block for _, block in page.skipped]:
        for line in _commands(block.body):
            bare = BARE.search(line)
            assert bare is None, f"{block.where(page.path)}: write .venv/bin/{bare[1]}: {line.strip()}"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.path)
def test_blocks_stop_only_what_they_started(page: Page):
    # `kill $(jobs -p)` also stops the servers an earlier block left for a later one
    for block in page.blocks + [block for _, block in page.skipped]:
        assert "jobs -p" not in block.body and not re.search(r"kill\s+%", block.body), (
            f"{block.where(page.path)}: stop what the block started by its pid (SERVER_PID=$!; kill $SERVER_PID)"
        )


STOPS = re.compile(r"^\s*(kill|wait)\b[^;&|]*(;\s*(kill|wait)\b[^;&|]*)*(\|\|\s*true)?\s*$")


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.path)
def test_blocks_check_what_they_claim(page: Page):
    # an exit status alone passes a command that printed the wrong thing: a block checks a line, a
    # file or a key of what it made (grep -q, test -f, python -c '... assert ...'); a block that only
    # stops what an earlier one started has nothing to check
    for block in page.blocks:
        commands = [line for line in _commands(block.body) if line.strip()]
        if CHECK.search(block.body) or all(STOPS.match(line) for line in commands):
            continue
        pytest.fail(
            f"{block.where(page.path)}: the block checks nothing it claims "
            "(add grep -q EXPECTED, test -f FILE or python -c '... assert ...')"
        )
