"""The docs pages' command blocks, and a runner that pastes a page's blocks into one shell.

The rule: every ```bash block of README.md and of each page under docs/ runs, in order, unless the
line before it (blank lines aside) is `<!-- docs-test: skip: REASON -->`. A page's runnable blocks
run as one bash script (`set -eo pipefail`, so the first failing command fails the page), as a
reader pasting the page into one terminal would: a variable or a server one block starts is there
for the next. Each block stops only what it started (`kill $ENGINE_PID`, never `kill $(jobs -p)`,
which would also stop what an earlier block left for a later one), and the page ends with nothing
of its own still running; the runner ends the page's whole process group afterwards all the same,
so a page that fails half-way leaves nothing listening.

Pages run side by side under pytest-xdist, each in its own copy of the repository and, as root, in
a network namespace of its own (`unshare -n`, loopback up), so two pages can both serve on
localhost:30000. Without root they take turns, under a lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

SKIP_MARKER = re.compile(r"^<!-- docs-test: skip: (?P<reason>.*\S) -->$")
HEADING = re.compile(r"^#{1,4} (?P<title>.+)$")
SERIAL_LOCK = Path(tempfile.gettempdir()) / "rollflow-docs-tier.lock"


@dataclass(frozen=True)
class Block:
    line: int  # of the ```bash fence, 1-based
    section: str  # the heading it sits under
    body: str

    def where(self, page: str) -> str:
        return f"{page}:{self.line} ({self.section})"


@dataclass
class Page:
    path: str  # relative to the repository, e.g. docs/guides/engines.md
    blocks: list[Block] = field(default_factory=list)  # runnable, in order
    skipped: list[tuple[str, Block]] = field(default_factory=list)  # (reason, block)

    def script(self) -> str:
        """The page's blocks as one bash script; on failure it names the block that failed."""
        lines = [
            "set -eo pipefail",
            "__docs_block=''",
            "trap 'status=$?; [ $status -eq 0 ] || echo \"docs-test: the block at $__docs_block failed "
            "(exit $status)\" >&2' EXIT",
        ]
        for block in self.blocks:
            lines.append(f"__docs_block={shlex.quote(block.where(self.path))}")
            lines.append(block.body)
        return "\n".join(lines) + "\n"


class PageError(ValueError):
    """A docs-test marker that does not sit right before a bash block, or has no reason."""


def parse(text: str, path: str) -> Page:
    """The bash blocks of `text`, runnable and skipped, in order."""
    page = Page(path)
    section = "(top)"
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
                block = Block(index + 1, section, "\n".join(lines[index + 1 : end]))
                if pending_skip is not None:
                    page.skipped.append((pending_skip, block))
                else:
                    page.blocks.append(block)
            elif pending_skip is not None:
                raise PageError(f"{path}:{index + 1}: a docs-test skip marker must precede a ```bash block")
            pending_skip = None
            index = end + 1
            continue
        heading = HEADING.match(line)
        if heading:
            section = heading["title"]
        if line.startswith("<!-- docs-test"):
            marker = SKIP_MARKER.match(line)
            if marker is None:
                raise PageError(f"{path}:{index + 1}: write it as <!-- docs-test: skip: REASON -->")
            pending_skip = marker["reason"]
        elif line.strip() and pending_skip is not None:
            raise PageError(f"{path}:{index + 1}: a docs-test skip marker must precede a ```bash block")
        index += 1
    return page


def pages(repo: Path) -> list[Page]:
    """README.md and every Markdown page under docs/, in that order."""
    paths = [repo / "README.md", *sorted((repo / "docs").rglob("*.md"))]
    return [parse(path.read_text(), str(path.relative_to(repo))) for path in paths]


def checkout_files(repo: Path) -> list[str]:
    """Files of the checkout as a fresh clone would have them, plus new ones not yet committed
    (not those git ignores): what a page may rely on."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=repo,
        capture_output=True,
        check=True,
    )
    return sorted({n for n in listed.stdout.decode().split("\0") if n and (repo / n).is_file()})


def copy_checkout(repo: Path, root: Path) -> Path:
    """A copy of the checkout at root/rollflow: its files and compiled extensions, `.venv` linked to
    the checkout's, and `../shared` linked beside it when the checkout has one."""
    copy = root / "rollflow"
    built = [str(path.relative_to(repo)) for path in repo.glob("rollflow/*/_*.so")]  # `make` builds them
    for name in [*checkout_files(repo), *built]:
        target = copy / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / name, target)
    (copy / ".venv").symlink_to((repo / ".venv").resolve())
    shared = repo.parent / "shared"
    if shared.is_dir():
        (root / "shared").symlink_to(shared.resolve())
    return copy


@dataclass(frozen=True)
class PageRun:
    returncode: int  # bash's exit status (-9 after the timeout)
    output: str  # stdout and stderr together
    left_running: bool  # processes of the page were still running after its last command


def isolated() -> bool:
    """Whether pages get network namespaces of their own (root, with unshare and ip)."""
    return os.geteuid() == 0 and shutil.which("unshare") is not None and shutil.which("ip") is not None


@contextlib.contextmanager
def turn(isolated_run: bool) -> Iterator[None]:
    """Without a namespace of its own a page holds the machine's ports: pages take turns."""
    if isolated_run:
        yield
        return
    with open(SERIAL_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def run_page(page: Page, cwd: Path, env: dict[str, str], timeout_s: float, isolate: bool) -> PageRun:
    """Run the page's blocks as one bash script in its own process group, then end that group.

    Output goes to a file, not a pipe: a background server would hold a pipe open after bash exits.
    """
    script = cwd / ".docs-test-page.sh"
    script.write_text(page.script())
    command = ["bash", str(script)]
    if isolate:
        command = ["unshare", "-n", "bash", "-c", 'ip link set lo up && exec "$@"', "page", *command]
    log_path = cwd / ".docs-test-page.log"
    with turn(isolate), open(log_path, "w") as log:
        process = subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            returncode = process.wait(timeout=timeout_s)
            still_running = ""
        except subprocess.TimeoutExpired:
            returncode = -signal.SIGKILL
            still_running = _say_what_hangs(process.pid)
        left_running = _end_group(process.pid)
        process.wait()
    output = log_path.read_text(errors="replace")
    log_path.unlink()
    script.unlink()
    if returncode == -signal.SIGKILL:
        output += f"\n(timed out after {timeout_s:g}s; still running then:)\n{still_running}"
    return PageRun(returncode, output, left_running)


def _say_what_hangs(pgid: int) -> str:
    """The group's live processes, oldest first, and (in the page's log) the stack of every thread
    of each rollflow process: the command a hung page waits on, and where the server it waits for
    is stuck. rollflow prints its stacks on SIGUSR1 (`rollflow.cli`)."""
    lines = []
    for pid in sorted(_live_members(pgid)):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        lines.append(f"  {pid} {command.strip()}")
        if "rollflow" in command and "python" in command:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR1)
    time.sleep(1.0)  # the stacks go to the log before the group is ended
    return "\n".join(lines)


def _end_group(pgid: int) -> bool:
    """Whether the page left live processes (after a 2 s grace for those its last command stopped);
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
