"""`rollflow launch --help`'s first example runs as written in a fresh folder holding only the
shipped config: the help names the model it needs, and the config starts the weight server its
spot pool pulls from (a newcomer once needed one only the YAML's comment mentioned)."""

from __future__ import annotations

import shlex
import shutil
import signal
import subprocess
import time

from rollflow.runtime.launch.servers import run_rollflow
from tests.runtime.processes import ENV, REPO, http, rollflow


def _help_examples() -> list[list[str]]:
    """The command lines under `examples:` of `rollflow launch --help`, comments dropped."""
    text = run_rollflow("launch", "--help").stdout
    lines = text.split("examples:\n", 1)[1].splitlines()
    return [shlex.split(line, comments=True) for line in lines if line.strip().startswith("rollflow ")]


def _ctrl_c_as_in_a_terminal() -> None:
    """SIGINT at its default in the launcher, as a terminal's Ctrl-C finds it. A shell starts a
    background job (`make test &`, a CI runner's script) with SIGINT ignored, every process below
    inherits that, and Python then never turns SIGINT into KeyboardInterrupt: `launch up` ignored
    the test's Ctrl-C and this test hung whenever the run was started that way."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_the_first_example_of_launch_help_runs_as_written(tmp_path):
    (tmp_path / "examples" / "launch").mkdir(parents=True)
    shutil.copy(REPO / "examples" / "launch" / "local.yaml", tmp_path / "examples" / "launch")
    examples = _help_examples()
    init_model, launch_up = examples[0], examples[1]
    assert init_model[:3] == ["rollflow", "engine", "init-model"] and launch_up[:3] == [
        "rollflow",
        "launch",
        "up",
    ]
    made = run_rollflow(*init_model[1:], cwd=tmp_path, timeout=300)
    assert made.returncode == 0, made.stderr
    log_path = tmp_path / "launcher.out"
    with open(log_path, "wb") as log:
        # the one change: the example's manager port 30100 may be taken on a machine running tests
        launcher = subprocess.Popen(
            rollflow(*launch_up[1:], "launch.manager.port=0"),
            cwd=tmp_path,
            env={**ENV, "PYTHONFAULTHANDLER": "1"},  # SIGABRT prints every thread's stack into the log
            stdout=log,
            stderr=log,
            preexec_fn=_ctrl_c_as_in_a_terminal,
        )
    try:
        deadline = time.monotonic() + 300
        while b"engines registered" not in log_path.read_bytes():
            assert launcher.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.2)
        line = next(x for x in log_path.read_text().splitlines() if "engines registered" in x)
        workers = http("GET", line.split()[2].rstrip(";") + "/workers")[1]["workers"]
        # two reserved engines on models/tiny, one spot engine on the version the launch published
        assert sorted((w["kind"], w["weight_version"]) for w in workers) == [
            ("local", 0),
            ("local", 0),
            ("spot", 0),
        ]
        launcher.send_signal(signal.SIGINT)  # Ctrl-C: the launch stops what it started
        try:
            code = launcher.wait(timeout=120)
        except subprocess.TimeoutExpired:  # leave where it hangs in the failure
            launcher.send_signal(signal.SIGABRT)
            launcher.wait(timeout=30)
            raise AssertionError(
                f"launch up still running 120 s after SIGINT:\n{log_path.read_text()}"
            ) from None
        assert code == 130, log_path.read_text()
    finally:
        if launcher.poll() is None:
            launcher.kill()
