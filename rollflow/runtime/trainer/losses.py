"""The RL losses, as pure tensor functions over padded [batch, tokens] rows with a 0/1 mask.

Every per-token mean is over the mask only, so padding never counts.
"""

from __future__ import annotations

import torch


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1)


def grpo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """(r - mean of its group) / (std of its group + eps), one value per sample.

    A group whose samples all scored the same gets 0: it says nothing about which sample was better.
    """
    advantages = torch.zeros_like(rewards)
    for group in group_ids.unique():
        members = group_ids == group
        scores = rewards[members]
        std = scores.std(unbiased=False) if scores.numel() > 1 else scores.new_tensor(0.0)
        advantages[members] = (scores - scores.mean()) / (std + eps)
    return advantages


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation per row; returns (advantages, returns), zero where mask is 0.

    `rewards` and `values` are per token; the value after a row's last masked token is 0 (episode
    end). A position the mask leaves out is no step of the policy's and is skipped, not an episode
    end: padding after the end, and in a multi-turn episode the environment's tokens between two
    outputs, across which the lambda-return runs on to the next output token (as verl skips
    observation tokens); cutting it there would keep a final reward from the earlier turns.
    """
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros(rewards.shape[0], dtype=rewards.dtype, device=rewards.device)
    running = torch.zeros_like(next_value)
    for t in reversed(range(rewards.shape[1])):
        kept = mask[:, t] > 0
        step = rewards[:, t] + gamma * next_value - values[:, t] + gamma * lam * running
        running = torch.where(kept, step, running)
        next_value = torch.where(kept, values[:, t], next_value)
        advantages[:, t] = running * mask[:, t]
    returns = (advantages + values) * mask
    return advantages, returns


def clipped_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's pessimistic surrogate -min(r A, clip(r) A), token mean; also the fraction of tokens where
    the clipped side was the minimum (those whose gradient the clip cut off)."""
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * advantages
    clipped = ratio.clamp(1 - clip, 1 + clip) * advantages
    loss = masked_mean(-torch.minimum(unclipped, clipped), mask)
    clip_fraction = masked_mean((clipped < unclipped).float(), mask)
    return loss, clip_fraction


KL_K3_MAX = 10.0
"""Cap of one token's k3 (verl's `low_var_kl` clamps at the same 10)."""


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token KL(policy || reference) estimate exp(q - p) - (q - p) - 1 (Schulman's k3): >= 0,
    unbiased on tokens the policy drew. Its tail is exponential: a token the policy now finds far less
    likely than the reference (drawn by an older policy, as off-policy samples are) gives exp(q - p),
    e^24 for 24 nats, which would swamp the mean and the loss, so each token's is capped at KL_K3_MAX."""
    diff = ref_logprobs - logprobs
    return (torch.exp(diff) - diff - 1).clamp(max=KL_K3_MAX)


def exact_kl(logprobs_all: torch.Tensor, ref_logprobs_all: torch.Tensor) -> torch.Tensor:
    """[B, T-1] KL(policy || reference) of each position's next-token distribution, summed over the
    vocabulary from `[B, T-1, V]` log-probs: exact, whichever version drew the tokens.

    The k3 mean over sampled tokens estimates the same KL only when the policy itself drew them; over
    tokens an older version drew (off-policy, or after a step's first optimizer step) it is biased, and
    upward without bound but for its cap: a token the policy moved away from weighs exp(ref - policy)."""
    return (logprobs_all.exp() * (logprobs_all - ref_logprobs_all)).sum(-1)
