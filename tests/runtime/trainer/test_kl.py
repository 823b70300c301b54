"""The KL metric against the reference: zero until the first optimizer step, then the true change.

A user saw `kl 0.17-1.03` at step 1 of `rollflow train` and `kl 0.0000` at step 1 of the demo: the
demo trains one mini-batch a step, the example two, and the second mini-batch of step 1 is read by a
policy one AdamW step away from the reference. On the tiny model one step of lr 3e-3 moves every
weight by about lr (AdamW's first step is sign-like), a large change for weights of std 0.02, so the
divergence is real, not a metric fault. k3's heavy tail (a token the policy now finds far less likely
than the reference) is capped per token, as verl's `low_var_kl` caps it.
"""

from __future__ import annotations

import torch

from rollflow.runtime.trainer.algorithm import LossSettings, backward_micro_batch
from rollflow.runtime.trainer.losses import KL_K3_MAX, kl_k3, masked_mean
from rollflow.runtime.trainer.models import load_policy, load_reference, token_logprobs
from rollflow.runtime.trainer.rollouts import to_tensors

SETTINGS = LossSettings(
    "grpo", clip=0.2, kl_coef=0.001, temperature=1.0, gamma=1.0, gae_lambda=0.95, value_coef=0.5
)


def _group(policy: torch.nn.Module, generator: torch.Generator) -> list[dict]:
    """Four samples of one prompt, their log-probs from the policy as an engine would report them."""
    prompt = torch.randint(3, 400, (4,), generator=generator).tolist()
    samples = []
    for _ in range(4):
        output = torch.randint(3, 400, (12,), generator=generator).tolist()
        samples.append(
            {"prompt_ids": prompt, "output_ids": output, "output_logprobs": [0.0] * 12, "spans": []}
        )
    rollout = to_tensors([samples], pad_id=0)
    with torch.no_grad():
        logprobs = token_logprobs(policy, rollout.input_ids, rollout.attention_mask, 1.0)
    for row, sample in enumerate(samples):
        sample["output_logprobs"] = logprobs[row, len(prompt) - 1 :].tolist()
    return samples


def test_kl_is_zero_before_the_first_optimizer_step_and_the_true_change_after_it(tiny_model):
    torch.manual_seed(0)
    policy, reference = load_policy(tiny_model), load_reference(tiny_model)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=3e-3, weight_decay=0.0)
    rollout = to_tensors([_group(policy, torch.Generator().manual_seed(1))], pad_id=0)
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0])

    first = backward_micro_batch(policy, reference, None, rollout, rewards, SETTINGS, 1.0)
    assert first.kl == 0.0  # the policy is the reference until an optimizer step

    optimizer.step()
    optimizer.zero_grad()
    second = backward_micro_batch(policy, reference, None, rollout, rewards, SETTINGS, 1.0)
    with torch.no_grad():
        now = token_logprobs(policy, rollout.input_ids, rollout.attention_mask, 1.0)
        before = token_logprobs(reference, rollout.input_ids, rollout.attention_mask, 1.0)
    # the metric is k3 of the log-probs the two models give now: what it reports is what happened
    assert abs(second.kl - masked_mean(kl_k3(now, before), rollout.mask).item()) < 1e-5
    # and one step of lr 3e-3 moves them far: over a nat a token (3.6 here), a KL over 1 (5.8)
    assert masked_mean((now - before).abs(), rollout.mask).item() > 1.0
    assert second.kl > 1.0


def test_k3_is_capped_per_token_where_the_policy_finds_a_token_far_less_likely_than_the_reference():
    logprobs = torch.tensor([-25.0, -1.0])  # the policy has all but ruled out the first token
    ref = torch.tensor([-1.0, -1.0])
    kl = kl_k3(logprobs, ref)
    assert kl[0].item() == KL_K3_MAX  # exp(24) - 25 uncapped: one token would swamp the mean
    assert kl[1].item() == 0.0
