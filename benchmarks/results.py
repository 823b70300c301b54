"""One benchmark run written as `benchmarks/results/<name>.json`, and the exit status it earns.

A figure nobody can check is worth little, so each benchmark that backs a published figure writes
what it measured and how, in one shape the docs render from:

    name      the benchmark's name (the file's stem)
    command   the command line exactly as run (`sys.orig_argv`, shell-quoted)
    commit    git HEAD, with "+dirty" when the tree differs from it (results files left out)
    machine   cores, CPU model, Python, and the 1/5/15-minute load average before and after
    peers     each system compared against -> its version or commit (null: it did not run)
    figures   the measurements, as the benchmark names them
    goals     [{name, target, measured, met, headline?}], target as "<op> <number>", e.g. ">= 0.9";
              headline: true on the few goals the README's front page shows
    tables    (optional) [{title, columns, rows}]: the figures behind the goals, as the site shows them

The exit rule (`exit_status`): non-zero when any goal is missed (a measurement that is missing or
not a number misses its goal) or any peer did not run. What makes a run invalid (errors, lost or
regenerated tokens where none may be) is stated as a goal with target "== 0", so it is recorded
beside the rest and fails the run alike.

    results = Results("manager_overhead", results_dir(args))
    results.peers["sglang-router"] = package_version("sglang-router")
    results.figures["rps"] = 1234.5
    results.goal("throughput manager / sglang-router", measured=1.1, op=">=", target=1.0)
    sys.exit(results.finish())
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import operator
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DIR = REPO / "benchmarks" / "results"
QUICK_DIR = DEFAULT_DIR / "quick"

OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    ">=": operator.ge,
    "<": operator.lt,
    ">": operator.gt,
    "==": operator.eq,
}


def add_results_dir(parser: argparse.ArgumentParser) -> None:
    """The options every benchmark that writes a results file takes: `--results-dir` and `--quick`
    (the benchmark's smaller inputs, what `make bench-quick` runs; its figures mean little)."""
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=None,
        help=f"where <name>.json is written (default {DEFAULT_DIR.relative_to(REPO)}; "
        f"with --quick: {QUICK_DIR.relative_to(REPO)}, not committed)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smaller inputs, to check the benchmark end to end in a minute or two (make bench-quick); "
        "the goals are still judged",
    )


def benchmark_parser(doc: str) -> argparse.ArgumentParser:
    """A benchmark's command line: its module docstring `doc` as the help, laid out as written (it
    says what is measured against what), and the options every benchmark takes (add_results_dir)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_results_dir(parser)
    return parser


def add_inputs(parser: argparse.ArgumentParser, full: dict[str, int], helps: dict[str, str]) -> None:
    """Each of a run's inputs `helps` names as an integer option (`rounds` -> `--rounds`), with its
    help and the value of a full run (`full`); each defaults to None, so that `fill_inputs` can tell
    an option given from one left out."""
    for key, help in helps.items():
        parser.add_argument(f"--{key.replace('_', '-')}", type=int, help=f"{help} ({full[key]})")


def fill_inputs(args: argparse.Namespace, full: dict[str, Any], quick: dict[str, Any]) -> None:
    """Set each of a run's inputs the command line left out (None, or no such option) from `quick`
    under `--quick`, else from `full`: an option given on the command line wins over both."""
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)


def add_shared_dir(parser: argparse.ArgumentParser) -> None:
    """`--shared DIR`, for a benchmark that reads what lies beside the repository: Vidur's public
    data (data/vidur) and tools/attention_table.py."""
    parser.add_argument(
        "--shared",
        type=Path,
        default=REPO.parent / "shared",
        help="the folder holding data/vidur (Vidur's public data) and tools/attention_table.py (default ../shared)",
    )


def results_dir(args: argparse.Namespace) -> Path:
    """`--results-dir` if given, else the quick or the committed folder."""
    if args.results_dir is not None:
        return args.results_dir
    return QUICK_DIR if args.quick else DEFAULT_DIR


def package_version(distribution: str) -> str | None:
    """The installed version of a peer's package, None when it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def goal_met(target: str, measured: float | None) -> bool:
    """Whether `measured` meets `target` ("<op> <number>"); a missing or NaN measurement does not."""
    op, number = parse_target(target)
    if measured is None or isinstance(measured, bool) or not math.isfinite(measured):
        return False
    return OPS[op](measured, number)


def parse_target(target: str) -> tuple[str, float]:
    """("<=", 1.5) from "<= 1.5"; ValueError naming what is wrong otherwise."""
    op, _, number = target.partition(" ")
    if op not in OPS:
        raise ValueError(f"goal target {target!r} must start with one of {', '.join(OPS)} and a space")
    try:
        return op, float(number)
    except ValueError:
        raise ValueError(f"goal target {target!r} must end with a number") from None


def exit_status(document: dict[str, Any]) -> tuple[int, list[str]]:
    """(0, []) for a run that met every goal with every peer run; (1, the reasons) otherwise.

    `met` is judged again from `target` and `measured` rather than trusted, so a file edited by
    hand (or a writer's bug) cannot pass a missed goal."""
    reasons = [f"peer {name} did not run" for name, version in document["peers"].items() if version is None]
    for goal in document["goals"]:
        if not goal_met(goal["target"], goal["measured"]):
            reasons.append(
                f"goal missed: {goal['name']}: measured {goal['measured']}, target {goal['target']}"
            )
    return (1 if reasons else 0), reasons


def git_commit(repo: Path, results_dir: Path) -> str:
    """HEAD, "+dirty" when tracked or untracked files differ from it; results files do not count,
    or one benchmark's output would mark every later one dirty."""
    try:
        head = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        status = ["git", "-C", str(repo), "status", "--porcelain", "--", "."]
        resolved, root = results_dir.resolve(), repo.resolve()
        if resolved.is_relative_to(root):
            status.append(f":(exclude){resolved.relative_to(root)}")
        changes = subprocess.run(status, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return head + ("+dirty" if changes.strip() else "")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _clean(value: Any) -> Any:
    """JSON-ready: non-finite floats become null (strict JSON has no NaN), floats keep 6 digits."""
    if isinstance(value, float):
        return float(f"{value:.6g}") if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def repo_relative(arg: str) -> str:
    """`arg` relative to the repository when it is a path inside it: the suite starts each benchmark
    with absolute paths, and a results file names the command as anyone reruns it from a checkout."""
    prefix = f"{REPO}/"
    return arg[len(prefix) :] if arg.startswith(prefix) else arg


class Results:
    """A run's results file in the making: created when the run starts (load average, command,
    commit), filled with peers, figures and goals, written and judged by `finish()`."""

    def __init__(self, name: str, results_dir: Path = DEFAULT_DIR) -> None:
        self.name = name
        self.results_dir = results_dir
        self.command = shlex.join(repo_relative(arg) for arg in sys.orig_argv)
        self.commit = git_commit(REPO, results_dir)
        self.load_before = list(os.getloadavg())
        self.peers: dict[str, str | None] = {}
        self.figures: dict[str, Any] = {}
        self.goals: list[dict[str, Any]] = []
        self.tables: list[dict[str, Any]] = []

    def goal(self, name: str, measured: float | None, op: str, target: float, headline: bool = False) -> bool:
        """Record a goal ("measured op target") and whether it was met. A `headline` goal is one of
        the few the README's front-page table shows (the site's Benchmarks page shows them all)."""
        written = f"{op} {target:g}"
        met = goal_met(written, measured)
        entry = {"name": name, "target": written, "measured": measured, "met": met}
        if headline:
            entry["headline"] = True
        self.goals.append(entry)
        return met

    def table(self, title: str, columns: list[str], rows: list[list[Any]]) -> None:
        """A table of the figures behind the goals (per round, per load, per system), rendered as it
        is on the site's Benchmarks page."""
        if any(len(row) != len(columns) for row in rows):
            raise ValueError(f"table {title!r}: every row needs {len(columns)} cells ({columns})")
        self.tables.append({"title": title, "columns": columns, "rows": rows})

    def document(self) -> dict[str, Any]:
        machine = {
            "cores": os.cpu_count(),
            "cpu": _cpu_model(),
            "python": platform.python_version(),
            "load_before": self.load_before,
            "load_after": list(os.getloadavg()),
        }
        return _clean(
            {
                "name": self.name,
                "command": self.command,
                "commit": self.commit,
                "machine": machine,
                "peers": self.peers,
                "figures": self.figures,
                "goals": self.goals,
                **({"tables": self.tables} if self.tables else {}),
            }
        )

    def finish(self) -> int:
        """Write the file, print each goal and why the run fails if it does; the exit status."""
        document = self.document()
        self.results_dir.mkdir(parents=True, exist_ok=True)
        path = self.results_dir / f"{self.name}.json"
        partial = path.with_suffix(".json.tmp")
        partial.write_text(json.dumps(document, indent=2, allow_nan=False) + "\n")
        partial.replace(path)
        status, reasons = exit_status(document)
        print(f"\nresults: {path}")
        for goal in document["goals"]:
            print(
                f"  {'met ' if goal['met'] else 'MISSED'} {goal['name']}: {goal['measured']} ({goal['target']})"
            )
        for reason in reasons:
            print(f"FAILED: {reason}", file=sys.stderr)
        return status
