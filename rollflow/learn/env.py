"""Gymnasium environment: one routing decision per arriving request in the serving simulator.

Observation: `encode_observation` of the snapshot the heuristic routers see (the same function
the exported router runs). Action: the replica index. Reward of a step, from the requests that
completed since the previous one:

    sum over them of  - latency_weight * e2e / slo_e2e           (credit: request)
                      - slo_weight * [e2e > slo_e2e] - ttft_weight * [ttft > slo_ttft]
                      + throughput_weight * output tokens / 1000
    - balance_weight * CV(token load across instances)

With `credit: time` the latency term is instead the request-seconds spent in the system since
the previous step (Little's law: the same total, accrued as it happens). Either way the last
step drains the simulation, so an episode's latency terms add up to minus the total E2E / slo.

A request's terms are known only when it completes, many decisions later. `info["credit"]`
lists them as (decision index, amount) so a trainer can move each back to the decision that
routed the request (rollflow's PPO does; `info["decision"]` is the index of this step's).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from rollflow.learn.config import LearnConfig
from rollflow.learn.stepper import SteppedSimulator, request_of, sim_config, token_load_cv
from rollflow.policy.learned import MAX_FEATURE, ObservationSpec, encode_observation
from rollflow.policy.routing import Router
from rollflow.policy.view import ClusterView
from rollflow.sim.build import GroupPlan, build_groups
from rollflow.sim.request import SimRequest
from rollflow.sim.workload import build_requests


def observation_spec(config: LearnConfig) -> ObservationSpec:
    return ObservationSpec(
        num_instances=config.cluster.num_replicas,
        use_predicted_output=config.use_predicted_output,
        cache_feature=config.cache_feature,
    )


class RoutingEnv(gym.Env):
    metadata = {"render_modes": []}  # noqa: RUF012 (gymnasium's convention)

    def __init__(self, config: LearnConfig, seeds: list[int] | None = None, imbalance: bool = True) -> None:
        self.config = config
        self.spec_obs = observation_spec(config)
        self.seeds = seeds or config.scenario.train_seeds
        self.imbalance = imbalance
        n = self.spec_obs.num_instances
        self.action_space = gym.spaces.Discrete(n)
        self.observation_space = gym.spaces.Box(
            0.0, MAX_FEATURE, shape=(self.spec_obs.size,), dtype=np.float32
        )
        self.sim: SteppedSimulator | None = None
        self._groups: dict[int, list[GroupPlan]] = {}  # built replica groups by workload max_tokens
        self._active: list[tuple[SimRequest, int | None]] = []  # in the system, with their decision index
        self._decisions = 0

    # -- gymnasium API --------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        rng = self.np_random
        scenario = self.config.scenario
        workload_seed = int(self.seeds[rng.integers(len(self.seeds))])
        config = sim_config(self.config, self.config.workload, workload_seed, scenario.episode_requests)
        requests = build_requests(config.workload, workload_seed)[: scenario.episode_requests]
        groups = self._groups.get(config.max_tokens)
        if groups is None:  # operator grids once per environment, not per episode
            groups = self._groups[config.max_tokens] = build_groups(config)
        self.sim = SteppedSimulator(config, requests, groups)
        self._active = []
        self._decisions = 0
        self.sim.advance()
        flooded = self.imbalance and rng.random() < scenario.imbalance_probability
        if flooded:
            target = int(rng.integers(self.spec_obs.num_instances))
            for _ in range(scenario.imbalance_requests):
                self._route(target)
            self.sim.take_latency()
        return self._observe(self.sim.view()), {"workload_seed": workload_seed, "flooded": flooded}

    def step(self, action):
        if self.sim is None or self.sim.done:
            raise RuntimeError("call reset() before step()")
        if not self.action_space.contains(action):
            raise ValueError(f"action {action!r} is not in {self.action_space}")
        self._route(int(action), self._decisions)
        self._decisions += 1
        terminated = self.sim.done
        view = None if terminated else self.sim.view()  # one snapshot for the reward and the observation
        reward, info = self._reward(view)
        obs = self._observe(view) if view is not None else np.zeros(self.spec_obs.size, dtype=np.float32)
        return obs, reward, terminated, False, info

    # -- helpers for demonstrations and evaluation -----------------------------------------------
    def heuristic_action(self, router: Router) -> int:
        """What `router` would pick for the pending request, from the same snapshot."""
        assert self.sim is not None
        return router.pick(request_of(self.sim.pending), self.sim.view())

    def _route(self, target: int, decision: int | None = None) -> None:
        assert self.sim is not None
        self._active.append((self.sim.pending, decision))
        self.sim.route(target)

    def _observe(self, view: ClusterView) -> np.ndarray:
        assert self.sim is not None
        return encode_observation(request_of(self.sim.pending), view, self.spec_obs)

    def _reward(self, view: ClusterView | None) -> tuple[float, dict]:
        """This step's reward, and the per-request credits (decision index, amount) it contains;
        `view` is the snapshot after the step (None once the episode is over)."""
        assert self.sim is not None
        weights = self.config.reward
        per_request = weights.credit == "request"
        reward = 0.0
        credit = []
        still = []
        for request, decision in self._active:
            if request.completed_at is None:
                still.append((request, decision))
                continue
            e2e = request.completed_at - request.arrived_at
            amount = (
                -weights.slo_weight * (e2e > weights.slo_e2e_s)
                - weights.ttft_weight
                * (request.prefill_completed_at - request.arrived_at > weights.slo_ttft_s)
                + weights.throughput_weight * request.output_tokens / 1000.0
            )
            if per_request:
                amount -= weights.latency_weight * e2e / weights.slo_e2e_s
            reward += amount
            if decision is not None:
                credit.append((decision, amount))
        self._active = still
        latency = self.sim.take_latency() / weights.slo_e2e_s
        if not per_request:
            reward -= weights.latency_weight * latency
        if weights.balance_weight and view is not None:
            reward -= weights.balance_weight * token_load_cv(view.instances)
        return float(reward), {"decision": self._decisions - 1, "credit": credit}
