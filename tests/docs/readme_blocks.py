"""The README's command blocks, by section, and a runner that pastes a section's blocks into one shell.

The rule: every ```bash block of README.md runs, in order, unless the line before it (blank lines
aside) is `<!-- docs-test: skip: REASON -->`. A section is the text under a `##` or `###` heading;
its runnable blocks run as one bash script (`set -eo pipefail`, so the first failing command fails
the section), as a reader pasting them into one terminal would. Servers a block starts in the
background are the section's to stop (`kill $(jobs -p)`); the runner also ends the section's whole
process group afterwards, so a section that fails half-way leaves nothing listening.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

SKIP_MARKER = re.compile(r"^<!-- docs-test: skip: (?P<reason>.*\S) -->$")
HEADING = re.compile(r"^#{2,3} (?P<title>.+)$")


@dataclass
class Section:
    title: str
    blocks: list[str] = field(default_factory=list)  # runnable bash blocks, in order
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (reason, block) of each skipped block

    def script(self) -> str:
        return "set -eo pipefail\n" + "\n".join(self.blocks)


class ReadmeError(ValueError):
    """A docs-test marker that does not sit right before a bash block, or has no reason."""


def sections(text: str) -> list[Section]:
    """The sections of `text` that hold at least one bash block, in order."""
    found: list[Section] = []
    current = Section("(top)")
    pending_skip: str | None = None
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.startswith("```"):
            end = index + 1
            while end < len(lines) and not lines[end].startswith("```"):
                end += 1
            if line.strip() == "```bash":
                body = "\n".join(lines[index + 1 : end])
                if pending_skip is not None:
                    current.skipped.append((pending_skip, body))
                else:
                    current.blocks.append(body)
            elif pending_skip is not None:
                raise ReadmeError(f"line {index + 1}: a docs-test skip marker must precede a ```bash block")
            pending_skip = None
            index = end + 1
            continue
        heading = HEADING.match(line)
        if heading:
            if current.blocks or current.skipped:
                found.append(current)
            current = Section(heading["title"])
        if line.startswith("<!-- docs-test"):
            marker = SKIP_MARKER.match(line)
            if marker is None:
                raise ReadmeError(f"line {index + 1}: write it as <!-- docs-test: skip: REASON -->")
            pending_skip = marker["reason"]
        elif line.strip() and pending_skip is not None:
            raise ReadmeError(f"line {index + 1}: a docs-test skip marker must precede a ```bash block")
        index += 1
    if current.blocks or current.skipped:
        found.append(current)
    return found


@dataclass(frozen=True)
class SectionRun:
    returncode: int  # bash's exit status (-9 after the timeout)
    output: str  # stdout and stderr together
    left_running: bool  # processes of the section were still running after its last command


def run_section(section: Section, cwd: Path, env: dict[str, str], timeout_s: float) -> SectionRun:
    """Run the section's blocks as one bash script in its own process group, then end that group.

    Output goes to a file, not a pipe: a background server would hold a pipe open after bash exits.
    """
    log_path = cwd / f".docs-test-{os.getpid()}.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            ["bash", "-c", section.script()],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            returncode = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            returncode = -signal.SIGKILL
        left_running = _end_group(process.pid)
        process.wait()
    output = log_path.read_text(errors="replace")
    log_path.unlink()
    if returncode == -signal.SIGKILL:
        output += f"\n(timed out after {timeout_s:g}s)"
    return SectionRun(returncode, output, left_running)


def _end_group(pgid: int) -> bool:
    """Whether the section left live processes (after a 2 s grace for those its last command stopped);
    then SIGTERM its process group, and SIGKILL what is left after 10 s."""
    left_running = _wait_gone(pgid, 2.0)
    if left_running:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        if _wait_gone(pgid, 10.0):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
    return left_running


def _wait_gone(pgid: int, timeout_s: float) -> bool:
    """Wait until no live process is in the group; True when some still are after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while _live_members(pgid):
        if time.monotonic() >= deadline:
            return True
        time.sleep(0.2)
    return False


def _live_members(pgid: int) -> list[int]:
    """Processes of the group that are not zombies (an unreaped zombie is not running anything)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        state, _ppid, group = stat[stat.rindex(")") + 2 :].split()[:3]
        if int(group) == pgid and state != "Z":
            members.append(int(entry.name))
    return members
