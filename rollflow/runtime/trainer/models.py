"""The trainer's networks: the policy, its frozen reference copy, and (PPO) a critic with a value head."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn


def load_policy(model_dir: str | Path) -> nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


def load_reference(model_dir: str | Path) -> nn.Module:
    model = load_policy(model_dir)
    model.eval()
    model.requires_grad_(False)
    return model


class Critic(nn.Module):
    """The policy's transformer body (initialised from the same checkpoint) and a scalar value per position."""

    def __init__(self, model_dir: str | Path) -> None:
        super().__init__()
        # the causal LM's body, not AutoModel on its folder: the checkpoint holds an LM head too, which
        # AutoModel would report as UNEXPECTED keys on every load (a critic drops the head on purpose)
        self.body = load_policy(model_dir).base_model
        self.value_head = nn.Linear(self.body.config.hidden_size, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """[B, T-1]: value of the state before token t+1 (aligned with the log-prob rows)."""
        hidden = self.body(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        # a copy, not a view: FSDP2 hooks the module's output for its backward, which a view may skip
        return self.value_head(hidden[:, :-1]).squeeze(-1).clone()


def next_token_logprobs(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float
) -> torch.Tensor:
    """[B, T-1, V] log-probs of the next token, from logits divided by the sampling temperature
    (as the engines do when they record logprobs, so the importance ratio compares like with like)."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float() / temperature
    return torch.log_softmax(logits, dim=-1)


def gather_tokens(logprobs_all: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """[B, T-1] log-prob of token t+1, picked from the `[B, T-1, V]` distributions."""
    return logprobs_all.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def token_logprobs(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float
) -> torch.Tensor:
    """[B, T-1] log-prob of token t+1 (the reference model needs no entropy)."""
    return gather_tokens(next_token_logprobs(model, input_ids, attention_mask, temperature), input_ids)


def token_logprobs_and_entropy(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, T-1] log-prob of token t+1 and the entropy of the distribution it was drawn from."""
    logprobs_all = next_token_logprobs(model, input_ids, attention_mask, temperature)
    logprobs = gather_tokens(logprobs_all, input_ids)
    entropy = -(logprobs_all.exp() * logprobs_all).sum(-1)
    return logprobs, entropy
