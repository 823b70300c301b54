"""Samples from the manager -> what the trainer accepts -> padded tensors.

A sample dict is the manager's (`prompt_ids`, `output_ids`, `output_logprobs`, `spans`, ...); each
span names the weight version that made its tokens, so staleness is decided per token range. A
multi-turn episode's (episodes.py) adds `loss_mask` over its output: 0 on the environment's tokens,
which are context for the model but not its actions, so no loss, KL or advantage falls on them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch


def oldest_version(sample: dict) -> int | None:
    """The oldest weight version that made any of the sample's tokens (None: no version recorded)."""
    versions = [span["weight_version"] for span in sample["spans"] if span["weight_version"] is not None]
    return min(versions) if versions else None


def filter_stale(
    groups: list[list[dict]], trainer_version: int, max_staleness: int
) -> tuple[list[list[dict]], int]:
    """Drop samples any token of which is more than `max_staleness` versions behind; (kept groups, dropped).

    A sample without a recorded version (an engine that does not report one) is kept: its age is unknown,
    not known to be too old. Groups left empty disappear.
    """
    kept_groups, dropped = [], 0
    for group in groups:
        kept = []
        for sample in group:
            oldest = oldest_version(sample)
            if oldest is not None and trainer_version - oldest > max_staleness:
                dropped += 1
            else:
                kept.append(sample)
        if kept:
            kept_groups.append(kept)
    return kept_groups, dropped


@dataclass(frozen=True)
class RolloutTensors:
    """Prompt + output rows, right-padded; position t of the `*_logprobs`/`mask` rows scores token t+1."""

    input_ids: torch.Tensor  # [B, T] prompt then output tokens, pad_id after
    attention_mask: torch.Tensor  # [B, T] 1 on real tokens
    mask: torch.Tensor  # [B, T-1] 1 where the predicted token (t+1) is a generated output token
    old_logprobs: torch.Tensor  # [B, T-1] the engine's recorded logprob of token t+1 (0 off the mask)
    group_ids: torch.Tensor  # [B] index of the sample's group in the micro-batch
    last_index: torch.Tensor  # [B] position in the [B, T-1] rows of the sample's last output token
    ref_logprobs: torch.Tensor | None = (
        None  # [B, T-1] the reference model's, when inference workers gave them
    )

    def to(self, device: torch.device | str) -> RolloutTensors:
        fields = (getattr(self, f.name) for f in dataclasses.fields(self))
        return RolloutTensors(*(None if t is None else t.to(device) for t in fields))


def model_output(sample: dict) -> list[int]:
    """The tokens the model generated: the output less the environment's tokens of an episode."""
    mask = sample.get("loss_mask")
    if mask is None:
        return sample["output_ids"]
    return [token for token, keep in zip(sample["output_ids"], mask, strict=True) if keep]


def to_tensors(groups: list[list[dict]], pad_id: int) -> RolloutTensors:
    samples = [(g, s) for g, group in enumerate(groups) for s in group]
    length = max(len(s["prompt_ids"]) + len(s["output_ids"]) for _, s in samples)
    batch = len(samples)
    input_ids = torch.full((batch, length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((batch, length), dtype=torch.long)
    mask = torch.zeros((batch, length - 1))
    old_logprobs = torch.zeros((batch, length - 1))
    # the reference's log-probs, when inference workers computed them (every sample has them, or none)
    given_ref = all("ref_logprobs" in sample for _, sample in samples)
    ref_logprobs = torch.zeros((batch, length - 1)) if given_ref else None
    last_index = torch.zeros(batch, dtype=torch.long)
    for row, (_, sample) in enumerate(samples):
        prompt, output = sample["prompt_ids"], sample["output_ids"]
        tokens = prompt + output
        input_ids[row, : len(tokens)] = torch.tensor(tokens)
        attention_mask[row, : len(tokens)] = 1
        start, end = len(prompt) - 1, len(tokens) - 1
        mask[row, start:end] = (
            torch.tensor(sample["loss_mask"], dtype=mask.dtype) if "loss_mask" in sample else 1
        )
        # inference workers' recomputed old-policy log-probs (PPO), else the engine's recorded ones
        old = sample["old_logprobs"] if "old_logprobs" in sample else sample["output_logprobs"]
        old_logprobs[row, start:end] = torch.tensor(old, dtype=torch.float32)
        if ref_logprobs is not None:
            ref_logprobs[row, start:end] = torch.tensor(sample["ref_logprobs"], dtype=torch.float32)
        last_index[row] = max(end - 1, start)
    group_ids = torch.tensor([g for g, _ in samples])
    return RolloutTensors(input_ids, attention_mask, mask, old_logprobs, group_ids, last_index, ref_logprobs)
