"""One micro-batch of GRPO or PPO: rewards, reference KL and advantages within it, then forward/backward.

Everything a micro-batch needs is in the micro-batch (GRPO's groups arrive whole from the manager),
so the trainer can start on it while the rest of the step's rollouts are still being generated.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from rollflow.runtime.trainer.losses import (
    clipped_policy_loss,
    exact_kl,
    gae,
    grpo_advantages,
    kl_k3,
    masked_mean,
)
from rollflow.runtime.trainer.models import Critic, gather_tokens, next_token_logprobs
from rollflow.runtime.trainer.rollouts import RolloutTensors

REFERENCE_CHUNK_ELEMENTS = 1 << 27
"""Most elements of the reference's `[rows, T-1, V]` next-token log-probs held at once (512 MiB in float32)."""


@dataclass(frozen=True)
class LossSettings:
    algorithm: str  # "grpo" | "ppo"
    clip: float
    kl_coef: float
    temperature: float
    gamma: float
    gae_lambda: float
    value_coef: float


@dataclass(frozen=True)
class MicroBatchStats:
    """Token means over the micro-batch's output tokens (the loss is already backpropagated)."""

    loss: float
    policy_loss: float
    kl: float  # KL(policy || reference): exact over the vocabulary, or k3's estimate (see backward_micro_batch)
    entropy: float
    clip_fraction: float
    value_loss: float


def token_rewards(rewards: torch.Tensor, rollout: RolloutTensors) -> torch.Tensor:
    """PPO: the task's reward on each sample's last output token, 0 elsewhere."""
    per_token = torch.zeros_like(rollout.mask)
    per_token[torch.arange(len(rewards), device=rewards.device), rollout.last_index] = rewards
    return per_token * rollout.mask


def backward_micro_batch(
    policy: nn.Module,
    reference: nn.Module | None,
    critic: Critic | None,
    rollout: RolloutTensors,
    rewards: torch.Tensor,
    settings: LossSettings,
    scale: float,
) -> MicroBatchStats:
    """Accumulate this micro-batch's gradient (times `scale`, 1/micro-batches per mini-batch).

    The reference log-probs come with the rollout when inference workers computed them (RLinf's
    rollout -> inference -> actor); otherwise the `reference` model gives them here, whole
    distributions, and the reported `kl` is then exact (`exact_kl`) rather than k3's estimate."""
    mask = rollout.mask
    value_loss = torch.zeros((), device=mask.device)
    if settings.algorithm == "grpo":
        advantages = grpo_advantages(rewards, rollout.group_ids)[:, None] * mask
    else:
        assert critic is not None
        values = critic(rollout.input_ids, rollout.attention_mask) * mask
        advantages, returns = gae(
            token_rewards(rewards, rollout), values.detach(), mask, settings.gamma, settings.gae_lambda
        )
        value_loss = masked_mean((values - returns) ** 2, mask)
    logprobs_all = next_token_logprobs(
        policy, rollout.input_ids, rollout.attention_mask, settings.temperature
    )
    logprobs = gather_tokens(logprobs_all, rollout.input_ids)
    entropy = -(logprobs_all.exp() * logprobs_all).sum(-1)
    ref_logprobs, kl_metric = _reference(reference, rollout, logprobs_all.detach(), settings.temperature)
    policy_loss, clip_fraction = clipped_policy_loss(
        logprobs, rollout.old_logprobs, advantages, mask, settings.clip
    )
    kl = masked_mean(kl_k3(logprobs, ref_logprobs), mask)
    loss = policy_loss + settings.kl_coef * kl + settings.value_coef * value_loss
    (loss * scale).backward()
    loss, policy_loss, kl, value_loss = (t.detach() for t in (loss, policy_loss, kl, value_loss))
    return MicroBatchStats(
        loss=loss.item(),
        policy_loss=policy_loss.item(),
        kl=kl.item() if kl_metric is None else kl_metric,
        entropy=float(masked_mean(entropy.detach(), mask)),
        clip_fraction=clip_fraction.item(),
        value_loss=value_loss.item(),
    )


def _reference(
    reference: nn.Module | None, rollout: RolloutTensors, logprobs_all: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, float | None]:
    """The reference's log-prob of each token (for the k3 penalty) and the exact KL metric, or None
    for it when the rollout brought per-token reference log-probs only (the k3 mean is reported).

    The reference runs on a few rows at a time (`REFERENCE_CHUNK_ELEMENTS`), so its distributions add
    at most that much to the policy's `[B, T-1, V]` ones at the step's peak memory."""
    if rollout.ref_logprobs is not None:
        return rollout.ref_logprobs, None
    if reference is None:
        raise RuntimeError(
            "no reference log-probs: the samples carry none and this trainer holds no reference"
        )
    rows, length, vocab = logprobs_all.shape
    chunk = max(1, REFERENCE_CHUNK_ELEMENTS // max(1, length * vocab))
    ref_logprobs, kl_sum = [], logprobs_all.new_zeros(())
    with torch.no_grad():
        for start in range(0, rows, chunk):
            part = slice(start, start + chunk)
            input_ids = rollout.input_ids[part]
            ref_all = next_token_logprobs(reference, input_ids, rollout.attention_mask[part], temperature)
            kl_sum += (exact_kl(logprobs_all[part], ref_all) * rollout.mask[part]).sum()
            ref_logprobs.append(gather_tokens(ref_all, input_ids))
    kl = (kl_sum / rollout.mask.sum().clamp(min=1)).item()
    return torch.cat(ref_logprobs), kl
