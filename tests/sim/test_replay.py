"""`rollflow sim replay --from-manager-log`: a manager's request log through the simulator."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from rollflow.runtime.launch.process import rollflow_command
from rollflow.sim.replay import ManagerLogError, read_manager_log, replay_manager_log
from tests.factories import REPO, make_config


def log_line(arrived: float, first: float, finished: float, prompt: int, output: int, **extra) -> str:
    entry = {
        "version": 1,
        "sample_id": f"s{arrived}",
        "batch_id": None,
        "state": "finished",
        "finish_reason": "length",
        "arrived_at": arrived,
        "first_token_at": first,
        "finished_at": finished,
        "prompt_tokens": prompt,
        "output_tokens": output,
        "attempts": 1,
        "resumes": 0,
        "spans": [{"engine_url": "http://127.0.0.1:1", "engine_id": 0, "start": 0, "end": output}],
    }
    return json.dumps({**entry, **extra})


def config():
    return make_config(cluster={"model": "meta-llama/Llama-2-7b-hf", "device": "a100"})


def test_a_log_of_the_simulators_own_latencies_replays_with_no_difference(tmp_path):
    # Replay arrivals once, write a log whose recorded times are what the simulator gave, replay
    # that: the recorded latencies must be measured exactly as the simulator measures its own.
    arrivals = [(1000.0, 300, 20), (1000.4, 1200, 50), (1000.5, 40, 5), (1003.0, 800, 80)]
    first = tmp_path / "first.jsonl"
    first.write_text("".join(log_line(a, a + 1, a + 2, p, o) + "\n" for a, p, o in arrivals))
    from rollflow.sim.metrics import request_table
    from rollflow.sim.replay import sim_requests
    from rollflow.sim.simulator import ServingSimulator

    requests, _ = read_manager_log(first)
    table = request_table(ServingSimulator(config(), sim_requests(requests)).run()).columns
    second = tmp_path / "second.jsonl"
    second.write_text(
        "".join(
            log_line(1000.0 + arr, 1000.0 + first_at, 1000.0 + done, int(p), int(o)) + "\n"
            for arr, first_at, done, p, o in zip(
                table["arrived_at"],
                table["first_token_at"],
                table["completed_at"],
                table["prompt_tokens"],
                table["output_tokens"],
                strict=True,
            )
        )
    )
    report = replay_manager_log(config(), second)
    assert report["num_requests"] == 4
    for metric in ("ttft", "tpot", "e2e"):
        for q in ("p50", "p90"):
            cell = report["metrics"][metric][q]
            assert cell["recorded"] > 0
            assert cell["simulated"] == pytest.approx(cell["recorded"], rel=1e-6)
            assert abs(cell["diff_pct"]) < 1e-4


def test_failed_and_tokenless_samples_are_skipped_and_arrivals_are_offsets(tmp_path):
    log = tmp_path / "log.jsonl"
    log.write_text(
        "\n".join(
            [
                log_line(50.0, 50.5, 51.0, 10, 4),
                log_line(49.0, None, 60.0, 10, 0, state="failed"),
                log_line(52.0, None, 52.1, 10, 0),
                log_line(51.0, 51.2, 52.0, 10, 3),
            ]
        )
    )
    requests, skipped = read_manager_log(log)
    assert skipped == 2
    from rollflow.sim.replay import sim_requests

    assert [(r.arrived_at, r.output_tokens) for r in sim_requests(requests)] == [(0.0, 4), (1.0, 3)]


def test_a_line_that_is_not_a_log_entry_is_an_error_naming_file_and_line(tmp_path):
    log = tmp_path / "log.jsonl"
    log.write_text(log_line(1.0, 1.1, 1.2, 5, 2) + "\n{not json\n")
    with pytest.raises(ManagerLogError, match=r"log.jsonl:2: not a manager request-log line"):
        read_manager_log(log)
    log.write_text(log_line(1.0, None, 1.2, 5, 0, state="failed") + "\n")
    with pytest.raises(ManagerLogError, match="no finished sample to replay"):
        read_manager_log(log)


@pytest.mark.process  # runs the CLI as a subprocess (left out of `make test-fast`)
def test_the_command_prints_both_and_writes_replay_json(tmp_path):
    log = tmp_path / "log.jsonl"
    log.write_text("".join(log_line(float(i), i + 0.3, i + 1.5, 200, 30) + "\n" for i in range(6)))
    sim_yaml = tmp_path / "sim.yaml"
    sim_yaml.write_text(json.dumps({"output": {"progress": False}}))
    env_cmd = rollflow_command("sim", "replay", "--from-manager-log", str(log))
    proc = subprocess.run(
        [*env_cmd, "--config", str(sim_yaml), "--output-dir", str(tmp_path / "out"), "cluster.replicas=2"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert "replayed 6 finished samples" in proc.stdout and "simulated on 2 replica(s)" in proc.stdout
    assert "| ttft (s) | 0.3000 |" in proc.stdout and "| e2e (s) | 1.5000 |" in proc.stdout
    report = json.loads((tmp_path / "out" / "replay.json").read_text())
    assert report["metrics"]["tpot"]["p50"]["recorded"] == pytest.approx(1.2 / 30)
    assert report["metrics"]["tpot"]["p50"]["simulated"] > 0

    proc = subprocess.run(
        [*env_cmd[:-1], str(tmp_path / "missing.jsonl"), "--config", str(sim_yaml)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("rollflow: --from-manager-log: cannot read")
