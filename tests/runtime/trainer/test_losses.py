"""The losses against hand computations."""

import math

import pytest
import torch

from rollflow.runtime.trainer.losses import clipped_policy_loss, gae, grpo_advantages, kl_k3, masked_mean


def test_grpo_advantages_are_normalised_within_each_group_only():
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5, 3.0, 1.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    advantages = grpo_advantages(rewards, groups)
    # group 0: mean 0.5, std 0.5 -> +1, -1; group 1: all equal -> 0; group 2: mean 2, std 1 -> +1, -1
    assert torch.allclose(advantages, torch.tensor([1.0, -1.0, 0.0, 0.0, 1.0, -1.0]), atol=1e-5)


def test_clipped_ratio_takes_the_pessimistic_side():
    old = torch.zeros(1, 4)
    # ratios 1.5, 0.5, 1.1, 1.5 with advantages +1, -1, +1, -1
    new = torch.log(torch.tensor([[1.5, 0.5, 1.1, 1.5]]))
    advantages = torch.tensor([[1.0, -1.0, 1.0, -1.0]])
    mask = torch.ones(1, 4)
    loss, clip_fraction = clipped_policy_loss(new, old, advantages, mask, clip=0.2)
    # per token -min(rA, clip(r)A): -1.2, +0.8, -1.1, +1.5 (the unclipped side is the smaller one)
    assert loss.item() == pytest.approx((-1.2 + 0.8 - 1.1 + 1.5) / 4, abs=1e-6)
    assert clip_fraction.item() == pytest.approx(0.5)


def test_clipped_loss_ignores_masked_tokens():
    new = torch.tensor([[0.3, 5.0]])
    old = torch.zeros(1, 2)
    advantages = torch.tensor([[1.0, 100.0]])
    loss, _ = clipped_policy_loss(new, old, advantages, torch.tensor([[1.0, 0.0]]), clip=0.2)
    assert loss.item() == pytest.approx(-1.2)


def test_kl_k3_is_zero_on_equal_policies_and_matches_the_formula():
    logprobs = torch.tensor([-1.0, -2.0, -0.5])
    assert torch.allclose(kl_k3(logprobs, logprobs), torch.zeros(3))
    ref = torch.tensor([-1.5, -1.0, -0.5])
    expected = [math.exp(r - p) - (r - p) - 1 for p, r in zip(logprobs.tolist(), ref.tolist(), strict=True)]
    assert torch.allclose(kl_k3(logprobs, ref), torch.tensor(expected))
    assert (kl_k3(logprobs, ref) >= 0).all()


def test_kl_k3_estimates_the_true_kl_in_expectation():
    torch.manual_seed(0)
    p = torch.softmax(torch.randn(6), 0)
    q = torch.softmax(torch.randn(6), 0)
    draws = torch.multinomial(p, 200_000, replacement=True)
    estimate = kl_k3(p.log()[draws], q.log()[draws]).mean()
    assert estimate.item() == pytest.approx((p * (p.log() - q.log())).sum().item(), rel=0.03)


def test_gae_matches_a_hand_computation_and_stops_at_each_row_end():
    gamma, lam = 0.9, 0.8
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    values = torch.tensor([[0.5, 0.4, 0.3], [0.1, 0.2, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])  # row 1 ends after 2 tokens
    advantages, returns = gae(rewards, values, mask, gamma, lam)
    # row 0: deltas d2 = 1 - 0.3, d1 = 0 + 0.9*0.3 - 0.4, d0 = 0 + 0.9*0.4 - 0.5
    d2, d1, d0 = 0.7, 0.27 - 0.4, 0.36 - 0.5
    a2 = d2
    a1 = d1 + gamma * lam * a2
    a0 = d0 + gamma * lam * a1
    # row 1: the padded value 9.0 must not leak in: d1 = 2 - 0.2, d0 = 0.9*0.2 - 0.1
    b1 = 1.8
    b0 = 0.18 - 0.1 + gamma * lam * b1
    expected = torch.tensor([[a0, a1, a2], [b0, b1, 0.0]])
    assert torch.allclose(advantages, expected, atol=1e-6)
    assert torch.allclose(returns, (expected + values) * mask, atol=1e-6)


def test_gae_skips_an_environments_tokens_inside_an_episode():
    """A multi-turn row (output, tool tokens masked out, output, padding) gets the advantages of the
    same row with the tool's tokens taken out: the final reward reaches the first turn."""
    gamma, lam = 0.9, 0.8
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0]])
    rewards = torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.4, 0.0, 0.0, 0.3, 0.2, 0.0]])
    advantages, returns = gae(rewards, values, mask, gamma, lam)
    kept = mask[0] > 0
    compact, compact_returns = gae(rewards[:, kept], values[:, kept], torch.ones(1, 4), gamma, lam)
    assert torch.allclose(advantages[:, kept], compact, atol=1e-6)
    assert torch.allclose(returns[:, kept], compact_returns, atol=1e-6)
    assert (advantages[:, ~kept] == 0).all() and (returns[:, ~kept] == 0).all()
    # the reward reaches the first turn through the lambda-return, not only through its values
    assert compact[0, 0] > gae(rewards[:, kept], values[:, kept], torch.ones(1, 4), gamma, 0.0)[0][0, 0]


def test_masked_mean_counts_only_masked_positions():
    assert masked_mean(torch.tensor([1.0, 3.0, 100.0]), torch.tensor([1.0, 1.0, 0.0])).item() == 2.0
