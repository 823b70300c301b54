import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from rollflow.learn.env import RoutingEnv
from rollflow.policy.routing import make_router
from tests.learn.conftest import tiny_config


def test_routing_env_passes_gymnasiums_checker(config):
    check_env(RoutingEnv(config), skip_render_check=True)


@pytest.mark.parametrize("credit", ["request", "time"])
def test_episode_latency_reward_sums_to_minus_total_e2e(credit):
    config = tiny_config(f"reward.credit={credit}", "reward.slo_weight=0", "scenario.imbalance_probability=0")
    env = RoutingEnv(config)
    env.reset(seed=3)
    router = make_router("least_tokens")
    total, done = 0.0, False
    while not done:
        _, reward, done, _, _ = env.step(env.heuristic_action(router))
        total += reward
    e2e = [r.completed_at - r.arrived_at for r in env.sim.requests]
    assert total == pytest.approx(-sum(e2e) / config.reward.slo_e2e_s, rel=1e-9)


def test_credit_names_the_decision_that_routed_each_completed_request(config):
    env = RoutingEnv(
        config.model_copy(
            update={"scenario": config.scenario.model_copy(update={"imbalance_probability": 0.0})}
        )
    )
    env.reset(seed=0)
    credited, done = {}, False
    while not done:
        _, reward, done, _, info = env.step(0)
        for decision, amount in info["credit"]:
            assert decision <= info["decision"] and decision not in credited
            credited[decision] = amount
        assert reward == pytest.approx(sum(a for _, a in info["credit"]))
    assert sorted(credited) == list(range(config.scenario.episode_requests))


def test_imbalanced_start_floods_one_instance():
    env = RoutingEnv(tiny_config("scenario.imbalance_probability=1", "scenario.imbalance_requests=6"))
    _, info = env.reset(seed=1)
    assert info["flooded"]
    loads = [inst.num_outstanding for inst in env.sim.view().instances]
    completed = sum(r.completed_at is not None for r in env.sim.requests[:6])
    assert max(loads) + completed == 6 and min(loads) == 0


def test_step_rejects_an_action_outside_the_cluster(config):
    env = RoutingEnv(config)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="not in Discrete"):
        env.step(np.int64(5))


def test_stepped_simulator_reproduces_the_simulators_own_run():
    from rollflow.learn.stepper import SteppedSimulator, request_of, sim_config
    from rollflow.sim.simulator import ServingSimulator
    from rollflow.sim.workload import build_requests

    config = tiny_config()
    sim = sim_config(config, config.workload, seed=4, num_requests=60)
    reference = ServingSimulator(
        sim, build_requests(sim.workload, 4), router=make_router("least_tokens")
    ).run()
    stepped = SteppedSimulator(sim, build_requests(sim.workload, 4))
    router = make_router("least_tokens")
    stepped.advance()
    while not stepped.done:
        stepped.route(router.pick(request_of(stepped.pending), stepped.view()))
    assert [(r.replica_id, r.completed_at) for r in stepped.requests] == [
        (r.replica_id, r.completed_at) for r in reference.requests
    ]
    assert len({r.replica_id for r in reference.requests}) == 2


def test_late_binding_dispatch_is_refused_when_learning_a_router():
    from rollflow.config import ConfigError
    from rollflow.learn.stepper import SteppedSimulator, sim_config

    config = tiny_config("cluster.dispatch=late_binding")
    sim = sim_config(config, config.workload, seed=4, num_requests=10)
    with pytest.raises(ConfigError, match=r"cluster\.dispatch: router learning decides at each arrival"):
        SteppedSimulator(sim, [])
