"""Pick the next token from one position's logits, as SGLang's sampler does.

Order: penalties on the tokens generated so far (frequency, presence, repetition), end tokens masked
until `min_new_tokens`, then greedy at temperature 0, else temperature, top-k, top-p and min-p.
The logprob returned is that of the chosen token under the distribution it was drawn from (after
penalties and temperature, before top-k/top-p/min-p truncation; the penalised logits when greedy),
which is the behaviour-policy logprob an RL trainer compares its own against.
"""

from __future__ import annotations

from collections.abc import Collection

import torch

from rollflow.runtime.wire.base import SamplingParams

# Temperatures below this decode greedily (SGLang's rule): logits / 1e-38 overflow to inf, and
# sampling from the resulting NaN distribution is an error rather than a draw.
GREEDY_BELOW = 1e-6


def penalised_logits(
    logits: torch.Tensor, params: SamplingParams, generated: list[int], banned: Collection[int]
) -> torch.Tensor:
    """The logits after the penalties on `generated` and with `banned` tokens made impossible."""
    logits = logits.float().clone()
    penalise = params.frequency_penalty or params.presence_penalty or params.repetition_penalty != 1.0
    if generated and penalise:
        counts = torch.bincount(torch.tensor(generated, dtype=torch.long), minlength=logits.numel())
        counts = counts[: logits.numel()].float()
        seen = counts > 0
        logits -= params.frequency_penalty * counts + params.presence_penalty * seen.float()
        if params.repetition_penalty != 1.0:
            scaled = torch.where(
                logits > 0, logits / params.repetition_penalty, logits * params.repetition_penalty
            )
            logits = torch.where(seen, scaled, logits)
    if banned:
        index = torch.tensor([t for t in banned if 0 <= t < logits.numel()], dtype=torch.long)
        logits[index] = float("-inf")
    return logits


def position_seed(seed: int, position: int) -> int:
    """Seed of the draw for the token at `position` (prompt included) of a request seeded `seed`.

    Keyed by position, a request resumed from prompt + generated tokens, with the same seed, draws
    the tokens the uninterrupted one would have: a sample moved between engines stays reproducible.
    """
    return (seed * 6364136223846793005 + position * 1442695040888963407 + 1) % 2**64


def sample_next_token(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
    generated: list[int] | None = None,
    banned: Collection[int] = (),
) -> tuple[int, float]:
    """Return (token id, its logprob) for a 1-D tensor of next-token logits; `generated` are the
    tokens this request produced so far (for the penalties), `banned` tokens cannot be chosen."""
    logits = penalised_logits(logits, params, generated or [], banned)
    if params.temperature < GREEDY_BELOW:
        logprobs = torch.log_softmax(logits, dim=-1)
        token = int(torch.argmax(logprobs))
        return token, float(logprobs[token])
    logprobs = torch.log_softmax(logits / params.temperature, dim=-1)
    probs = logprobs.exp()
    if 0 < params.top_k < probs.numel():
        kth = torch.topk(probs, params.top_k).values[-1]
        probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        mass_before = torch.cumsum(sorted_probs, dim=0) - sorted_probs
        sorted_probs[mass_before >= params.top_p * sorted_probs.sum()] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    if params.min_p > 0.0:
        probs = torch.where(probs >= params.min_p * probs.max(), probs, torch.zeros_like(probs))
    token = int(torch.multinomial(probs, 1, generator=generator))
    return token, float(logprobs[token])
