import numpy as np
import pytest
import torch

from rollflow.errors import UserError
from rollflow.learn.bc import behaviour_clone
from rollflow.learn.demos import collect_demonstrations
from rollflow.learn.env import RoutingEnv, observation_spec
from rollflow.learn.policy_net import ScorerPolicy
from rollflow.learn.stepper import request_of, sim_config
from rollflow.policy.learned import load_learned_router, save_learned_router
from rollflow.policy.routing import make_router
from rollflow.sim.simulator import ServingSimulator
from rollflow.sim.workload import build_requests
from tests.learn.conftest import cloning_least_tokens


def _trained_looking_policy(config) -> ScorerPolicy:
    """A policy cloned from least_tokens: it sends work to both replicas, so picks are real choices."""
    config = cloning_least_tokens(config)
    torch.manual_seed(0)
    policy = ScorerPolicy(observation_spec(config), hidden=16)
    behaviour_clone(policy, collect_demonstrations(config), config.bc)
    return policy


def test_exported_file_routes_like_the_torch_policy(config, tmp_path):
    policy = _trained_looking_policy(config)
    path = save_learned_router(tmp_path / "p.npz", policy.spec, policy.export_weights(), {"note": "test"})
    router = make_router("learned", path=str(path))
    scenario = config.scenario.model_copy(update={"imbalance_probability": 0.0})
    env = RoutingEnv(config.model_copy(update={"scenario": scenario}))
    obs, _ = env.reset(seed=0)
    picks = []
    for _ in range(config.scenario.episode_requests):
        view, request = env.sim.view(), env.sim.pending
        with torch.no_grad():
            logits = policy.logits(torch.as_tensor(obs)[None])[0].numpy()
        np.testing.assert_allclose(router.scores(obs), logits, rtol=1e-5, atol=1e-5)
        pick = router.pick(request_of(request), view)
        assert pick == int(np.argmax(logits))
        picks.append(pick)
        obs, _, terminated, _, _ = env.step(pick)
        if terminated:
            break
    assert len(set(picks)) == 2  # both replicas get work: the test exercises a real choice


def test_learned_router_runs_in_the_simulator_from_the_config(config, tmp_path):
    policy = _trained_looking_policy(config)
    path = save_learned_router(tmp_path / "p.npz", policy.spec, policy.export_weights(), {})
    cluster = config.cluster.model_copy(update={"router": "learned", "router_path": str(path)})
    sim = sim_config(config, config.workload, seed=5, num_requests=30)
    sim = sim.model_copy(update={"cluster": cluster})
    result = ServingSimulator(sim, build_requests(sim.workload, 5)).run()
    via_config = [r.replica_id for r in result.requests]
    direct = ServingSimulator(sim, build_requests(sim.workload, 5), router=load_learned_router(path)).run()
    assert via_config == [r.replica_id for r in direct.requests]
    assert sorted(set(via_config)) == [0, 1] and all(r.completed_at for r in result.requests)


def test_learned_router_errors_name_the_problem(config, tmp_path):
    with pytest.raises(UserError, match="needs the path"):
        make_router("learned")
    with pytest.raises(UserError, match="not found"):
        make_router("learned", path=str(tmp_path / "missing.npz"))
    (tmp_path / "bad.npz").write_bytes(b"not a policy")
    with pytest.raises(UserError, match="not a rollflow policy file"):
        load_learned_router(tmp_path / "bad.npz")
    policy = ScorerPolicy(observation_spec(config), hidden=8)
    path = save_learned_router(tmp_path / "p.npz", policy.spec, policy.export_weights(), {})
    from rollflow.policy.view import ClusterView, InstanceView, RouteRequest

    three = ClusterView(0.0, [InstanceView(i, 0, 0, 0, 0, 0.0) for i in range(3)])
    with pytest.raises(UserError, match="trained for 2 instances"):
        load_learned_router(path).pick(RouteRequest(0, 10, 10), three)


def test_sim_config_names_the_missing_or_misplaced_policy_path():
    from rollflow.config import ConfigError
    from tests.factories import make_config

    with pytest.raises(ConfigError, match=r"learned needs cluster\.router_path"):
        make_config(cluster={"router": "learned"})
    with pytest.raises(ConfigError, match="router_path is only read by router: learned"):
        make_config(cluster={"router": "lor", "router_path": "p.npz"})


def test_a_smaller_view_is_read_by_instance_id(config, tmp_path):
    from rollflow.policy.view import ClusterView, InstanceView, RouteRequest

    policy = _trained_looking_policy(config)
    path = save_learned_router(tmp_path / "p.npz", policy.spec, policy.export_weights(), {})
    router = load_learned_router(path)
    request = RouteRequest(0, 300, 100)
    busy, idle = InstanceView(0, 9, 4, 3000, 9000, 0.8, 900.0), InstanceView(1, 0, 0, 0, 0, 0.0, 900.0)
    assert router.pick(request, ClusterView(0.0, [busy])) == 0  # the only eligible engine
    assert router.pick(request, ClusterView(0.0, [idle])) == 1
    assert router.pick(request, ClusterView(0.0, [busy, idle])) == 1  # full view: least_tokens-like
    with pytest.raises(UserError, match=r"instance ids 0\.\.1"):
        router.pick(request, ClusterView(0.0, [InstanceView(7, 0, 0, 0, 0, 0.0)]))
