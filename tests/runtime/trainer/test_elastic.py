"""The elastic actor on real gloo ranks on 127.0.0.1: growing mid-step learns exactly what one process
learns, and a rank lost while joining leaves the step on the ranks it had."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import yaml

from rollflow.runtime.launch.servers import run_rollflow
from tests.runtime.processes import ENV, REPO
from tests.runtime.trainer import elastic_run
from tests.runtime.trainer.parallel_ranks import initial_parameters, parameters
from tests.runtime.trainer.test_distributed import assert_close
from tests.runtime.trainer.test_train_e2e import base_config, engine_versions, rows, train


@pytest.fixture(scope="module")
def elastic(tiny_model, tmp_path_factory):
    """The leader's stderr and output folder after two steps on the elastic actor (elastic_run.py)."""
    out = tmp_path_factory.mktemp("elastic")
    argv = [sys.executable, "-m", "tests.runtime.trainer.elastic_run", str(tiny_model), str(out)]
    result = subprocess.run(argv, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stderr, out


@pytest.fixture(scope="module")
def single(tiny_model, tmp_path_factory):
    """The same steps in one process, without an actor: its final parameters."""
    from rollflow.runtime.trainer.loop import Trainer

    out = tmp_path_factory.mktemp("single")
    torch.manual_seed(0)
    trainer = Trainer(elastic_run.config(str(tiny_model), out, "grpo"), resume=False)
    elastic_run.train(trainer)
    return parameters(trainer)


def moves(elastic) -> dict:
    return json.loads((elastic[1] / "moves.json").read_text())


def test_an_actor_growing_mid_step_and_losing_a_joiner_ends_on_the_single_process_weights(
    elastic, single, tiny_model
):
    before = initial_parameters(str(tiny_model), "grpo")
    assert max((single[k] - before[k]).abs().max().item() for k in single) > 5e-5  # the steps moved them
    assert_close(torch.load(elastic[1] / "parameters.pt"), single)


def test_the_actor_grows_between_mini_batches_and_returns_to_its_base_size_at_step_end(elastic):
    log = moves(elastic)
    assert log["sizes"][0] == [1, 2, 3]  # step 1: one mini-batch on each size
    resized = [(m["step"], m["from_ranks"], m["to_ranks"]) for m in log["moves"]]
    assert resized[:4] == [(1, 1, 2), (1, 2, 3), (1, 3, 1), (2, 1, 2)]
    assert all(m["ok"] and m["seconds"] >= 0 for m in log["moves"][:4])


def test_a_rank_killed_while_joining_leaves_the_step_on_the_ranks_it_had(elastic):
    stderr, _ = elastic
    assert "rank 2 was lost while joining the actor (2 -> 3 ranks): rank 2 died" in stderr
    assert "the mini-batch trains on the 2 rank(s) it has" in stderr
    log = moves(elastic)
    assert log["sizes"][1] == [1, 2, 2]  # step 2 finished on the ranks it had
    failed = [m for m in log["moves"] if not m["ok"]]
    assert [(m["step"], m["requested"], m["to_ranks"]) for m in failed] == [(2, 3, 2)]
    assert failed[0]["reason"].startswith("rank 2 died")


def test_rollflow_train_with_a_cluster_section_trains_on_the_actors_device_slots_fed_by_inference(
    processes, tiny_model, tmp_path
):
    manager = processes.manager(engines=[{"url": processes.engine().url}])
    output = tmp_path / "run"
    placement = {"actor": "0-1", "rollout": "2", "inference": "3"}
    config = base_config(manager, tiny_model, output, cluster={"component_placement": placement})
    result = train(config, tmp_path, "--resume", "never")
    assert "elastic actor: 2 ranks started (cpu, cpu), 2 active at each step start" in result.stderr
    assert "inference: 1 worker(s) started (cpu)" in result.stderr
    assert result.stderr.count("inference: 16 samples processed; devices released") == 2
    assert [int(r["step"]) for r in rows(output)] == [1, 2]
    assert all(int(r["samples"]) == 16 and int(r["tokens"]) > 0 for r in rows(output))
    assert engine_versions(manager) == [2]


def test_a_cluster_whose_actor_does_not_divide_the_mini_batch_is_one_line(tiny_model, tmp_path):
    placement = {"actor": "0-2", "rollout": "3"}
    config = {"model": str(tiny_model), "n_samples": 4, "cluster": {"component_placement": placement}}
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(config))
    result = run_rollflow("train", "--config", str(tmp_path / "train.yaml"))
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "cluster.component_placement.actor: rule 'actor data-parallel size divides the mini-batch'" in line
    assert "do not divide the 16-sample mini-batch" in line


def test_inference_workers_give_the_reference_log_probs_the_trainer_would_compute(
    single, tiny_model, tmp_path
):
    from rollflow.runtime.inference.workers import start_inference
    from rollflow.runtime.trainer.loop import Trainer

    torch.manual_seed(0)
    placement = {"actor": "0", "rollout": "1", "inference": "2-3"}
    config = elastic_run.config(str(tiny_model), tmp_path, "grpo")
    config = config.model_validate({**config.model_dump(), "cluster": {"component_placement": placement}})
    trainer = Trainer(config, resume=False)
    assert trainer.learner.reference is None  # the trainer holds no reference model of its own
    pool = start_inference(trainer, config.cluster)
    try:
        elastic_run.train(trainer)
    finally:
        pool.close()
    assert (
        len(pool.releases) == 2 and pool.step_done
    )  # released once per step, when every sample was processed
    assert pool.samples_done == sum(len(group) for group in elastic_run.STEP_GROUPS[-1])
    assert_close(parameters(trainer), single)


def test_ppo_inference_recomputes_old_policy_log_probs_for_samples_that_version_made(tiny_model, tmp_path):
    from rollflow.runtime.inference.workers import InferencePool, OldPolicy
    from rollflow.runtime.trainer.models import load_policy, load_reference, token_logprobs
    from rollflow.runtime.trainer.rollouts import to_tensors

    old = load_policy(tiny_model)  # the old policy: the model after a made-up step
    with torch.no_grad():
        for param in old.parameters():
            param.add_(0.05 * torch.randn_like(param))
    old.save_pretrained(tmp_path / "v3")
    groups = elastic_run.STEP_GROUPS[0][:3]
    spans = [[{"weight_version": 3 if i % 2 == 0 else 2}] for i in range(sum(len(g) for g in groups))]
    flat = iter(spans)
    groups = [[{**s, "state": "finished", "spans": next(flat)} for s in group] for group in groups]
    config = elastic_run.config(str(tiny_model), tmp_path / "run", "ppo")
    pool = InferencePool.start(config, ("cpu",), threads=1)
    try:
        (annotated,) = list(
            pool.stream(iter([groups]), pad_id=0, old_policy=OldPolicy(str(tmp_path / "v3"), 3))
        )
    finally:
        pool.close()
    rollout = to_tensors(groups, pad_id=0)
    with torch.no_grad():
        expected = {
            name: token_logprobs(model, rollout.input_ids, rollout.attention_mask, config.temperature)
            for name, model in (("ref", load_reference(tiny_model)), ("old", old))
        }
    samples = [s for group in annotated for s in group]
    for row, sample in enumerate(samples):
        start, end = len(sample["prompt_ids"]) - 1, len(sample["prompt_ids"]) + len(sample["output_ids"]) - 1
        torch.testing.assert_close(torch.tensor(sample["ref_logprobs"]), expected["ref"][row, start:end])
        if sample["spans"][0]["weight_version"] == 3:
            torch.testing.assert_close(torch.tensor(sample["old_logprobs"]), expected["old"][row, start:end])
            assert not torch.allclose(expected["old"][row, start:end], expected["ref"][row, start:end])
        else:  # made by another version: the engine's recorded log-probs stay the old ones
            assert "old_logprobs" not in sample
    assert pool.step_done and pool.samples_done == len(samples)
