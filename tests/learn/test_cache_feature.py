"""The learned router's cache-hit feature: off for policies trained before it, on by config."""

import numpy as np
import pytest

from rollflow.errors import UserError
from rollflow.learn.env import RoutingEnv
from rollflow.policy.learned import LearnedRouter, ObservationSpec, load_learned_router, save_learned_router
from rollflow.policy.view import ClusterView, InstanceView, RouteRequest
from tests.factories import REPO
from tests.learn.conftest import tiny_config


def test_shipped_policies_keep_their_eight_features():
    for path in sorted((REPO / "examples" / "router").glob("*.policy.npz")):
        router = load_learned_router(path)
        assert router.spec.cache_feature is False and router.spec.num_instance_features == 8
        assert router.reads_cache is False


def test_the_env_observes_each_instances_cached_share_of_the_prompt():
    config = tiny_config(
        "cache_feature=true",
        "scheduler.prefix_caching=true",
        "scenario.imbalance_probability=0",
        "workload.groups.size=4",
        "workload.system_prompt_tokens=128",
    )
    env = RoutingEnv(config)
    n, f = env.spec_obs.num_instances, env.spec_obs.num_instance_features
    assert f == 9 and env.observation_space.shape == (n * f + 2,)
    obs, _ = env.reset(seed=10)
    shares, done = [], False
    while not done:
        shares.append(obs[: n * f].reshape(n, f)[:, 8])
        obs, _, done, _, _ = env.step(0)  # everything to instance 0: its cache holds the groups
    shares = np.array(shares)
    assert shares[:, 0].max() > 0.5 and shares[:, 1].max() == 0.0


def test_a_cache_feature_policy_round_trips_and_reads_the_view(tmp_path):
    spec = ObservationSpec(num_instances=2, cache_feature=True)
    f = spec.num_instance_features
    rng = np.random.default_rng(0)
    inputs = 2 * f + 2 + 2
    weights = [(rng.normal(size=(inputs, 4)), np.zeros(4)), (rng.normal(size=(4, 1)), np.zeros(1))]
    weights[0][0][8] = 0.0
    weights[0][0][8, 0] = 50.0  # the own-cache input drives the first hidden unit
    weights[1][0][:] = 0.0
    weights[1][0][0, 0] = 1.0  # ... which alone decides the score
    router = load_learned_router(save_learned_router(tmp_path / "p.npz", spec, weights, {}))
    assert isinstance(router, LearnedRouter) and router.reads_cache
    view = ClusterView(
        0.0, (InstanceView(0, 0, 0, 0, 0, 0.0), InstanceView(1, 5, 5, 900, 900, 0.5, cached_tokens=800))
    )
    assert router.pick(RouteRequest(0, 1000, 100), view) == 1


def test_cache_feature_without_prefix_caching_is_a_config_error():
    with pytest.raises((UserError, ValueError), match="prefix_caching"):
        tiny_config("cache_feature=true")
