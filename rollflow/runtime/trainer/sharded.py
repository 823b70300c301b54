"""FSDP2 (`parallelism: fsdp`): each rank holds 1/world of every parameter, gradient and optimizer state.

`fully_shard` shards each transformer block, then the rest of the model, along dimension 0 over
the torchrun ranks; a forward all-gathers a block's parameters just before it runs and frees them
after, and a backward reduce-scatters (averages) its gradients, so each rank keeps and steps only
its own shard. What the trainer sends each rank (its share of a micro-batch, scaled as under DDP)
is unchanged, so the gradient average is the single-process gradient, as under DDP.

What needs the whole model is collective: rank 0 asks, every rank joins.
- A weight version for the engines: the full state dict, gathered on rank 0 only, in CPU memory
  (`full_state_dict`), written as the same `save_pretrained` folder as every other trainer writes.
- A checkpoint: each rank writes its own shards of the model and optimizer state with
  torch.distributed.checkpoint (no rank ever holds the whole optimizer state, which is twice the
  model under Adam), into one folder that every rank must see (one node, or a shared file system).
  DCP reshards on load, so a run may resume on another number of ranks.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

SHARDS_DIR = "shards"  # in a checkpoint folder: torch.distributed.checkpoint's files


def _blocks(module: nn.Module) -> list[nn.Module]:
    """The transformer blocks of every Hugging Face model inside `module` (their `_no_split_modules`)."""
    names: set[str] = set()
    for child in module.modules():
        names.update(getattr(child, "_no_split_modules", None) or ())
    return [child for child in module.modules() if type(child).__name__ in names]


def shard(module: nn.Module, device: torch.device, world_size: int) -> nn.Module:
    """`module`, fully sharded in place over the default process group (block by block, then the rest).

    Each block is its own unit so that only one block's full parameters exist at a time; the root
    unit holds the embeddings and the head (tied or not, they stay together)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (world_size,))
    for block in _blocks(module):
        fully_shard(block, mesh=mesh)
    fully_shard(module, mesh=mesh)
    return module


def full_state_dict(module: nn.Module) -> dict[str, torch.Tensor]:
    """Collective: the whole of `module`'s state on rank 0 (in CPU memory), an empty dict elsewhere."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def _trained(policy: nn.Module, critic: nn.Module | None) -> nn.Module:
    """One module over what the optimizer steps, so its state is named by parameter path."""
    modules = {"policy": policy} if critic is None else {"policy": policy, "critic": critic}
    return nn.ModuleDict(modules)


def save_shards(
    folder: Path, policy: nn.Module, critic: nn.Module | None, optimizer: torch.optim.Optimizer
) -> None:
    """Collective: every rank writes its shards of the model and optimizer state under `folder`."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(_trained(policy, critic), optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=folder / SHARDS_DIR)


def load_shards(
    folder: Path, policy: nn.Module, critic: nn.Module | None, optimizer: torch.optim.Optimizer
) -> None:
    """Collective: every rank reads its shards (resharded to this world size) into the sharded modules."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    trained = _trained(policy, critic)
    model_state, optimizer_state = get_state_dict(trained, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=folder / SHARDS_DIR)
    set_state_dict(trained, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def is_sharded(checkpoint: Path) -> bool:
    """Whether `checkpoint` was written by FSDP ranks (shards) rather than whole (one process, DDP)."""
    return (checkpoint / SHARDS_DIR).is_dir()
