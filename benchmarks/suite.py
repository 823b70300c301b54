"""Every benchmark behind a figure in the docs, run one at a time: `make bench` and `make bench-quick`.

    .venv/bin/python -m benchmarks.suite                 # full runs: benchmarks/results/<name>.json
    .venv/bin/python -m benchmarks.suite --quick         # smaller inputs: benchmarks/results/quick/
    .venv/bin/python -m benchmarks.suite --only hostile_inputs manager_journal
    .venv/bin/python -m benchmarks.suite --list          # the registry: name, command, what it measures

One at a time, because most of them time something and two at once would skew each other. Each
one's output goes to outputs/bench/<name>.log; a benchmark that fails does not stop the rest. The
suite ends with a table and exits non-zero when any benchmark exited non-zero, overran its time
limit (it is stopped with every process it started), left processes running, wrote no results
file, or wrote one from another commit than the one checked out; a quick suite also fails when it
took longer than its budget (10 minutes).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.results import DEFAULT_DIR, QUICK_DIR, REPO, git_commit, goal_met

LOG_DIR = REPO / "outputs" / "bench"
QUICK_LIMIT_S = 120.0  # one benchmark's --quick run; its owner sizes --quick to stay well under it
FULL_LIMIT_S = 1800.0  # one benchmark's full run
QUICK_BUDGET_S = 600.0  # the whole quick suite: `make bench-quick` is a check that takes minutes
KILL_GRACE_S = 10.0  # after SIGTERM to an overrunning benchmark's process group, before SIGKILL


@dataclass(frozen=True)
class Benchmark:
    name: str  # benchmarks/<name>.py, which writes <results dir>/<name>.json
    args: tuple[str, ...] = ()  # the full run's arguments (--quick is added for a quick run)
    full_limit_s: float = FULL_LIMIT_S  # longer only for a benchmark whose full run needs it
    quick_limit_s: float = QUICK_LIMIT_S  # longer only for one whose peer alone takes minutes to start


def registry(benchmarks: Iterable[Benchmark]) -> dict[str, Benchmark]:
    """Name -> benchmark, in run order; a name given twice is an error, not a silent overwrite."""
    found: dict[str, Benchmark] = {}
    for bench in benchmarks:
        if bench.name in found:
            raise ValueError(f"benchmark {bench.name!r} is registered twice")
        found[bench.name] = bench
    return found


# Every benchmark that backs a figure in README.md or docs/ (benchmarks/canned_engine.py is an engine
# the manager's benchmarks start, benchmarks/results.py the results file they write). Simulator
# benchmarks first: they need nothing but the CPU; then the live ones, which start servers.
BENCHMARKS = registry(
    [
        Benchmark("vidur_compare", quick_limit_s=240.0),  # a fresh machine sets Vidur up first
        Benchmark("search_vs_vidur", quick_limit_s=240.0),  # Vidur's search: ~10 processes of 8-10 s
        Benchmark("search_scale"),
        Benchmark("peak_memory"),
        Benchmark("real_engine_fidelity", quick_limit_s=240.0),  # a vLLM server starts in about a minute
        Benchmark("rl_paper_claims"),
        Benchmark("rl_step_scale"),
        Benchmark("rl_search_scale"),
        Benchmark("router_decision_latency", ("examples/router/heterogeneous.policy.npz",)),
        Benchmark("ppo_vs_sb3", quick_limit_s=180.0),
        Benchmark("manager_overhead"),
        Benchmark("stream_relay"),
        Benchmark("vllm_router"),
        Benchmark("manager_journal"),
        Benchmark("hostile_inputs"),
        Benchmark("dynamic_live", quick_limit_s=180.0),
        Benchmark("prefix_routing"),
        Benchmark("weight_transfer"),
    ]
)


@dataclass
class Outcome:
    """What one benchmark's run came to, as the final table shows it."""

    name: str
    status: int | None = None  # the exit status; None when it was killed for overrunning
    wall_s: float = 0.0
    goals_met: int | None = None  # None: no results file to count them in
    goals_missed: int | None = None
    problems: list[str] = field(default_factory=list)  # why the run fails, besides its exit status

    @property
    def failed(self) -> bool:
        return self.status != 0 or bool(self.problems)


def command(bench: Benchmark, quick: bool, scripts: Path, results_dir: Path | None) -> list[str]:
    """The benchmark's command line: its full-run arguments, or `--quick` for a quick run."""
    argv = [sys.executable, str(scripts / f"{bench.name}.py"), *(("--quick",) if quick else bench.args)]
    if results_dir is not None:
        argv += ["--results-dir", str(results_dir)]
    return argv


def run_one(
    bench: Benchmark,
    argv: list[str],
    log_path: Path,
    results_path: Path,
    limit_s: float,
    commit: str,
) -> Outcome:
    """Run one benchmark in a process group of its own (so an overrun is killed with its servers),
    its output to `log_path`, and judge the results file it wrote."""
    outcome = Outcome(bench.name)
    before = _identity(results_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with log_path.open("w") as log:
        log.write(f"$ {shlex.join(argv)}\n")
        log.flush()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen(
            argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            outcome.status = proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            outcome.problems.append(f"killed after its {limit_s:g} s limit")
        finally:
            if proc.returncode is None or _group_alive(proc.pid):  # overrun, Ctrl-C, or servers left behind
                if proc.returncode is not None:  # they would skew the next benchmark's timings
                    outcome.problems.append("left processes running (stopped)")
                _stop_group(proc)
    outcome.wall_s = time.monotonic() - started
    _judge_results(outcome, results_path, before, commit)
    return outcome


def _identity(path: Path) -> tuple[int, int] | None:
    """(inode, mtime) of a file, to tell a results file this run wrote from one left by an earlier run
    (benchmarks/results.py writes a new file and renames it over the old one)."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_ino, stat.st_mtime_ns


def _group_alive(pgid: int) -> bool:
    """Whether a live process (not a zombie) is still in the process group."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[2] == str(pgid) and fields[0] != "Z":  # fields: state, ppid, pgrp, ...
            return True
    return False


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the benchmark's process group, SIGKILL to what is left after a grace period."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + KILL_GRACE_S
        while _group_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)  # no event says a group's last member has gone: look in /proc
        if not _group_alive(proc.pid):
            break
    proc.wait()


def _judge_results(outcome: Outcome, path: Path, before: tuple[int, int] | None, commit: str) -> None:
    """Count the goals of the file the run wrote; a missing, stale or foreign file is a problem."""
    if _identity(path) is None or _identity(path) == before:
        outcome.problems.append(f"wrote no {_shown(path)}")
        return
    try:
        document: dict[str, Any] = json.loads(path.read_text())
        goals = document["goals"]
        outcome.goals_met = sum(goal_met(goal["target"], goal["measured"]) for goal in goals)
    except (ValueError, KeyError, TypeError) as exc:
        outcome.problems.append(f"{_shown(path)} is not a results file ({exc!r})")
        return
    outcome.goals_missed = len(goals) - outcome.goals_met
    if document.get("commit") != commit:
        outcome.problems.append(f"{_shown(path)} is from commit {document.get('commit')}, not {commit}")
    if not goals:
        outcome.problems.append(f"{_shown(path)} states no goal")


def _shown(path: Path) -> str:
    """A path as the user typed it: relative to the repository when it is inside it."""
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def run_suite(
    benchmarks: Sequence[Benchmark],
    quick: bool,
    scripts: Path = REPO / "benchmarks",
    results_dir: Path | None = None,
    log_dir: Path = LOG_DIR,
    limit_s: float | None = None,
) -> list[Outcome]:
    """Run `benchmarks` one after another, printing a line as each starts and ends."""
    written_to = results_dir or (QUICK_DIR if quick else DEFAULT_DIR)
    outcomes = []
    for index, bench in enumerate(benchmarks, 1):
        argv = command(bench, quick, scripts, results_dir)
        log_path = log_dir / f"{bench.name}.log"
        limit = limit_s or (bench.quick_limit_s if quick else bench.full_limit_s)
        print(f"[{index}/{len(benchmarks)}] {bench.name}: running, output in {_shown(log_path)}", flush=True)
        # The benchmark computes its commit the same way when it starts; asked here just before, so a
        # file another benchmark left in the tree (a model folder, say) does not count against this one.
        commit = git_commit(REPO, written_to)
        outcome = run_one(bench, argv, log_path, written_to / f"{bench.name}.json", limit, commit)
        outcomes.append(outcome)
        print(f"[{index}/{len(benchmarks)}] {bench.name}: {_summary(outcome)}", flush=True)
    return outcomes


def _goals(outcome: Outcome) -> str:
    if outcome.goals_met is None:
        return "-"
    missed = f", {outcome.goals_missed} missed" if outcome.goals_missed else ""
    return f"{outcome.goals_met} met{missed}"


def _status(outcome: Outcome) -> str:
    return "killed" if outcome.status is None else str(outcome.status)


def _summary(outcome: Outcome) -> str:
    verdict = "FAILED" if outcome.failed else "ok"
    said = [f"{verdict} in {outcome.wall_s:.1f} s", f"exit {_status(outcome)}", f"goals {_goals(outcome)}"]
    return ", ".join(said + outcome.problems)


def report(outcomes: Sequence[Outcome], total_s: float, budget_s: float | None) -> int:
    """Print the table of outcomes; the suite's exit status (1 when any failed or the budget ran out)."""
    rows = [("benchmark", "goals", "exit", "wall time", "")]
    rows += [(o.name, _goals(o), _status(o), f"{o.wall_s:.1f} s", "; ".join(o.problems)) for o in outcomes]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    print()
    for row in rows:
        print(
            (
                "  ".join(cell.ljust(width) for cell, width in zip(row[:4], widths, strict=True))
                + "  "
                + row[4]
            ).rstrip()
        )
    failed = [o.name for o in outcomes if o.failed]
    print(f"\n{len(outcomes) - len(failed)} of {len(outcomes)} passed in {total_s:.0f} s", end="")
    print(f"; failed: {', '.join(failed)}" if failed else "")
    over_budget = budget_s is not None and total_s > budget_s
    if over_budget:
        print(f"FAILED: the quick suite took {total_s:.0f} s, over its {budget_s:.0f} s budget")
    return 1 if failed or over_budget else 0


def summary_line(name: str, scripts: Path = REPO / "benchmarks") -> str:
    """The first line of a benchmark script's docstring (what it measures)."""
    doc = ast.get_docstring(ast.parse((scripts / f"{name}.py").read_text())) or ""
    return doc.split("\n\n")[0].replace("\n", " ")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.suite",
        description="Run every benchmark behind a figure in the docs, one at a time, and say which failed. "
        "Each writes benchmarks/results/<name>.json (with --quick: benchmarks/results/quick/, not "
        "committed) and its output to outputs/bench/<name>.log.",
        epilog="Exit status 1 when any benchmark exited non-zero (a missed goal, a peer that did not run), "
        "overran its time limit, or wrote no results file of the current commit; with --quick also when "
        f"the suite took more than {QUICK_BUDGET_S:.0f} s. make bench and make bench-quick run it.",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"pass --quick to each benchmark (smaller inputs; a limit of {QUICK_LIMIT_S:.0f} s each, more for a few, "
        f"{QUICK_BUDGET_S:.0f} s for the suite)",
    )
    parser.add_argument(
        "--only",
        nargs="+",
        metavar="NAME",
        choices=list(BENCHMARKS),
        help="run these benchmarks only, in the suite's order (names as --list shows them)",
    )
    parser.add_argument(
        "--list", action="store_true", help="list the benchmarks and their commands, run nothing"
    )
    parser.add_argument(
        "--limit-s",
        type=float,
        default=None,
        help=f"time limit per benchmark in seconds (default {QUICK_LIMIT_S:.0f} with --quick, more for a few, "
        f"{FULL_LIMIT_S:.0f} otherwise); one that overruns is killed and fails",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    chosen = [bench for name, bench in BENCHMARKS.items() if not args.only or name in args.only]
    if args.list:
        for bench in chosen:
            shown = command(bench, args.quick, REPO / "benchmarks", None)
            print(f"{bench.name}\n    {shlex.join(['.venv/bin/python', *map(_relative, shown[1:])])}")
            print(f"    {summary_line(bench.name)}")
        return 0
    started = time.monotonic()
    outcomes = run_suite(chosen, args.quick, limit_s=args.limit_s)
    return report(outcomes, time.monotonic() - started, QUICK_BUDGET_S if args.quick else None)


def _relative(arg: str) -> str:
    return _shown(Path(arg)) if arg.startswith(str(REPO)) else arg


if __name__ == "__main__":
    sys.exit(main())
