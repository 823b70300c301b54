"""Data-parallel training under torchrun: rank 0 leads, every rank trains on its share of each micro-batch.

Rank 0 alone talks to the manager. For each micro-batch it sends every rank a share of the groups
(`groups[rank::world]`) and the micro-batch's output-token count; each rank backpropagates its
share through DistributedDataParallel, whose all-reduce averages the gradients over the ranks.
Every loss is a token mean over the whole micro-batch, so a rank scales its share's token-mean
loss by `world * share tokens / micro-batch tokens`: the average is then exactly the
single-process gradient. A rank with no groups still joins the all-reduce with a zero-weight
backward on one padding row. Rank 0 also tells every rank when to take an optimizer step and when
to stop, so all ranks step together and their weights stay equal.

With `parallelism: fsdp` the same messages drive FSDP2 instead of DDP (sharded.py): the gradient
average is the same, but each rank keeps only its shard of the weights, so rank 0 also asks every
rank to join when it needs the whole model (a weight version) or writes a checkpoint (shards).
"""

from __future__ import annotations

import enum
import gc
import logging
import os
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from torch import distributed as dist
from torch import nn

from rollflow.errors import UserError
from rollflow.runtime.trainer.rollouts import RolloutTensors

log = logging.getLogger(__name__)


class Command(enum.Enum):
    """What rank 0 tells every rank besides a micro-batch share."""

    OPTIMIZER_STEP = "optimizer_step"
    GATHER_WEIGHTS = "gather_weights"  # fsdp: join gathering the full policy on rank 0
    STOP = "stop"


@dataclass(frozen=True)
class SaveShards:
    """fsdp: every rank writes its shards of a checkpoint into `folder` (one all ranks see)."""

    folder: Path


@dataclass(frozen=True)
class Share:
    """One rank's part of a micro-batch."""

    groups: list[list[dict]]  # groups[rank::world] of the accepted micro-batch (may be empty)
    loss_scale: float  # the trainer's scale x world x this share's output tokens / the micro-batch's


def output_tokens(groups: list[list[dict]]) -> int:
    """The output tokens of `groups`: the count every loss is a mean over."""
    return sum(len(sample["output_ids"]) for group in groups for sample in group)


def split_micro_batch(groups: list[list[dict]], scale: float, world_size: int) -> list[Share]:
    """Every rank's share of the micro-batch, round-robin by group (GRPO's groups stay whole)."""
    total = max(output_tokens(groups), 1)
    shares = []
    for rank in range(world_size):
        mine = groups[rank::world_size]
        shares.append(Share(mine, scale * world_size * output_tokens(mine) / total))
    return shares


def idle_rollout(pad_id: int, device: torch.device) -> RolloutTensors:
    """One padding row with no output token: a rank with an empty share backpropagates it at weight 0,
    so it still joins DDP's gradient all-reduce (and adds nothing to it)."""
    row = torch.full((1, 2), pad_id, dtype=torch.long)
    return RolloutTensors(
        input_ids=row,
        attention_mask=torch.ones_like(row),
        mask=torch.zeros((1, 1)),
        old_logprobs=torch.zeros((1, 1)),
        group_ids=torch.zeros(1, dtype=torch.long),
        last_index=torch.zeros(1, dtype=torch.long),
    ).to(device)


class DataParallel:
    """This process's place in the torchrun job, and the few collectives the trainer needs."""

    def __init__(
        self, rank: int, world_size: int, device: torch.device, timeout_s: float, sharded: bool = False
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.timeout_s = timeout_s
        self.sharded = sharded  # fsdp: each rank holds a shard of the parameters; ddp: all of them

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def wrap(self, module: nn.Module) -> nn.Module:
        """fsdp: `module` sharded in place (before its optimizer is made: its parameters are replaced).
        ddp: a DDP wrapper over `module` (its parameters are broadcast from rank 0 here)."""
        if self.sharded:
            from rollflow.runtime.trainer.sharded import shard

            return shard(module, self.device, self.world_size)
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(module, device_ids=device_ids)

    def broadcast(self, value: Any) -> Any:
        """Rank 0's `value` on every rank."""
        box = [value]
        self._collective(dist.broadcast_object_list, box, src=0)
        return box[0]

    def send(self, per_rank: list[Any]) -> Any:
        """Rank 0: give rank r `per_rank[r]` and return its own."""
        received: list[Any] = [None]
        self._collective(dist.scatter_object_list, received, per_rank, src=0)
        return received[0]

    def tell_all(self, command: Command | SaveShards) -> None:
        """Rank 0: the same command to every rank."""
        self.send([command] * self.world_size)

    def receive(self) -> Share | Command | SaveShards:
        """Other ranks: the next message from rank 0."""
        received: list[Any] = [None]
        self._collective(dist.scatter_object_list, received, None, src=0)
        return received[0]

    def gather(self, value: Any) -> list[Any]:
        """Every rank's `value`, in rank order, on rank 0 (an empty list elsewhere)."""
        gathered = [None] * self.world_size if self.is_leader else None
        self._collective(dist.gather_object, value, gathered, dst=0)
        return gathered or []

    def close(self, wait_for_peers: bool) -> None:
        """Leave the job; after a clean run, only once every rank has finished.

        gloo's threads abort the process ("terminate called without an active exception") when a
        peer tears its sockets down while work is in flight, or when the group is first freed during
        interpreter teardown (pytorch#179291). So every rank meets at a barrier, then frees the group
        while the interpreter is whole. After an error nobody waits: the peers may be gone.
        """
        if wait_for_peers:
            self._collective(dist.barrier)
        gc.collect()  # the caller dropped its DDP/FSDP modules; collect any cycle still holding the group
        dist.destroy_process_group()

    def _collective(self, fn: Any, *args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except RuntimeError as exc:
            raise RuntimeError(
                f"rank {self.rank}/{self.world_size}: a collective failed; another rank died or did not "
                f"answer within distributed_timeout_s={self.timeout_s:g} (see its log): {exc}"
            ) from exc


def init_from_env(device: str, timeout_s: float, parallelism: str = "ddp") -> DataParallel | None:
    """The process group of a torchrun job (nccl on cuda, gloo on cpu); None outside torchrun.

    `parallelism`: ddp (every rank holds the whole model) or fsdp (each holds a shard).

    A world of one process is not distributed: the trainer runs exactly as without torchrun.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return None
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    wanted = torch.device(device)
    if wanted.type == "cuda":
        if wanted.index is not None:
            raise UserError(
                f"device: {device!r} under torchrun; set device: cuda (each rank takes cuda:LOCAL_RANK)"
            )
        if local_rank >= torch.cuda.device_count():
            raise UserError(
                f"torchrun started local rank {local_rank}, but torch sees {torch.cuda.device_count()} "
                "CUDA GPU(s): start at most that many processes per node"
            )
        placed = torch.device("cuda", local_rank)
        torch.cuda.set_device(placed)
        backend = "nccl"
    elif wanted.type == "cpu":
        placed, backend = wanted, "gloo"
    else:
        raise UserError(f"device: {device!r} under torchrun; use cpu (gloo) or cuda (nccl)")
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    sharded = parallelism == "fsdp"
    if rank == 0:
        how = f", fsdp: each rank holds 1/{world_size} of the parameters" if sharded else ""
        log.info("data parallel over %d ranks (%s, %s)%s", world_size, backend, placed.type, how)
    return DataParallel(rank, world_size, placed, timeout_s, sharded)
