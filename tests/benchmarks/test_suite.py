"""The benchmark suite's runner (`make bench`), over tiny benchmark scripts run as real subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from benchmarks import suite
from benchmarks.results import REPO, git_commit

pytestmark = pytest.mark.process

# A benchmark as benchmarks/results.py shapes one: --quick, --results-dir, a results file, exit status.
FAKE = """
import argparse, json, os, subprocess, sys, time
sys.path.insert(0, {repo!r})
from benchmarks.results import Results, add_results_dir, results_dir

parser = argparse.ArgumentParser()
parser.add_argument("--measured", type=float, default=1.0)
add_results_dir(parser)
args, _ = parser.parse_known_args()
print("hello from", {name!r}, flush=True)
{body}
results = Results({name!r}, results_dir(args))
results.figures["argv"] = sys.argv[1:]
results.goal("ratio", args.measured, ">=", 1.0)
results.goal("errors", 0, "==", 0)
{after}
sys.exit(results.finish())
"""


def _script(folder: Path, name: str, body: str = "", after: str = "") -> suite.Benchmark:
    source = FAKE.format(repo=str(REPO), name=name, body=textwrap.dedent(body), after=textwrap.dedent(after))
    (folder / f"{name}.py").write_text(source)
    return suite.Benchmark(name)


def _run(tmp_path: Path, benchmarks: list[suite.Benchmark], quick: bool = False, limit_s: float = 120):
    return suite.run_suite(
        benchmarks,
        quick,
        scripts=tmp_path,
        results_dir=tmp_path / "results",
        log_dir=tmp_path / "logs",
        limit_s=limit_s,
    )


def test_each_runs_in_turn_a_failure_does_not_stop_the_rest_and_fails_the_suite(tmp_path, capsys):
    benchmarks = [
        suite.Benchmark("missed", ("--measured", "0.5")),
        _script(tmp_path, "writes_nothing", body="sys.exit(0)"),
        suite.Benchmark("passes", ("--measured", "2")),
    ]
    _script(tmp_path, "missed")
    _script(tmp_path, "passes")
    outcomes = _run(tmp_path, benchmarks)
    by_name = {o.name: o for o in outcomes}
    assert [o.name for o in outcomes] == ["missed", "writes_nothing", "passes"]
    missed = by_name["missed"]
    assert (missed.status, missed.goals_met, missed.goals_missed) == (1, 1, 1)
    assert by_name["writes_nothing"].status == 0 and by_name["writes_nothing"].failed
    assert by_name["writes_nothing"].problems == [f"wrote no {tmp_path / 'results' / 'writes_nothing.json'}"]
    assert not by_name["passes"].failed and by_name["passes"].goals_met == 2
    written = json.loads((tmp_path / "results" / "passes.json").read_text())
    assert written["figures"]["argv"][:2] == ["--measured", "2"]
    for name in by_name:  # each one's output in its own log
        assert f"hello from {name}" in (tmp_path / "logs" / f"{name}.log").read_text()

    assert suite.report(outcomes, total_s=3.0, budget_s=None) == 1
    printed = capsys.readouterr().out
    assert "[2/3] writes_nothing: FAILED" in printed
    assert "1 met, 1 missed" in printed and "1 of 3 passed" in printed
    assert "failed: missed, writes_nothing" in printed


def test_quick_passes_quick_instead_of_the_full_arguments(tmp_path):
    _script(tmp_path, "small")
    [outcome] = _run(tmp_path, [suite.Benchmark("small", ("--measured", "3"))], quick=True)
    assert not outcome.failed
    argv = json.loads((tmp_path / "results" / "small.json").read_text())["figures"]["argv"]
    assert "--quick" in argv and "--measured" not in argv


def test_a_passing_suite_exits_zero_and_an_overrun_budget_fails_it(tmp_path, capsys):
    outcomes = _run(tmp_path, [_script(tmp_path, "fine")])
    assert suite.report(outcomes, total_s=5.0, budget_s=600.0) == 0
    assert suite.report(outcomes, total_s=601.0, budget_s=600.0) == 1
    assert "over its 600 s budget" in capsys.readouterr().out


def test_an_overrunning_benchmark_is_killed_with_the_processes_it_started(tmp_path):
    pid_file = tmp_path / "server.pid"
    body = f"""
    server = subprocess.Popen(["sleep", "600"])
    open({str(pid_file)!r}, "w").write(str(server.pid))
    time.sleep(600)
    """
    [outcome] = _run(tmp_path, [_script(tmp_path, "hangs", body=body)], limit_s=3)
    assert outcome.status is None and outcome.problems[0] == "killed after its 3 s limit"
    assert outcome.wall_s < 60
    assert not _running(int(pid_file.read_text()))


def _running(pid: int) -> bool:
    """Alive and not a zombie waiting for its new parent to reap it."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_a_results_file_left_by_an_earlier_run_does_not_count(tmp_path):
    bench = _script(tmp_path, "stale")
    [first] = _run(tmp_path, [bench])
    assert not first.failed
    _script(tmp_path, "stale", body="sys.exit(0)")  # now it writes nothing
    [second] = _run(tmp_path, [bench])
    assert second.problems == [f"wrote no {tmp_path / 'results' / 'stale.json'}"]


def test_a_results_file_of_another_commit_fails(tmp_path):
    after = "results.commit = 'not-this-one'"
    [outcome] = _run(tmp_path, [_script(tmp_path, "foreign", after=after)])
    path, commit = tmp_path / "results" / "foreign.json", git_commit(REPO, tmp_path / "results")
    assert outcome.status == 0
    assert outcome.problems == [f"{path} is from commit not-this-one, not {commit}"]


def test_registry_refuses_a_name_given_twice():
    with pytest.raises(ValueError, match="'a' is registered twice"):
        suite.registry([suite.Benchmark("a"), suite.Benchmark("a")])


def test_list_shows_every_registered_benchmark_with_its_command():
    listed = subprocess.run(
        [sys.executable, "-m", "benchmarks.suite", "--list", "--quick"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for name in suite.BENCHMARKS:
        assert (REPO / "benchmarks" / f"{name}.py").is_file(), f"{name} is registered but has no script"
        assert f".venv/bin/python benchmarks/{name}.py --quick" in listed


def test_an_unknown_name_is_a_one_line_error():
    answer = subprocess.run(
        [sys.executable, "-m", "benchmarks.suite", "--only", "nope"], cwd=REPO, capture_output=True, text=True
    )
    assert answer.returncode == 2 and "invalid choice: 'nope'" in answer.stderr


def test_servers_a_benchmark_leaves_behind_are_stopped_and_fail_it(tmp_path):
    pid_file = tmp_path / "server.pid"
    after = f"""
    server = subprocess.Popen(["sleep", "600"])
    open({str(pid_file)!r}, "w").write(str(server.pid))
    """
    [outcome] = _run(tmp_path, [_script(tmp_path, "leaks", after=after)])
    assert outcome.status == 0 and outcome.problems == ["left processes running (stopped)"]
    assert not _running(int(pid_file.read_text()))
