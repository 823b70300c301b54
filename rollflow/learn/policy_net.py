"""Torch policies for training: the routing scorer (exported to numpy) and a plain MLP (for checks).

Both give `logits(obs)` over discrete actions and `value(obs)`; PPO and behaviour cloning only
use those two, so the same trainer runs on the routing env and on a control task.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from rollflow.policy.learned import LearnedRouter, ObservationSpec


def _mlp(sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for k in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[k], sizes[k + 1]))
        if k < len(sizes) - 2:
            layers.append(nn.Tanh())
    return nn.Sequential(*layers)


class ScorerPolicy(nn.Module):
    """One MLP scores each instance from [own load, slot one-hot, mean load, request]; softmax picks.

    Mirrors `rollflow.policy.learned.scorer_inputs` and `LearnedRouter.scores` exactly.
    """

    def __init__(self, spec: ObservationSpec, hidden: int = 64) -> None:
        super().__init__()
        self.spec = spec
        n, f = spec.num_instances, spec.num_instance_features
        self.scorer = _mlp([2 * f + n + (spec.size - n * f), hidden, hidden, 1])
        self.critic = _mlp([spec.size, hidden, hidden, 1])
        self.register_buffer("slots", torch.eye(n))

    def logits(self, obs: torch.Tensor) -> torch.Tensor:
        n, f = self.spec.num_instances, self.spec.num_instance_features
        batch = obs.shape[0]
        per = obs[:, : n * f].reshape(batch, n, f)
        req = obs[:, n * f :]
        rows = torch.cat(
            [
                per,
                self.slots.expand(batch, n, n),
                per.mean(dim=1, keepdim=True).expand(batch, n, f),
                req[:, None, :].expand(batch, n, req.shape[1]),
            ],
            dim=2,
        )
        return self.scorer(rows).squeeze(-1)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1)

    def export_weights(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """(W, b) per layer, W as (inputs, outputs) for `x @ W + b`."""
        linears = [m for m in self.scorer if isinstance(m, nn.Linear)]
        return [(m.weight.detach().numpy().T.copy(), m.bias.detach().numpy().copy()) for m in linears]

    def to_router(self) -> LearnedRouter:
        return LearnedRouter(self.spec, self.export_weights())


class MlpPolicy(nn.Module):
    """Separate actor and critic MLPs over a flat observation: SB3's MlpPolicy, initialisation included.

    SB3 initialises orthogonally (gain sqrt 2 in hidden layers, 0.01 on the action logits so the
    first policy is near uniform, 1 on the value); matching it makes the comparison in
    benchmarks/ppo_vs_sb3.py one of algorithms, not of starting points.
    """

    def __init__(self, obs_size: int, num_actions: int, hidden: int = 64) -> None:
        super().__init__()
        self.actor = _mlp([obs_size, hidden, hidden, num_actions])
        self.critic = _mlp([obs_size, hidden, hidden, 1])
        for net, out_gain in ((self.actor, 0.01), (self.critic, 1.0)):
            linears = [m for m in net if isinstance(m, nn.Linear)]
            for k, layer in enumerate(linears):
                nn.init.orthogonal_(layer.weight, gain=out_gain if k == len(linears) - 1 else 2**0.5)
                nn.init.zeros_(layer.bias)

    def logits(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor(obs)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1)
