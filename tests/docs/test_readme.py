"""README.md as a new user runs it: every command block, section by section, in a copy of the repository.

See readme_blocks.py for the rule. The copy holds the checkout's tracked files (as they are in the
working tree, so an edited README is what runs), `.venv` linked to the checkout's, and `../shared`
linked beside it when the checkout has one. Sections run in README order in that one copy, as a
reader works through them; each must end with its servers stopped. Afterwards no tracked file of
the copy may have changed (a command that overwrites a shipped file, a policy say, fails here).
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.docs.readme_blocks import Section, run_section, sections

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"
README_SECTIONS = sections((REPO / "README.md").read_text())
# a bound for hangs: the slowest sections (profiling) took 200-240 s on a busy 2-core machine
SECTION_TIMEOUT_S = 360


def tracked_files() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True)
    return [name for name in listed.stdout.decode().split("\0") if name and (REPO / name).is_file()]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """(the copy, its digests of tracked files)."""
    root = tmp_path_factory.mktemp("readme")
    copy = root / "rollflow"
    digests = {}
    for name in tracked_files():
        target = copy / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((REPO / name).read_bytes())
        target.chmod((REPO / name).stat().st_mode)
        digests[name] = digest(target)
    (copy / ".venv").symlink_to((REPO / ".venv").resolve())
    if SHARED.is_dir():
        (root / "shared").symlink_to(SHARED.resolve())
    return copy, digests


def environment(copy: Path) -> dict[str, str]:
    """The caller's environment, importing the copy's rollflow, offline, with no venv activated."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
    env.update(PYTHONPATH=str(copy), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return env


@pytest.mark.parametrize("section", README_SECTIONS, ids=lambda s: s.title)
def test_readme_section_runs_as_written(section: Section, workspace):
    copy, _ = workspace
    if not section.blocks:
        pytest.skip("every block skipped: " + "; ".join(reason for reason, _ in section.skipped))
    if "../shared" in section.script() and not SHARED.is_dir():
        pytest.skip(f"needs ../shared, absent beside {REPO}")
    run = run_section(section, copy, environment(copy), SECTION_TIMEOUT_S)
    assert run.returncode == 0, f"section {section.title!r} failed:\n{run.output[-6000:]}"
    assert not run.left_running, f"section {section.title!r} left processes running:\n{run.output[-3000:]}"


def test_no_section_overwrote_a_tracked_file(workspace):
    copy, digests = workspace  # runs after the sections (pytest keeps file order)
    changed = [name for name, value in digests.items() if digest(copy / name) != value]
    assert not changed, f"README commands changed tracked files: {changed}"


BARE = re.compile(r"(?:^|[\s;&|(])(rollflow|torchrun|tensorboard|ray|pip|python)\s")


@pytest.mark.parametrize("section", README_SECTIONS, ids=lambda s: s.title)
def test_commands_name_the_venv_executables(section: Section):
    # one form: .venv/bin/rollflow, .venv/bin/torchrun, .venv/bin/python ... (no activated venv needed)
    for block in section.blocks + [block for _, block in section.skipped]:
        for line in block.splitlines():
            command = re.sub(r"\s#.*$|^#.*$", "", line)
            command = re.sub(r"'[^']*'|\"[^\"]*\"", "''", command)  # arguments in quotes are data
            bare = BARE.search(command)
            assert bare is None, f"{section.title}: write .venv/bin/{bare[1]}: {line.strip()}"
