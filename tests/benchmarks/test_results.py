"""The results file a benchmark writes, and the exit status that fails a run that missed."""

from __future__ import annotations

import argparse
import json
import math
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.results import (
    REPO,
    Results,
    exit_status,
    fill_inputs,
    git_commit,
    goal_met,
    repo_relative,
)

KEYS = ["name", "command", "commit", "machine", "peers", "figures", "goals"]


def test_file_holds_the_keys_and_what_was_recorded(tmp_path: Path) -> None:
    results = Results("demo", tmp_path)
    results.peers["sglang-router"] = "0.3.1"
    results.figures["rps"] = {"manager": 1234.56789, "nan": math.nan}
    results.goal("throughput ratio", measured=1.2, op=">=", target=1.0)
    assert results.finish() == 0
    document = json.loads((tmp_path / "demo.json").read_text())
    assert list(document) == KEYS
    assert document["name"] == "demo"
    assert document["command"] == shlex.join(repo_relative(arg) for arg in sys.orig_argv)
    assert document["peers"] == {"sglang-router": "0.3.1"}
    assert document["figures"] == {"rps": {"manager": 1234.57, "nan": None}}
    assert document["goals"] == [{"name": "throughput ratio", "target": ">= 1", "measured": 1.2, "met": True}]
    machine = document["machine"]
    assert machine["cores"] >= 1
    assert len(machine["load_before"]) == len(machine["load_after"]) == 3
    assert not list(tmp_path.glob("*.tmp"))


def test_command_is_the_argv_as_run(tmp_path: Path) -> None:
    script = "import sys, pathlib, benchmarks.results as r; sys.exit(r.Results('x', pathlib.Path(sys.argv[1])).finish())"
    argv = [sys.executable, "-c", script, str(tmp_path), "two words"]
    subprocess.run(argv, cwd=REPO, check=True, capture_output=True)
    command = json.loads((tmp_path / "x.json").read_text())["command"]
    assert command.endswith(f"{tmp_path} 'two words'")
    assert "-c" in command


def test_command_names_paths_in_the_repository_as_a_checkout_reruns_them() -> None:
    """The suite starts a benchmark by its absolute path; its results file names it from the checkout."""
    assert repo_relative(f"{REPO}/benchmarks/stream_relay.py") == "benchmarks/stream_relay.py"
    assert repo_relative(f"{REPO}/.venv/bin/python") == ".venv/bin/python"
    assert repo_relative(f"{REPO}x/elsewhere.py") == f"{REPO}x/elsewhere.py"  # a sibling, not inside
    assert repo_relative("--quick") == "--quick"


def test_missed_goal_fails_the_run(tmp_path: Path) -> None:
    results = Results("demo", tmp_path)
    results.goal("regenerated tokens", measured=3, op="==", target=0)
    results.goal("throughput ratio", measured=1.2, op=">=", target=1.0)
    assert results.finish() == 1
    document = json.loads((tmp_path / "demo.json").read_text())
    assert [g["met"] for g in document["goals"]] == [False, True]
    status, reasons = exit_status(document)
    assert status == 1 and reasons == ["goal missed: regenerated tokens: measured 3, target == 0"]


def test_peer_that_did_not_run_fails_the_run(tmp_path: Path) -> None:
    results = Results("demo", tmp_path)
    results.peers["sglang-router"] = None
    results.goal("ratio", measured=1.0, op="<=", target=1.5)
    assert results.finish() == 1
    assert json.loads((tmp_path / "demo.json").read_text())["peers"] == {"sglang-router": None}


@pytest.mark.parametrize("measured", [None, math.nan, math.inf])
def test_missing_measurement_misses(tmp_path: Path, measured: float | None) -> None:
    results = Results("demo", tmp_path)
    assert not results.goal("ratio", measured=measured, op="<=", target=1.5)
    assert results.finish() == 1


def test_exit_rule_judges_met_again() -> None:
    """A file whose `met` says true for a measurement that misses its target still fails."""
    document = {"peers": {}, "goals": [{"name": "g", "target": "< 100", "measured": 140.0, "met": True}]}
    assert exit_status(document)[0] == 1
    assert exit_status({"peers": {"vidur": "abc123"}, "goals": []}) == (0, [])


@pytest.mark.parametrize(
    ("target", "measured", "met"),
    [
        ("<= 1.5", 1.5, True),
        ("< 1.5", 1.5, False),
        (">= 0.9", 0.89, False),
        ("== 0", 0, True),
        ("> 1", 2, True),
    ],
)
def test_goal_met(target: str, measured: float, met: bool) -> None:
    assert goal_met(target, measured) is met


@pytest.mark.parametrize("target", ["1.5", "=< 1.5", "<= fast", "<=1.5"])
def test_bad_target_names_what_is_wrong(target: str) -> None:
    with pytest.raises(ValueError, match="goal target"):
        goal_met(target, 1.0)


def test_dirty_tree_is_marked_and_results_do_not_count(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "a.py").write_text("x = 1\n")
    subprocess.run([*git, "add", "a.py"], check=True)
    subprocess.run([*git, "commit", "-qm", "a"], check=True)
    results_dir = repo / "benchmarks" / "results"
    results_dir.mkdir(parents=True)
    (results_dir / "demo.json").write_text("{}")
    head = git_commit(repo, results_dir)
    assert len(head) == 40 and "+dirty" not in head
    (repo / "a.py").write_text("x = 2\n")
    assert git_commit(repo, results_dir) == head + "+dirty"
    assert git_commit(tmp_path / "nowhere", results_dir).startswith("unknown")


@pytest.mark.parametrize("quick", [False, True])
def test_inputs_left_out_come_from_the_run_size_and_given_ones_win(quick: bool) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--requests", type=int)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(["--requests", "7", *(["--quick"] if quick else [])])
    full = {"rounds": 5, "requests": 400, "samples": 8}  # samples: an input with no option
    fill_inputs(args, full, full | {"rounds": 2, "samples": 4})
    assert (args.rounds, args.requests, args.samples) == ((2, 7, 4) if quick else (5, 7, 8))
