"""Pick the next token from one position's logits: greedy at temperature 0, else top-k/top-p sampling.

The logprob returned is that of the chosen token under the distribution it was drawn from
(logits / temperature, before top-k/top-p truncation; the raw logits when greedy), which is the
behaviour-policy logprob an RL trainer compares its own against.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Temperatures below this decode greedily (SGLang's rule): logits / 1e-38 overflow to inf, and
# sampling from the resulting NaN distribution is an error rather than a draw.
GREEDY_BELOW = 1e-6


@dataclass(frozen=True)
class SamplingOptions:
    """One request's sampling settings, as the generation thread uses them."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    # -1 keeps every token
    top_k: int = -1
    ignore_eos: bool = False
    stop_token_ids: frozenset[int] = frozenset()
    # seed of the request's own generator; None lets the engine draw one
    seed: int | None = None


def position_seed(seed: int, position: int) -> int:
    """Seed of the draw for the token at `position` (prompt included) of a request seeded `seed`.

    Keyed by position, a request resumed from prompt + generated tokens, with the same seed, draws
    the tokens the uninterrupted one would have: a sample moved between engines stays reproducible.
    """
    return (seed * 6364136223846793005 + position * 1442695040888963407 + 1) % 2**64


def sample_next_token(
    logits: torch.Tensor, options: SamplingOptions, generator: torch.Generator | None
) -> tuple[int, float]:
    """Return (token id, its logprob) for a 1-D tensor of next-token logits."""
    if options.temperature < GREEDY_BELOW:
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        token = int(torch.argmax(logprobs))
        return token, float(logprobs[token])
    logprobs = torch.log_softmax(logits.float() / options.temperature, dim=-1)
    probs = logprobs.exp()
    if 0 < options.top_k < probs.numel():
        kth = torch.topk(probs, options.top_k).values[-1]
        probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    if options.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        mass_before = torch.cumsum(sorted_probs, dim=0) - sorted_probs
        sorted_probs[mass_before >= options.top_p * sorted_probs.sum()] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    token = int(torch.multinomial(probs, 1, generator=generator))
    return token, float(logprobs[token])
