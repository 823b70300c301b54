"""`rollflow train` as a user runs it: a manager, two built-in engines, the tiny model, a few steps."""

import csv
import json
import subprocess

import yaml

from rollflow.runtime.launch.servers import run_rollflow
from tests.runtime.processes import ENV, http


def train(config: dict, tmp_path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    result = run_rollflow("train", "--config", str(path), *args, env=ENV | (env or {}))
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def rows(output_dir) -> list[dict]:
    with open(output_dir / "metrics.csv") as file:
        return list(csv.DictReader(file))


def engine_versions(manager) -> list[int]:
    _, answer = http("GET", manager.url + "/workers")
    return [w["weight_version"] for w in answer["workers"]]


def base_config(manager, tiny_model, output_dir, **changes) -> dict:
    config = {
        "manager_url": manager.url,
        "model": str(tiny_model),
        "n_samples": 4,
        "prompts_per_step": 4,
        "micro_batch_groups": 2,
        "mini_batch_micro_batches": 1,
        "max_new_tokens": 8,
        "lr": 0.0005,
        "steps": 2,
        "output_dir": str(output_dir),
    }
    return {**config, **changes}


def test_grpo_steps_push_weights_to_every_engine_and_resume_auto_continues_never_restarts(
    processes, tiny_model, tmp_path
):
    engines = [processes.engine() for _ in range(2)]
    manager = processes.manager(engines=[{"url": e.url} for e in engines])
    output = tmp_path / "run"
    config = base_config(manager, tiny_model, output)

    train(config, tmp_path)
    first = rows(output)
    assert [int(r["step"]) for r in first] == [1, 2]
    assert all(int(r["samples"]) == 16 and int(r["tokens"]) > 0 for r in first)
    assert all(float(r["kl"]) >= 0 and float(r["entropy"]) > 0 for r in first)
    assert engine_versions(manager) == [2, 2]
    assert (output / "checkpoints" / "step_2" / "optimizer.pt").is_file()
    assert (output / "weights" / "v2" / "config.json").is_file()
    # the trainer's phases, traced under the RL simulator's names; the CSV's seconds are their sums
    trace = json.loads((output / "chrome_trace.json").read_text())["traceEvents"]
    spans = [e for e in trace if e["ph"] == "X"]
    assert {(e["args"]["step"], e["cat"]) for e in spans} == {
        (step, phase) for step in (1, 2) for phase in ("rollout", "training", "sync")
    }
    for row in first:
        for phase, column in (
            ("rollout", "rollout_wait_s"),
            ("training", "train_s"),
            ("sync", "update_weights_s"),
        ):
            seconds = sum(
                e["dur"] for e in spans if e["cat"] == phase and e["args"]["step"] == int(row["step"])
            )
            assert abs(seconds / 1e6 - float(row[column])) < 1e-5

    resumed = train({**config, "steps": 3}, tmp_path, "--resume", "auto")
    assert "resumed from" in resumed.stderr and "step 2" in resumed.stderr
    assert [int(r["step"]) for r in rows(output)] == [1, 2, 3]
    assert engine_versions(manager) == [3, 3]
    # every sample of step 3 was generated on version 2, the one the resumed trainer started from
    assert int(rows(output)[-1]["samples_rejected_stale"]) == 0

    # --resume never starts from `model` again: the engines (on version 3) are first put back on
    # version 0, so the fresh step's samples are all current, none rejected as stale
    train({**config, "steps": 1}, tmp_path, "--resume", "never")
    (fresh,) = rows(output)
    assert fresh["step"] == "1" and fresh["samples"] == "16" and fresh["samples_rejected_stale"] == "0"
    assert engine_versions(manager) == [1, 1]
    assert not (output / "checkpoints" / "step_3").exists()


def test_ppo_off_policy_rejects_samples_beyond_the_staleness_bound(processes, tiny_model, tmp_path):
    engines = [processes.engine() for _ in range(2)]
    manager = processes.manager(engines=[{"url": e.url} for e in engines])
    output = tmp_path / "run"
    # Step 2's batch is submitted before step 1 trains, so its tokens come from version 0 (and maybe 1);
    # with a bound of 0 the trainer at version 1 must reject those made on version 0.
    config = base_config(manager, tiny_model, output, algorithm="ppo", off_policy=True, max_staleness=0)
    train(config, tmp_path, "--resume", "never")
    step1, step2 = rows(output)
    assert int(step1["samples"]) == 16 and int(step1["samples_rejected_stale"]) == 0
    assert int(step2["samples_rejected_stale"]) > 0
    assert int(step2["samples"]) + int(step2["samples_rejected_stale"]) == 16
    assert float(step1["value_loss"]) > 0
    assert engine_versions(manager) == [2, 2]
    assert (output / "checkpoints" / "step_2" / "critic.pt").is_file()


def test_with_weights_url_each_version_is_published_and_the_engine_pulls_it(processes, tiny_model, tmp_path):
    from rollflow.runtime.weights import WeightStore
    from rollflow.runtime.weights.checkpoint import published_versions
    from tests.runtime.launch.helpers import BackgroundWeightServer

    engine = processes.engine()
    manager = processes.manager(engines=[{"url": engine.url, "engine_type": "builtin"}])
    server = BackgroundWeightServer(WeightStore(tmp_path / "store"), token="publish-secret")
    try:
        output = tmp_path / "run"
        config = base_config(manager, tiny_model, output, weights_url=server.url)
        train(config, tmp_path, env={"ROLLFLOW_WEIGHTS_TOKEN": "publish-secret"})
        versions = published_versions(server.url)
    finally:
        server.close()
    assert [int(r["step"]) for r in rows(output)] == [1, 2]
    assert all(int(r["samples"]) == 16 for r in rows(output))
    # version 0 is published at start (the engine already serves it), then each step's version
    assert versions == (0, 1, 2)
    assert engine_versions(manager) == [2]
    assert http("GET", engine.url + "/get_weight_version")[1]["weight_version"] == 2
    assert "weight pull attempt" not in engine.log()
    # the engine asked for version 2 as a delta against the version 1 it had pulled
    assert (tmp_path / "store" / "payloads" / "v2-delta-zstd-from1").is_dir()


def test_with_weights_transport_mooncake_engines_read_each_version_over_mooncake(
    processes, tiny_model, tmp_path
):
    from rollflow.runtime.weights.checkpoint import published_versions
    from tests.runtime.weights.factories import start_server_process

    engine = processes.engine()
    manager = processes.manager(engines=[{"url": engine.url, "engine_type": "builtin"}])
    token = {"ROLLFLOW_WEIGHTS_TOKEN": "publish-secret"}
    server, url = start_server_process(tmp_path / "store", "--mooncake", "tcp", env=ENV | token)
    try:
        output = tmp_path / "run"
        config = base_config(manager, tiny_model, output, weights_url=url, weights_transport="mooncake")
        train(config, tmp_path, env=token)
        versions = published_versions(url)
    finally:
        server.kill()
        server.wait()
    assert [int(r["step"]) for r in rows(output)] == [1, 2]
    assert all(int(r["samples"]) == 16 and int(r["samples_rejected_stale"]) == 0 for r in rows(output))
    assert versions == (0, 1, 2) and engine_versions(manager) == [2]
    # version 1 in full (the engine started from the model folder), version 2 as a delta, both read over Mooncake
    served = (tmp_path / "store").parent.glob("serve-*.log")
    exported = [
        line for log in served for line in log.read_text().splitlines() if "in mooncake memory" in line
    ]
    assert len(exported) == 2 and "v2-delta-zstd-from1" in exported[1], exported
    engine_log = engine.log_path.read_text()
    assert "weight pull attempt" not in engine_log and "pulling over http" not in engine_log
