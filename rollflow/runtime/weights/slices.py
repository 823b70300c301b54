"""Which slice of each tensor a tensor-parallel engine rank holds: the one spec that the engine
(which shards its model), the weight store (which serves per-rank payloads) and a trainer that
serves its own shards all read.

Megatron-style splits of a Llama-shaped model, by parameter name:

    q_proj, k_proj, v_proj, gate_proj, up_proj   column parallel: rows (dim 0, output features)
                                                 split in N equal parts; rank r holds part r
    o_proj, down_proj                            row parallel: columns (dim 1, input features)
                                                 split in N equal parts; the ranks' partial
                                                 outputs are summed (one all-reduce per block)
    embed_tokens, lm_head                        vocabulary parallel: rows (dim 0, token ids)
                                                 split in N equal parts; an id embeds on the rank
                                                 that holds it (all-reduce), logits are gathered
    everything else (norms)                      replicated: every rank holds all of it

So a rank holds about 1/N of the model (the norms are the only copies). Equal parts of q/k/v rows
are whole heads when N divides the head counts, which the engine checks (`check_divisible`) with
the MLP and vocabulary sizes before it serves. Row-parallel layers must have no bias (a bias would
be added N times by the sum).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

COLUMN_PARALLEL = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
"""Modules whose output features are split: each rank computes its heads / its MLP columns."""
ROW_PARALLEL = ("self_attn.o_proj", "mlp.down_proj")
"""Modules whose input features are split: each rank's output is a partial sum."""
VOCAB_PARALLEL = ("embed_tokens", "lm_head")
"""Modules whose vocabulary rows are split: each rank embeds, or scores, its part of the ids."""


def split_dim(name: str) -> int | None:
    """The dim along which tensor `name` is split across ranks; None when every rank holds all of it."""
    module, _, kind = name.rpartition(".")
    if module.endswith(COLUMN_PARALLEL) and kind in ("weight", "bias"):
        return 0
    if module.endswith(ROW_PARALLEL) and kind == "weight":
        return 1
    if module.endswith(VOCAB_PARALLEL) and kind == "weight":
        return 0
    return None


def rank_slices(name: str, shape: tuple[int, ...], tp_size: int, rank: int) -> tuple[int, slice] | None:
    """(dim, slice) of tensor `name` (of full `shape`) that rank `rank` of `tp_size` holds, or None
    when it holds the whole tensor. ValueError when the split dim does not divide by `tp_size`."""
    if not 0 <= rank < tp_size:
        raise ValueError(f"rank {rank} is outside 0..{tp_size - 1}")
    dim = split_dim(name)
    if dim is None or tp_size == 1:
        return None
    if len(shape) <= dim or shape[dim] % tp_size:
        raise ValueError(f"tensor {name} of shape {list(shape)} cannot be split in {tp_size} along dim {dim}")
    part = shape[dim] // tp_size
    return dim, slice(rank * part, (rank + 1) * part)


def shard_tensor(name: str, tensor: torch.Tensor, tp_size: int, rank: int) -> torch.Tensor:
    """Rank `rank`'s slice of `tensor`, contiguous (the tensor itself when it is replicated)."""
    where = rank_slices(name, tuple(tensor.shape), tp_size, rank)
    if where is None:
        return tensor
    dim, part = where
    return tensor.narrow(dim, part.start, part.stop - part.start).contiguous()


def shard_state(state: Mapping[str, torch.Tensor], tp_size: int, rank: int) -> dict[str, torch.Tensor]:
    """Rank `rank`'s slices of every tensor in `state` (a whole model or any subset of it)."""
    return {name: shard_tensor(name, tensor, tp_size, rank) for name, tensor in state.items()}


def check_divisible(
    num_heads: int, num_kv_heads: int, mlp_dim: int, vocab_size: int, tp_size: int
) -> str | None:
    """Why a model of these sizes cannot be split in `tp_size` ranks, or None when it can."""
    for what, size in (
        ("attention heads", num_heads),
        ("key/value heads", num_kv_heads),
        ("MLP size", mlp_dim),
        ("vocabulary", vocab_size),
    ):
        if size % tp_size:
            return f"--tensor-parallel {tp_size} must divide the model's {what} ({size})"
    return None
