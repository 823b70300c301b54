"""rollflow's PPO against Stable-Baselines3's PPO, same hyperparameters, same environments.

    .venv/bin/python benchmarks/ppo_vs_sb3.py --task cartpole --steps 50000 --seeds 0 1 2
    .venv/bin/python benchmarks/ppo_vs_sb3.py --task routing --steps 20000 --seeds 0 1

rollflow's PPO runs with its anchor knobs off (no KL reference, no entropy bonus, temperature 1),
so both implement the same algorithm (clipped surrogate, GAE, per-minibatch advantage
normalisation, gradient clipping, SB3's default hyperparameters) with the same network (two
64-unit tanh layers for actor and critic). Prints the mean episode return per window of steps
for each, and the ratio of the final windows. On `routing` both start from scratch (no
behaviour cloning) on examples/router/heterogeneous.yaml, with the latency reward accrued per
step (`reward.credit=time`, SLO term off), so no reward moves between steps and the two see
exactly the same rewards.
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np
import torch

from rollflow.config import load_config
from rollflow.learn.config import LearnConfig, PPOConfig
from rollflow.learn.env import RoutingEnv
from rollflow.learn.policy_net import MlpPolicy
from rollflow.learn.ppo import PPO

SB3_DEFAULTS = dict(
    rollout_steps=2048,
    epochs=10,
    minibatch_size=64,
    learning_rate=3e-4,
    gamma=0.99,
    gae_lambda=0.95,
    clip=0.2,
    value_weight=0.5,
    max_grad_norm=0.5,
    kl_start=0.0,
    kl_end=0.0,
    entropy_start=0.0,
    entropy_end=0.0,
    temperature_start=1.0,
    min_temperature=1.0,
)


def make_env(task: str) -> gym.Env:
    if task == "cartpole":
        return gym.make("CartPole-v1")
    overrides = ["scenario.episode_requests=200", "reward.credit=time", "reward.slo_weight=0"]
    return RoutingEnv(load_config(LearnConfig, "examples/router/heterogeneous.yaml", overrides))


def rollflow_curve(task: str, steps: int, seed: int) -> list[tuple[int, float]]:
    env = make_env(task)
    settings = PPOConfig(total_steps=steps, **SB3_DEFAULTS)
    torch.manual_seed(seed)
    policy = MlpPolicy(env.observation_space.shape[0], env.action_space.n)
    ppo = PPO(policy, env, settings, seed=seed)
    curve = []
    while ppo.step < steps:
        metrics = ppo.iterate()
        curve.append((ppo.step, metrics["episode_return"]))
    return curve


def sb3_curve(task: str, steps: int, seed: int) -> list[tuple[int, float]]:
    from stable_baselines3 import PPO as SB3PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.monitor import Monitor

    class Windows(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.curve: list[tuple[int, float]] = []

        def _on_step(self) -> bool:
            return True

        def _on_rollout_end(self) -> None:
            returns = [info["r"] for info in self.model.ep_info_buffer]
            self.curve.append((self.num_timesteps, float(np.mean(returns)) if returns else float("nan")))
            self.model.ep_info_buffer.clear()

    env = Monitor(make_env(task))
    model = SB3PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0)
    callback = Windows()
    model.learn(total_timesteps=steps, callback=callback)
    return callback.curve


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--task", choices=("cartpole", "routing"), default="cartpole")
    parser.add_argument("--steps", type=int, default=50_000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = {}
    for name, fn in (("rollflow", rollflow_curve), ("sb3", sb3_curve)):
        start = time.perf_counter()
        curves = [fn(args.task, args.steps, seed) for seed in args.seeds]
        results[name] = (np.array([[r for _, r in c] for c in curves]), time.perf_counter() - start)
        steps = [s for s, _ in curves[0]]
    print(f"{args.task}: mean episode return per 2048-step window over seeds {args.seeds}")
    print(f"{'step':>8} {'rollflow':>10} {'sb3':>10}")
    for k, step in enumerate(steps):
        print(
            f"{step:>8} {np.nanmean(results['rollflow'][0][:, k]):>10.2f} {np.nanmean(results['sb3'][0][:, k]):>10.2f}"
        )
    last = {name: float(np.nanmean(curves[:, -3:])) for name, (curves, _) in results.items()}
    print(
        f"final 3 windows: rollflow {last['rollflow']:.2f}, sb3 {last['sb3']:.2f}, "
        f"ratio rollflow/sb3 {last['rollflow'] / last['sb3']:.3f}; wall time rollflow "
        f"{results['rollflow'][1]:.0f} s, sb3 {results['sb3'][1]:.0f} s"
    )


if __name__ == "__main__":
    main()
