"""The trainer's recomputed log-probs agree with the ones the engines recorded on the same weights.

This is what makes the importance ratio 1 on-policy: if the trainer misaligned tokens and
positions, or used another temperature, the ratio would be off before any update.
"""

import pytest
import torch

from rollflow.runtime.manager.client import ManagerClient
from rollflow.runtime.trainer.models import load_policy, token_logprobs_and_entropy
from rollflow.runtime.trainer.rollouts import to_tensors


@pytest.fixture(scope="module")
def manager(module_processes):
    engine = module_processes.engine()
    return module_processes.manager(engines=[{"url": engine.url}])


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_recomputed_logprobs_match_the_engines_recorded_ones(manager, tiny_model, temperature):
    batch = ManagerClient(manager.url).submit(
        [[17, 240, 33], [5, 6, 7, 8, 9]], n=3, max_new_tokens=10, temperature=temperature
    )
    groups = [group for micro_batch in batch.micro_batches(min_groups=2) for group in micro_batch]
    rollout = to_tensors(groups, pad_id=0)
    with torch.no_grad():
        logprobs, _ = token_logprobs_and_entropy(
            load_policy(tiny_model), rollout.input_ids, rollout.attention_mask, temperature
        )
    recorded = rollout.old_logprobs[rollout.mask > 0]
    assert recorded.numel() == sum(len(s["output_ids"]) for g in groups for s in g) > 0
    assert torch.allclose(logprobs[rollout.mask > 0], recorded, atol=1e-3)
