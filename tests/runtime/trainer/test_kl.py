"""The KL metric against the reference: zero until the first optimizer step, then the true KL.

A user saw `kl 0.17-1.03` at step 1 of `rollflow train` and `kl 0.0000` at step 1 of the demo: the
demo trains one mini-batch a step, the example two, and the second mini-batch of step 1 is read by a
policy one AdamW step away from the reference. On the tiny model one step of lr 3e-3 moves every
weight by about lr (AdamW's first step is sign-like), a large change for weights of std 0.02, so that
divergence is real.

`kl 110.4793` at step 2 of a PPO off-policy run was a metric fault: the metric was the k3 mean over the
sampled tokens, which estimates KL(policy || reference) only when the policy drew them. Off-policy,
step 2's tokens were drawn by version 0 (the reference itself), and a token the policy has moved away
from weighs exp(ref - policy): e^24 for 24 nats. The metric is now the exact KL of each position's
next-token distribution (summed over the vocabulary), whichever version drew the tokens.
"""

from __future__ import annotations

import torch

from rollflow.runtime.trainer.algorithm import LossSettings, backward_micro_batch
from rollflow.runtime.trainer.losses import KL_K3_MAX, kl_k3, masked_mean
from rollflow.runtime.trainer.models import load_policy, load_reference, next_token_logprobs, token_logprobs
from rollflow.runtime.trainer.rollouts import to_tensors

SETTINGS = LossSettings(
    "grpo", clip=0.2, kl_coef=0.001, temperature=1.0, gamma=1.0, gae_lambda=0.95, value_coef=0.5
)


def _group(policy: torch.nn.Module, generator: torch.Generator, drawn: bool = False) -> list[dict]:
    """Four samples of one prompt, their log-probs from the policy as an engine would report them;
    `drawn`: their tokens sampled from the policy, as an engine draws them (else random tokens)."""
    prompt = torch.randint(3, 400, (4,), generator=generator).tolist()
    samples = []
    for _ in range(4):
        output = torch.randint(3, 400, (12,), generator=generator).tolist()
        if drawn:
            with torch.no_grad():
                ids = policy.generate(
                    torch.tensor([prompt]), do_sample=True, top_k=0, min_new_tokens=12, max_new_tokens=12
                )
            output = ids[0, len(prompt) :].tolist()
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
    now, before = _distributions(policy, rollout), _distributions(reference, rollout)
    assert abs(second.kl - _true_kl(now, before, rollout)) < 1e-5
    # and one step of lr 3e-3 moves them far: over a nat a token, a KL over 1
    tokens = rollout.input_ids[:, 1:].unsqueeze(-1)
    moved = (now.gather(-1, tokens) - before.gather(-1, tokens)).squeeze(-1).abs()
    assert masked_mean(moved, rollout.mask).item() > 1.0
    assert second.kl > 1.0


def test_kl_of_off_policy_tokens_is_the_true_kl_not_the_k3_mean_over_tokens_the_reference_drew(tiny_model):
    """PPO off-policy at step 2: the tokens were drawn by version 0 (the reference), the policy has
    taken optimizer steps since. The reported kl is KL(policy || reference) at those positions; the k3
    mean over the drawn tokens (the old metric) is far above it, capped or not."""
    torch.manual_seed(0)
    policy, reference = load_policy(tiny_model), load_reference(tiny_model)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=3e-3, weight_decay=0.0)
    rollout = to_tensors([_group(reference, torch.Generator().manual_seed(2), drawn=True)], pad_id=0)
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0])
    for _ in range(2):  # two optimizer steps: step 1's two mini-batches
        backward_micro_batch(policy, reference, None, rollout, rewards, SETTINGS, 1.0)
        optimizer.step()
        optimizer.zero_grad()
    stats = backward_micro_batch(policy, reference, None, rollout, rewards, SETTINGS, 1.0)
    now, before = _distributions(policy, rollout), _distributions(reference, rollout)
    true_kl = _true_kl(now, before, rollout)
    assert abs(stats.kl - true_kl) < 1e-4 * max(1.0, true_kl)
    tokens = rollout.input_ids[:, 1:].unsqueeze(-1)
    diff = (before.gather(-1, tokens) - now.gather(-1, tokens)).squeeze(-1)
    k3_mean = masked_mean(torch.exp(diff) - diff - 1, rollout.mask).item()
    capped_mean = masked_mean(
        kl_k3(now.gather(-1, tokens).squeeze(-1), before.gather(-1, tokens).squeeze(-1)), rollout.mask
    ).item()
    assert k3_mean > 3 * true_kl and capped_mean > true_kl


def _distributions(model: torch.nn.Module, rollout) -> torch.Tensor:
    with torch.no_grad():
        return next_token_logprobs(model, rollout.input_ids, rollout.attention_mask, 1.0)


def _true_kl(policy_all: torch.Tensor, reference_all: torch.Tensor, rollout) -> float:
    """Token mean over the outputs of KL(policy || reference), summed over the whole vocabulary."""
    per_position = (policy_all.exp() * (policy_all - reference_all)).sum(-1)
    return masked_mean(per_position, rollout.mask).item()


def test_k3_is_capped_per_token_where_the_policy_finds_a_token_far_less_likely_than_the_reference():
    logprobs = torch.tensor([-25.0, -1.0])  # the policy has all but ruled out the first token
    ref = torch.tensor([-1.0, -1.0])
    kl = kl_k3(logprobs, ref)
    assert kl[0].item() == KL_K3_MAX  # exp(24) - 25 uncapped: one token would swamp the mean
    assert kl[1].item() == 0.0


def test_the_reference_run_a_row_at_a_time_gives_the_same_log_probs_and_kl(tiny_model, monkeypatch):
    """The reference's distributions are held a few rows at a time (bounded memory beside the
    policy's): rows of different lengths give what one batched pass gives."""
    from rollflow.runtime.trainer import algorithm

    torch.manual_seed(0)
    policy, reference = load_policy(tiny_model), load_reference(tiny_model)
    with torch.no_grad():
        for parameter in policy.parameters():
            parameter.add_(0.01 * torch.randn_like(parameter))
    generator = torch.Generator().manual_seed(3)
    prompt = torch.randint(3, 400, (5,), generator=generator).tolist()
    samples = [
        {"prompt_ids": prompt, "output_ids": torch.randint(3, 400, (n,), generator=generator).tolist()}
        | {"output_logprobs": [0.0] * n, "spans": []}
        for n in (3, 7, 12)
    ]
    rollout = to_tensors([samples], pad_id=0)
    batched = algorithm._reference(reference, rollout, _distributions(policy, rollout), 1.0)
    monkeypatch.setattr(algorithm, "REFERENCE_CHUNK_ELEMENTS", 1)
    by_row = algorithm._reference(reference, rollout, _distributions(policy, rollout), 1.0)
    assert torch.allclose(batched[0] * rollout.mask, by_row[0] * rollout.mask, atol=1e-5)
    assert abs(batched[1] - by_row[1]) < 1e-5 and batched[1] > 0
