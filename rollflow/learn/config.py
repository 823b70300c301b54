"""Configuration of router learning (`rollflow router ...`): cluster, workloads, reward, BC, PPO.

`preset: vidur_arc2` fills the knobs Vidur-Arc2 published for its PPO global scheduler (KL to
the behaviour-cloned reference decaying 0.6 -> 0.1 over 3,000 steps, entropy warm-up off, a
minimum temperature, a load-balance penalty, demonstrations from round robin / least
outstanding / random mixed together); keys the file sets win over the preset.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from rollflow.sim.config import (
    ExecutionConfig,
    SchedulerConfig,
    Section,
    ServingClusterConfig,
    WorkloadConfig,
)

HEURISTICS = ("round_robin", "lor", "least_tokens", "random")

PRESETS: dict[str, dict[str, Any]] = {
    "rollflow": {},
    "vidur_arc2": {
        "reward": {"balance_weight": 0.1, "credit": "time"},
        "bc": {"demonstrators": ["round_robin", "lor", "random"], "keep_best": 0},
        "ppo": {
            "kl_start": 0.6,
            "kl_end": 0.1,
            "kl_decay_steps": 3000,
            "entropy_start": 0.01,
            "entropy_end": 0.01,
            "entropy_warmup_steps": 0,
            "min_temperature": 0.5,
        },
    },
}


class RewardConfig(Section):
    """Reward per decision; summed over an episode the latency term is minus the total E2E / slo."""

    credit: Literal["request", "time"] = "request"
    """request: a request's terms are credited to the decision that routed it (reported in
    info['credit'] at completion); time: latency accrues per step as request-seconds in the system."""
    slo_e2e_s: float = Field(30.0, gt=0.0)
    """E2E latency objective: latency is measured in units of it, and completions past it are penalised."""
    slo_ttft_s: float = Field(5.0, gt=0.0)
    """Time-to-first-token objective (SLO attainment needs both)."""
    latency_weight: float = Field(1.0, ge=0.0)
    """Weight of E2E latency in units of slo_e2e_s (summed over an episode: total E2E / slo_e2e_s)."""
    slo_weight: float = Field(1.0, ge=0.0)
    """Per request completed past slo_e2e_s."""
    ttft_weight: float = Field(0.0, ge=0.0)
    """Per request whose first token came after slo_ttft_s."""
    throughput_weight: float = Field(0.0, ge=0.0)
    """Per 1,000 output tokens completed."""
    balance_weight: float = Field(0.0, ge=0.0)
    """Coefficient of variation of the instances' token load after the decision (Vidur-Arc2's penalty)."""


class ScenarioConfig(Section):
    episode_requests: int = Field(400, ge=2)
    """Requests per training episode (one decision each)."""
    imbalance_probability: float = Field(0.25, ge=0.0, le=1.0)
    """Share of episodes that start with one instance flooded (extreme-imbalance scenarios)."""
    imbalance_requests: int = Field(32, ge=0)
    """Requests sent to the flooded instance before the first decision."""
    train_seeds: list[int] = Field(default_factory=lambda: list(range(1000, 1064)))
    """Workload seeds episodes are drawn from."""
    eval_seeds: list[int] = Field(default_factory=lambda: [1, 2, 3, 4])
    """Held-out workload seeds for `evaluate` and `compare`; must not overlap train_seeds."""
    eval_requests: int = Field(1500, ge=1)
    """Requests per held-out run."""
    validation_seeds: list[int] = Field(default_factory=lambda: [900, 901])
    """Seeds of the runs that pick the best policy during training (neither train nor eval seeds)."""
    validate_every: int = Field(4, ge=1)
    """PPO iterations between validations; the policy with the lowest validation p99 E2E is exported."""


class BCConfig(Section):
    demonstrators: list[Literal[HEURISTICS]] = Field(  # type: ignore[valid-type]
        default_factory=lambda: list(HEURISTICS), min_length=1
    )
    """Heuristic routers whose decisions are recorded."""
    episodes_per_demonstrator: int = Field(8, ge=1)
    """Episodes recorded per demonstrator router."""
    keep_best: int = Field(1, ge=0)
    """Clone only the N demonstrators with the highest mean return (0 = all of them, mixed)."""
    epochs: int = Field(10, ge=0)
    """Passes over the recorded decisions (0: no behaviour cloning)."""
    learning_rate: float = Field(3e-3, gt=0.0)
    """Adam learning rate of behaviour cloning."""
    batch_size: int = Field(256, ge=1)
    """Decisions per gradient step of behaviour cloning."""


class PPOConfig(Section):
    total_steps: int = Field(50_000, ge=1)
    """Environment steps (routing decisions) of PPO after behaviour cloning."""
    rollout_steps: int = Field(2048, ge=8)
    """Decisions collected per PPO iteration."""
    epochs: int = Field(4, ge=1)
    """Passes over each iteration's decisions."""
    minibatch_size: int = Field(256, ge=1)
    """Decisions per gradient step."""
    learning_rate: float = Field(3e-4, gt=0.0)
    """Adam learning rate."""
    gamma: float = Field(0.99, ge=0.0, le=1.0)
    """Discount factor."""
    gae_lambda: float = Field(0.95, ge=0.0, le=1.0)
    """GAE lambda of the advantage estimate."""
    clip: float = Field(0.2, gt=0.0)
    """PPO's clip range of the probability ratio."""
    value_weight: float = Field(0.5, ge=0.0)
    """Weight of the value loss."""
    max_grad_norm: float = Field(0.5, gt=0.0)
    """Gradients are clipped to this norm."""
    kl_start: float = Field(0.3, ge=0.0)
    """Weight of KL(policy || BC reference) at the first step."""
    kl_end: float = Field(0.02, ge=0.0)
    """Weight of KL(policy || BC reference) after kl_decay_steps."""
    kl_decay_steps: int = Field(30_000, ge=1)
    """Steps over which the KL weight falls linearly from kl_start to kl_end."""
    entropy_start: float = Field(0.01, ge=0.0)
    """Weight of the entropy bonus at the first step."""
    entropy_end: float = Field(0.001, ge=0.0)
    """Weight of the entropy bonus at total_steps."""
    entropy_warmup_steps: int = Field(0, ge=0)
    """Steps at entropy_start before it decays linearly to entropy_end by total_steps (0 = decay at once)."""
    temperature_start: float = Field(1.0, gt=0.0)
    """Sampling temperature at the first step."""
    min_temperature: float = Field(0.3, gt=0.0)
    """Sampling temperature decays from temperature_start to this floor over total_steps."""
    hidden: int = Field(64, ge=4)
    """Width of the scorer's two hidden layers (and the value net's)."""


class LearnConfig(Section):
    preset: Literal[tuple(PRESETS)] = "rollflow"  # type: ignore[valid-type]
    """Knob values to start from: rollflow (default) or vidur_arc2."""
    seed: int = 0
    """Seed of the network's initialisation and of every draw of training."""
    cluster: ServingClusterConfig = Field(default_factory=ServingClusterConfig)
    """The simulated cluster the router routes on, as in `rollflow sim serve`."""
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    """Each replica's batch scheduler, as in `rollflow sim serve`."""
    execution: ExecutionConfig = Field(default_factory=ExecutionConfig)
    """Where execution times come from, as in `rollflow sim serve`."""
    workload: WorkloadConfig
    """Training workload (its num_requests is replaced by scenario.episode_requests)."""
    eval_workload: WorkloadConfig | None = None
    """Held-out workload (default: `workload` with scenario.eval_seeds)."""
    scenario: ScenarioConfig = Field(default_factory=ScenarioConfig)
    """Episodes, seeds and validation of training."""
    reward: RewardConfig = Field(default_factory=RewardConfig)
    """What each routing decision is rewarded for."""
    use_predicted_output: bool = True
    """Show the policy each request's output length (the simulator's true length, as a perfect predictor)."""
    cache_feature: bool = False
    """Show the policy how much of each request's prompt every instance caches (with
    `scheduler.prefix_caching`); off keeps the observation of policies trained before it."""
    bc: BCConfig = Field(default_factory=BCConfig)
    """Behaviour cloning of the heuristic routers, the warm start of PPO."""
    ppo: PPOConfig = Field(default_factory=PPOConfig)
    """PPO after behaviour cloning."""
    output_dir: str = "outputs/router"
    """Checkpoints, metrics.csv, TensorBoard events, policy.npz, compare.json and plots."""
    policy_file: str | None = None
    """Where `train` exports the policy and `evaluate`/`compare` load it (default: <output_dir>/policy.npz)."""

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: object) -> object:
        if not isinstance(data, dict):
            return data
        preset = PRESETS.get(data.get("preset", "rollflow"), {})
        merged = dict(data)
        for section, values in preset.items():
            merged[section] = {**values, **(data.get(section) or {})}
        return _with_default_kinds(merged)

    @model_validator(mode="after")
    def _held_out(self) -> LearnConfig:
        scenario = self.scenario
        if set(scenario.validation_seeds) & set(scenario.eval_seeds):
            raise ValueError("scenario.validation_seeds must not overlap eval_seeds")
        overlap = set(scenario.train_seeds) & set(scenario.eval_seeds)
        if overlap and self.eval_workload is None:
            raise ValueError(f"scenario.eval_seeds overlap train_seeds: {sorted(overlap)}")
        if self.scenario.imbalance_requests >= self.scenario.episode_requests:
            raise ValueError("scenario.imbalance_requests must be below episode_requests")
        if self.cache_feature and not self.scheduler.prefix_caching:
            raise ValueError("cache_feature needs scheduler.prefix_caching: true (else every share reads 0)")
        return self


def _with_default_kinds(data: dict[str, Any]) -> dict[str, Any]:
    from rollflow.sim.config import fill_default_kinds

    return fill_default_kinds(data, {"workload": "synthetic", "eval_workload": "synthetic"})  # type: ignore[return-value]
