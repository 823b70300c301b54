"""A peer router pinned to one version, pip-installed into a venv of its own at the repository root.

A comparison is only as good as the version it names: the benchmarks that measure the manager
against a router install that router's pinned version into `.venv-<name>/` the first time they
need it (as the vLLM tier's `.venv-vllm/`), so every machine runs the same router and its
dependencies leave rollflow's venv alone. The version a results file records is read from that venv
on every run. A benchmark that cannot install its peer exits non-zero saying why; it never runs
without it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def python(distribution: str, version: str, venv: Path) -> Path:
    """The interpreter of `venv` holding `distribution`==`version`, installed on first use;
    SystemExit naming what failed when pip cannot install it (it needs PyPI)."""
    interpreter = venv / "bin" / "python"
    stamp = venv / f".installed-{version}"
    if stamp.exists() and interpreter.exists():
        return interpreter
    print(
        f"installing {distribution}=={version} into {venv.relative_to(REPO)}/ (once)",
        file=sys.stderr,
        flush=True,
    )
    steps = [
        [sys.executable, "-m", "venv", "--clear", str(venv)],
        [str(interpreter), "-m", "pip", "install", "-q", f"{distribution}=={version}"],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-5:])
            raise SystemExit(
                f"could not install {distribution}=={version}, the peer this benchmark compares "
                f"against ({' '.join(step[:4])} ... exited {done.returncode}):\n{tail}"
            )
    stamp.touch()
    return interpreter


def installed_version(interpreter: Path, distribution: str) -> str | None:
    """The version of `distribution` installed for `interpreter` (None when it is not there)."""
    code = f"import importlib.metadata as m; print(m.version({distribution!r}))"
    done = subprocess.run([str(interpreter), "-c", code], capture_output=True, text=True)
    return (done.stdout.strip() or None) if done.returncode == 0 else None
