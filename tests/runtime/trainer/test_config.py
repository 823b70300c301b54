"""Where the trainer finds the manager and the weight server when a launcher started it."""

from __future__ import annotations

from rollflow.runtime.trainer.config import DEFAULT_MANAGER_URL, TrainConfig


def test_manager_and_weight_server_come_from_the_launchers_environment(monkeypatch):
    monkeypatch.setenv("ROLLFLOW_MANAGER_URL", "http://127.0.0.1:4100")
    monkeypatch.setenv("ROLLFLOW_WEIGHTS_URL", "http://127.0.0.1:4200")
    config = TrainConfig(model="m")
    assert (config.manager_url, config.weights_url) == ("http://127.0.0.1:4100", "http://127.0.0.1:4200")
    # the config file wins over the environment
    assert TrainConfig(model="m", manager_url="http://127.0.0.1:1").manager_url == "http://127.0.0.1:1"


def test_without_a_launcher_the_defaults_are_the_local_manager_and_disk_weights(monkeypatch):
    monkeypatch.delenv("ROLLFLOW_MANAGER_URL", raising=False)
    monkeypatch.delenv("ROLLFLOW_WEIGHTS_URL", raising=False)
    config = TrainConfig(model="m")
    assert (config.manager_url, config.weights_url) == (DEFAULT_MANAGER_URL, None)


def test_a_step_of_5_prompts_in_micro_batches_of_2_groups_two_per_mini_batch_takes_2_optimizer_steps():
    config = TrainConfig(
        model="m", prompts_per_step=5, micro_batch_groups=2, mini_batch_micro_batches=2, n_samples=4
    )
    assert (config.minibatches_per_step, config.minibatch_samples) == (2, 16)
