import numpy as np
import pytest
import torch

from rollflow.learn.bc import behaviour_clone, imitation_accuracy
from rollflow.learn.config import PPOConfig
from rollflow.learn.demos import collect_demonstrations
from rollflow.learn.env import RoutingEnv, observation_spec
from rollflow.learn.policy_net import ScorerPolicy
from rollflow.learn.ppo import PPO, _move_credit, schedule_at
from tests.learn.conftest import cloning_least_tokens


def test_ppo_updates_change_the_policy_and_report_kl_to_the_reference(config):
    torch.manual_seed(0)
    policy = ScorerPolicy(observation_spec(config), hidden=8)
    before = [p.detach().clone() for p in policy.parameters()]
    ppo = PPO(policy, RoutingEnv(config), config.ppo, reference=policy, seed=0)
    rows = [ppo.iterate(), ppo.iterate()]
    assert ppo.step == 64
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.parameters(), strict=True))
    assert rows[0]["kl_to_reference"] >= 0 and rows[1]["kl_to_reference"] > 0
    assert all(np.isfinite(r["policy_loss"]) for r in rows)


def test_schedules_decay_kl_entropy_and_temperature_to_their_floors():
    s = PPOConfig(
        total_steps=1000,
        kl_start=0.6,
        kl_end=0.1,
        kl_decay_steps=300,
        entropy_start=0.02,
        entropy_end=0.0,
        entropy_warmup_steps=500,
        temperature_start=1.0,
        min_temperature=0.4,
    )
    assert schedule_at(s, 0).kl_weight == 0.6
    assert schedule_at(s, 150).kl_weight == pytest.approx(0.35)
    assert schedule_at(s, 5000).kl_weight == pytest.approx(0.1)
    assert schedule_at(s, 400).entropy_weight == 0.02  # warm-up holds it
    assert schedule_at(s, 750).entropy_weight == pytest.approx(0.01)
    assert schedule_at(s, 500).temperature == pytest.approx(0.7)
    assert schedule_at(s, 2000).temperature == 0.4


def test_credit_moves_to_the_buffered_decision_only():
    rewards = np.array([0.0, 0.0, -3.0])
    _move_credit(rewards, 2, [(0, -1.0), (7, -2.0)], {0: 0})
    assert rewards.tolist() == [-1.0, 0.0, -2.0]


def test_behaviour_cloning_imitates_least_tokens(config):
    config = cloning_least_tokens(config)
    demos = collect_demonstrations(config)
    torch.manual_seed(0)
    policy = ScorerPolicy(observation_spec(config), hidden=16)
    untrained = imitation_accuracy(policy, demos)
    history = behaviour_clone(policy, demos, config.bc)
    assert history[-1]["bc_loss"] < history[0]["bc_loss"]
    assert imitation_accuracy(policy, demos) > max(untrained, 0.7)


def test_demonstrations_rank_demonstrators_by_return(config):
    demos = collect_demonstrations(config)
    assert set(demos.mean_return) == {"round_robin", "lor", "least_tokens", "random"}
    best = demos.best(1)
    kept = {demos.names[k] for k in set(best.demonstrator.tolist())}
    assert kept == {max(demos.mean_return, key=demos.mean_return.get)}
    assert len(best.actions) < len(demos.actions)
