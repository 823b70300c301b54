"""Demonstrations: the heuristic routers' decisions in the routing env, imbalanced starts included.

Each demonstrator routes whole episodes of the training env (whose resets flood one instance
in `scenario.imbalance_probability` of them, so the recorded states include the extreme
imbalance a learned policy must recover from). Every (observation, action) is kept with the
demonstrator's name and its episode's return, so cloning can keep the best demonstrators.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rollflow.learn.config import LearnConfig
from rollflow.learn.env import RoutingEnv
from rollflow.policy.routing import make_router


@dataclass(frozen=True)
class Demonstrations:
    obs: np.ndarray  # (steps, observation size)
    actions: np.ndarray  # (steps,)
    demonstrator: np.ndarray  # (steps,) index into `names`
    names: tuple[str, ...]
    mean_return: dict[str, float]  # per demonstrator, over its episodes

    def best(self, keep: int) -> Demonstrations:
        """The demonstrations of the `keep` demonstrators with the highest mean return (0: all)."""
        if keep == 0 or keep >= len(self.names):
            return self
        ranked = sorted(self.names, key=lambda name: -self.mean_return[name])[:keep]
        mask = np.isin(self.demonstrator, [self.names.index(n) for n in ranked])
        return Demonstrations(
            self.obs[mask], self.actions[mask], self.demonstrator[mask], self.names, self.mean_return
        )


def collect_demonstrations(config: LearnConfig, seed: int = 0) -> Demonstrations:
    names = tuple(config.bc.demonstrators)
    obs, actions, owners = [], [], []
    mean_return = {}
    for k, name in enumerate(names):
        env = RoutingEnv(config)  # fresh, so every demonstrator replays the same episode seeds
        returns = []
        for episode in range(config.bc.episodes_per_demonstrator):
            router = make_router(name, seed=seed + episode)
            ob, _ = env.reset(seed=seed + episode)  # same workloads and floods for every demonstrator
            total, done = 0.0, False
            while not done:
                action = env.heuristic_action(router)
                obs.append(ob)
                actions.append(action)
                owners.append(k)
                ob, reward, done, _, _ = env.step(action)
                total += reward
            returns.append(total)
        mean_return[name] = float(np.mean(returns))
    return Demonstrations(
        np.array(obs, dtype=np.float32), np.array(actions), np.array(owners), names, mean_return
    )
