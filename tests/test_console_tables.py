"""`rl-sim compare` and `router compare` print every figure of their table however they are read:
piped (plain columns, one line per row), on a terminal narrower than the table (columns folded
into groups that fit, each led by the row names), or on a wide terminal (the boxed table)."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import termios
from pathlib import Path

import pytest

from rollflow.runtime.launch.process import rollflow_command

REPO = Path(__file__).resolve().parents[1]
RL_COMPARE = [
    "rl-sim", "compare", "--config", "examples/rl/rlboost_spot.yaml", "--no-plots", "steps=1",
    "workload.num_prompts=16", "workload.samples_per_prompt=4", "workload.output_median_tokens=256",
]  # fmt: skip
ROUTER_COMPARE = [
    "router", "compare", "--config", "examples/router/heterogeneous.yaml",
    "--policy", "examples/router/heterogeneous.policy.npz", "scenario.eval_seeds=[1]", "scenario.eval_requests=40",
]  # fmt: skip
ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # colours, cursor moves of progress spinners


def _env() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key not in ("COLUMNS", "LINES")}


def _piped(args: list[str], out_dir: Path) -> str:
    proc = subprocess.run(
        rollflow_command(*args, "--output-dir", str(out_dir)),
        cwd=REPO, env={**_env(), "COLUMNS": "80"}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _on_terminal(args: list[str], out_dir: Path, columns: int) -> str:
    """stdout of the command on a pseudo-terminal `columns` wide, as in a user's terminal window."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    with open(out_dir.parent / f"{out_dir.name}.stderr", "wb") as stderr:
        proc = subprocess.Popen(
            rollflow_command(*args, "--output-dir", str(out_dir)),
            cwd=REPO, env=_env(), stdout=follower, stderr=stderr,
        )  # fmt: skip
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the command closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert proc.wait(timeout=300) == 0, (out_dir.parent / f"{out_dir.name}.stderr").read_text()
    return ESCAPES.sub("", b"".join(chunks).decode().replace("\r", ""))  # what the user reads


def _compared(args: list[str], out_dir: Path, where: str, columns: int) -> tuple[str, dict]:
    """What the compare printed, piped or (any other `where`) on a terminal `columns` wide, and the
    compare.json it wrote: the figures the printed table must show."""
    text = _piped(args, out_dir) if where == "piped" else _on_terminal(args, out_dir, columns)
    return text, json.loads((out_dir / "compare.json").read_text())


def _cells(text: str, name: str) -> list[str]:
    """The cells of row `name` in plain columns, folded or not: the words after the name on each of
    its lines under a dashed rule (a row has as many words as the rule has dashes groups)."""
    cells, width = [], 0
    for line in text.splitlines():
        words = line.split()
        if words and all(set(word) == {"-"} for word in words):
            width = len(words)
        elif len(words) != width:
            width = 0  # the block of rows ended
        elif words[0] == name:
            cells += words[1:]
    return cells


def _rl_figures(row: dict) -> list[str]:
    return [
        f"{row['step_time_s']:.1f}",
        f"{row['throughput_tokens_per_s']:.0f}",
        f"{row['gpu_utilization']:.1%}",
        f"{row['cost_usd_per_mtok']:.3f}",
        str(row["regenerated_tokens"]),
    ]


def _router_figures(row: dict) -> list[str]:
    figures = [f"{row[key]:.2f}" for key in ("e2e_p99", "e2e_mean", "ttft_p99", "ttft_mean")]
    return [*figures, f"{100 * row['slo_attainment']:.1f}%"]


@pytest.mark.parametrize("where", ["piped", "terminal of 60 columns"])
def test_rl_compare_prints_every_figure(tmp_path, where):
    text, results = _compared(RL_COMPARE, tmp_path / "compare", where, 60)
    for name, row in results.items():
        cells = _cells(text, name)
        assert len(cells) == 8 and cells[:5] == _rl_figures(row), text  # and three "vs first" columns
    if where == "piped":  # one line per row, for grep and awk
        assert sum(line.split()[:1] == ["on-demand"] for line in text.splitlines()) == 1
    else:
        assert max(map(len, text.splitlines())) <= 60, text
        assert "┃" not in text


@pytest.mark.parametrize("where", ["piped", "terminal of 50 columns"])
def test_router_compare_prints_every_figure(tmp_path, where):
    text, results = _compared(ROUTER_COMPARE, tmp_path / "compare", where, 50)
    for name, row in results.items():
        assert _cells(text, name) == _router_figures(row), text
    if where != "piped":
        assert max(map(len, text.splitlines())) <= 50, text


def test_a_wide_terminal_gets_the_boxed_table(tmp_path):
    text = _on_terminal(RL_COMPARE, tmp_path / "compare", 200)
    assert "┃ policy" in text and "│ spot-migrate" in text
