"""Behaviour cloning: fit the policy's action distribution to demonstrated decisions (cross-entropy)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from rollflow.learn.config import BCConfig
from rollflow.learn.demos import Demonstrations


def behaviour_clone(
    policy: nn.Module, demos: Demonstrations, settings: BCConfig, seed: int = 0
) -> list[dict[str, float]]:
    """Train `policy` in place; returns per-epoch cross-entropy and accuracy."""
    obs = torch.as_tensor(demos.obs)
    actions = torch.as_tensor(demos.actions)
    optimizer = torch.optim.Adam(policy.parameters(), lr=settings.learning_rate)
    generator = torch.Generator().manual_seed(seed)
    history = []
    for _ in range(settings.epochs):
        order = torch.randperm(len(actions), generator=generator)
        losses, correct = [], 0
        for start in range(0, len(order), settings.batch_size):
            idx = order[start : start + settings.batch_size]
            logits = policy.logits(obs[idx])
            loss = nn.functional.cross_entropy(logits, actions[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            correct += int((logits.argmax(-1) == actions[idx]).sum())
        history.append({"bc_loss": float(np.mean(losses)), "bc_accuracy": correct / max(1, len(actions))})
    return history


def imitation_accuracy(policy: nn.Module, demos: Demonstrations) -> float:
    """Share of demonstrated decisions the policy's greedy choice reproduces."""
    with torch.no_grad():
        picks = policy.logits(torch.as_tensor(demos.obs)).argmax(-1).numpy()
    return float((picks == demos.actions).mean())
