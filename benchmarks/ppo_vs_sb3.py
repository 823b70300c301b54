"""rollflow's PPO against Stable-Baselines3's PPO, same hyperparameters, same environments.

    .venv/bin/python benchmarks/ppo_vs_sb3.py
    .venv/bin/python benchmarks/ppo_vs_sb3.py --quick    # fewer steps and seeds

rollflow's PPO runs with its anchor knobs off (no KL reference, no entropy bonus, temperature 1),
so both implement the same algorithm (clipped surrogate, GAE, per-minibatch advantage
normalisation, gradient clipping, SB3's default hyperparameters) with the same network (two
64-unit tanh layers for actor and critic). Records the mean episode return per window of 2,048
steps for each, averaged over seeds, on two tasks: CartPole-v1, and the routing env, where both
start from scratch (no behaviour cloning) on examples/router/heterogeneous.yaml with the latency
reward accrued per step (`reward.credit=time`, SLO term off), so no reward moves between steps
and the two see exactly the same rewards. Goal, per task: rollflow's mean return over the last
3 windows no more than 10% of SB3's magnitude below SB3's. On the routing env one seed's run
differs a lot from the next, so it is judged over several seeds.

SB3 is the pinned SB3_VERSION in rollflow's own venv (the `dev` extra pins it; the benchmark
checks the installed version and says what to install when it differs).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from rollflow.config import load_config
from rollflow.learn.config import LearnConfig, PPOConfig
from rollflow.learn.env import RoutingEnv
from rollflow.learn.policy_net import MlpPolicy
from rollflow.learn.ppo import PPO

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import Results, benchmark_parser, package_version, results_dir

SB3_VERSION = "2.9.2"
MIN_RETURN_VS_SB3_PCT = -10.0
# task -> (steps, seeds) of a full run and of --quick
TASKS = {
    "cartpole": ((30_000, [0, 1]), (20_480, [0])),
    "routing": ((12_288, [0, 1, 2, 3]), (4_096, [0, 1, 2, 3])),  # seeds differ a lot: --quick keeps all four
}

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


def compare(results: Results, task: str, steps: int, seeds: list[int]) -> None:
    """Both implementations on every seed, in turns; the per-window table and the goal."""
    curves: dict[str, list[list[tuple[int, float]]]] = {"rollflow": [], "sb3": []}
    wall = {"rollflow": 0.0, "sb3": 0.0}
    for seed in seeds:
        for name, fn in (("rollflow", rollflow_curve), ("sb3", sb3_curve)):
            start = time.perf_counter()
            curves[name].append(fn(task, steps, seed))
            wall[name] += time.perf_counter() - start
        print(f"{task}: seed {seed} done", flush=True)
    returns = {name: np.array([[r for _, r in c] for c in cs]) for name, cs in curves.items()}
    windows = min(r.shape[1] for r in returns.values())
    step_marks = [s for s, _ in curves["rollflow"][0]][:windows]
    results.table(
        f"{task}: mean episode return per 2,048-step window over seeds {seeds}",
        ["step", "rollflow", "SB3"],
        [[step, round(float(np.nanmean(returns["rollflow"][:, k])), 2), round(float(np.nanmean(returns["sb3"][:, k])), 2)]
         for k, step in enumerate(step_marks)],
    )  # fmt: skip
    judged = min(3, windows)  # a short run (--quick's routing: 2 windows) is judged on all it has
    last = {name: float(np.nanmean(r[:, windows - judged : windows])) for name, r in returns.items()}
    results.figures[task] = {"steps": steps, "seeds": seeds, "final_return": last, "wall_s": wall}
    results.goal(
        f"{task}: rollflow's mean return, last {judged} windows, against SB3's ((rollflow - SB3) / |SB3|, %)",
        100 * (last["rollflow"] - last["sb3"]) / abs(last["sb3"]),
        ">=",
        MIN_RETURN_VS_SB3_PCT,
        headline=task == "cartpole",
    )


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--task", choices=sorted(TASKS), action="append", help="default: both")
    parser.add_argument(
        "--steps", type=int, help="steps per run (default per task: 30k CartPole, 12k routing)"
    )
    parser.add_argument("--seeds", type=int, nargs="+", help="default per task: 0 1 CartPole, 0-3 routing")
    args = parser.parse_args()
    results = Results("ppo_vs_sb3", results_dir(args))
    results.peers["stable-baselines3"] = installed = package_version("stable-baselines3")
    if installed != SB3_VERSION:
        sys.exit(
            f"stable-baselines3 {installed or 'is not installed'}: the benchmark compares against {SB3_VERSION}; "
            f"run .venv/bin/pip install stable-baselines3=={SB3_VERSION} (make .venv/.installed pins it)"
        )
    results.figures["gymnasium"] = package_version("gymnasium")
    torch.set_num_threads(1)
    for task in args.task or sorted(TASKS):
        steps, seeds = TASKS[task][1 if args.quick else 0]
        compare(results, task, args.steps or steps, args.seeds or seeds)
    sys.exit(results.finish())


if __name__ == "__main__":
    main()
