"""One rank's models and optimizer, and how a step's training is spread over the ranks.

The `Trainer` (loop.py) decides what to train on and when; the `Learner` owns what is trained: the
policy, the frozen reference, PPO's critic and the optimizer, with the checkpoint state that belongs to
them. It runs a micro-batch's backward and a mini-batch's optimizer step alone, over torchrun's ranks
(`parallel`, distributed.py: every rank other than 0 only `obey`s rank 0) or over an elastic actor's
ranks (`actor`, elastic.py: they drive `backward` and `optimizer_step` directly), and hands out a
weight version as a folder engines load or, under fsdp with mooncake, as each rank's shard.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rollflow.errors import UserError
from rollflow.runtime.trainer import checkpoints
from rollflow.runtime.trainer.algorithm import LossSettings, MicroBatchStats, backward_micro_batch
from rollflow.runtime.trainer.config import TrainConfig
from rollflow.runtime.trainer.distributed import (
    Command,
    DataParallel,
    SaveShards,
    Share,
    idle_rollout,
    split_micro_batch,
)
from rollflow.runtime.trainer.models import Critic, load_policy, load_reference
from rollflow.runtime.trainer.rollouts import model_output, to_tensors
from rollflow.runtime.trainer.shard_export import ExportShards, start_rank_shards
from rollflow.runtime.trainer.sharded import full_state_dict, is_sharded, load_shards, save_shards
from rollflow.runtime.trainer.tasks import load_callable

if TYPE_CHECKING:
    from rollflow.runtime.trainer.elastic import ElasticActor


@dataclass(frozen=True)
class MicroBatchRecord:
    """What one rank's backward of (its share of) a micro-batch adds to the step's totals."""

    rewards: list[float]
    stats: MicroBatchStats | None  # None: the rank had no samples
    tokens: int
    resumed: int


@dataclass
class StepTotals:
    """What the micro-batches of one step add up to."""

    rewards: list[float] = field(default_factory=list)
    stats: list[tuple[MicroBatchStats, int]] = field(default_factory=list)  # (stats, output tokens)
    rejected: int = 0
    resumed: int = 0
    tokens: int = 0
    last_arrival: float | None = None  # the timer's clock when the last micro-batch arrived

    def add(self, record: MicroBatchRecord) -> None:
        self.rewards += record.rewards
        if record.stats is not None:
            self.stats.append((record.stats, record.tokens))
        self.tokens += record.tokens
        self.resumed += record.resumed

    def token_mean(self, name: str) -> float:
        total = sum(tokens for _, tokens in self.stats)
        return sum(getattr(s, name) * tokens for s, tokens in self.stats) / max(total, 1)


class Learner:
    def __init__(
        self, config: TrainConfig, tokenizer: Any, parallel: DataParallel | None, checkpoint: Path | None
    ) -> None:
        """Load the models (from `checkpoint` when resuming, else from `config.model`) onto this rank's
        device. `parallel`: this process's rank under torchrun; None trains alone (or leads an actor)."""
        self.config = config
        self.tokenizer = tokenizer
        self.parallel = parallel
        self.actor: ElasticActor | None = None  # set by elastic.start_elastic: this process leads it
        self.reward_fn = load_callable(config.reward, "reward")
        torch.manual_seed(config.seed)
        self.sharded = parallel is not None and parallel.sharded  # fsdp under torchrun
        if checkpoint is not None:
            _check_checkpoint_kind(checkpoint, self.sharded)
        self.device = parallel.device if parallel is not None else torch.device(config.device)
        # a sharded checkpoint holds no whole policy: start from `model`'s, then read the shards into it
        start_from = checkpoint or Path(config.model)
        self.policy = load_policy(config.model if self.sharded else start_from).to(self.device)
        self.policy.train()
        # with an inference placement, inference workers give the reference log-probs (start_inference)
        places_inference = config.cluster is not None and "inference" in config.cluster.component_placement
        self.reference = None if places_inference else load_reference(config.model).to(self.device)
        self.critic = Critic(config.model).to(self.device) if config.algorithm == "ppo" else None
        if self.sharded:  # before the optimizer is made: sharding replaces the parameters
            self.policy = parallel.wrap(self.policy)
            self.critic = parallel.wrap(self.critic) if self.critic is not None else None
            # the frozen reference too: a model too big for one device is as big when frozen
            self.reference = parallel.wrap(self.reference) if self.reference is not None else None
        self.parameters = list(self.policy.parameters())
        if self.critic is not None:
            self.parameters += list(self.critic.parameters())
        self.optimizer = torch.optim.AdamW(self.parameters, lr=config.lr, weight_decay=0.0)
        if checkpoint is not None:
            self._restore(checkpoint)
        # the modules that run forward/backward: DDP wrappers under torchrun (saving uses the bare ones)
        self.train_policy, self.train_critic = self.policy, self.critic
        if parallel is not None and not self.sharded:
            self.train_policy = parallel.wrap(self.policy)
            self.train_critic = parallel.wrap(self.critic) if self.critic is not None else None
        self.settings = LossSettings(
            config.algorithm,
            config.clip,
            config.kl_coef,
            config.temperature,
            config.gamma,
            config.gae_lambda,
            config.value_coef,
        )
        # fsdp with mooncake: each rank exports its own shard of every version (collective: every rank)
        self.shards = start_rank_shards(config, parallel, self.policy)

    def _restore(self, checkpoint: Path) -> None:
        """The optimizer's and critic's state (fsdp: every model's shards) from `checkpoint`."""
        state = checkpoints.read_state(checkpoint)
        has_critic = state.get("critic", (checkpoint / "critic.pt").is_file())
        if has_critic != (self.critic is not None):
            raise UserError(
                f"{checkpoint} was written by a {'ppo' if has_critic else 'grpo'} run; resume it with that "
                "algorithm, or start over with --resume never"
            )
        if self.sharded:
            load_shards(checkpoint, self.policy, self.critic, self.optimizer)
            return
        self.optimizer.load_state_dict(torch.load(checkpoint / "optimizer.pt", map_location=self.device))
        if self.critic is not None:
            self.critic.load_state_dict(torch.load(checkpoint / "critic.pt", map_location=self.device))

    def num_ranks(self) -> int:
        """Ranks training the current mini-batch: the GPUs a phase is timed on."""
        if self.actor is not None:
            return self.actor.active_ranks
        return self.parallel.world_size if self.parallel is not None else 1

    def train_micro_batch(self, groups: list[list[dict]], totals: StepTotals, scale: float) -> None:
        """Every rank training the mini-batch backpropagates its share of the micro-batch."""
        if self.actor is not None:
            self.actor.train_micro_batch(groups, totals, scale)
            return
        if self.parallel is None:
            totals.add(self.backward(groups, scale))
            return
        share = self.parallel.send(split_micro_batch(groups, scale, self.parallel.world_size))
        for record in self.parallel.gather(self.backward(share.groups, share.loss_scale)):
            totals.add(record)

    def backward(self, groups: list[list[dict]], scale: float) -> MicroBatchRecord:
        """This rank's backward of (its share of) a micro-batch, its loss scaled by `scale`; gradients
        accumulate until `optimizer_step`. Called by `train_micro_batch` and `obey`, and by elastic.py:
        on rank 0 by `ElasticActor.train_micro_batch`, on every other rank by its `_serve` loop."""
        samples = [s for group in groups for s in group]
        rewards = [float(self.reward_fn(s["prompt_ids"], model_output(s), self.tokenizer)) for s in samples]
        if samples:
            rollout = to_tensors(groups, self.tokenizer.pad_token_id).to(self.device)
        else:  # an empty share under torchrun: join the gradient all-reduce with nothing
            rollout = idle_rollout(self.tokenizer.pad_token_id, self.device)
        stats = backward_micro_batch(
            self.train_policy,
            self.reference,
            self.train_critic,
            rollout,
            torch.tensor(rewards or [0.0], device=self.device),
            self.settings,
            scale,
        )
        tokens = sum(len(model_output(s)) for s in samples)
        resumed = sum(s["resumes"] > 0 for s in samples)
        return MicroBatchRecord(rewards, stats if samples else None, tokens, resumed)

    def optimizer_step(self) -> None:
        """Sum the ranks' gradients (torchrun's or the elastic actor's), clip and step the optimizer.
        Called by the trainer at each mini-batch end, and by elastic.py on every other active rank."""
        if self.parallel is not None and self.parallel.is_leader:
            self.parallel.tell_all(Command.OPTIMIZER_STEP)
        if self.actor is not None:
            self.actor.sum_gradients()
        torch.nn.utils.clip_grad_norm_(self.parameters, self.config.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def obey(self) -> bool:
        """A torchrun rank other than 0: carry out rank 0's next message; False once told to stop."""
        message = self.parallel.receive()
        if message is Command.STOP:
            return False
        if message is Command.OPTIMIZER_STEP:
            self.optimizer_step()
        elif message is Command.GATHER_WEIGHTS:
            full_state_dict(self.policy)  # the whole policy lands on rank 0 only
        elif isinstance(message, ExportShards):
            self.parallel.gather(self.shards.export(self.policy, message.version))
        elif isinstance(message, SaveShards):
            save_shards(message.folder, self.policy, self.critic, self.optimizer)
        else:
            assert isinstance(message, Share)
            self.parallel.gather(self.backward(message.groups, message.loss_scale))
        return True

    def end_step(self) -> None:
        """The step's training is over: an elastic actor returns to its base size."""
        if self.actor is not None:
            self.actor.end_step()

    def stop_ranks(self) -> None:
        """The run is over: torchrun's other ranks leave their `obey` loop."""
        if self.parallel is not None:
            self.parallel.tell_all(Command.STOP)

    def close(self) -> None:
        """Stop the elastic actor's other ranks, if this process leads one."""
        if self.actor is not None:
            self.actor.close()

    def write_weights(self, folder: Path) -> Path:
        """The policy as a `save_pretrained` folder engines load (fsdp: gathered from every rank first)."""
        if not self.sharded:
            return checkpoints.save_pretrained(self.policy, self.tokenizer, folder)
        self.parallel.tell_all(Command.GATHER_WEIGHTS)
        state = full_state_dict(self.policy)
        return checkpoints.save_pretrained(self.policy, self.tokenizer, folder, state_dict=state)

    def save_checkpoint(self, output_dir: Path, step: int, state: dict[str, Any]) -> None:
        """checkpoints/step_N: the models and optimizer, with the trainer's own `state` (fsdp: every
        rank writes its shards)."""
        if not self.sharded:
            checkpoints.save_checkpoint(
                output_dir, step, self.policy, self.tokenizer, self.optimizer, self.critic, state
            )
            return
        state = {**state, "critic": self.critic is not None}
        checkpoints.save_sharded_checkpoint(output_dir, step, self.tokenizer, state, self._write_shards)

    def _write_shards(self, folder: Path) -> None:
        """fsdp: every rank writes its shards of the model and optimizer state into `folder`."""
        self.parallel.tell_all(SaveShards(folder))
        save_shards(folder, self.policy, self.critic, self.optimizer)


def _check_checkpoint_kind(checkpoint: Path, sharded: bool) -> None:
    """A sharded (fsdp) checkpoint resumes only under fsdp, a whole one (one process, ddp) only without it."""
    if is_sharded(checkpoint) == sharded:
        return
    if sharded:
        raise UserError(
            f"{checkpoint} holds a whole model (written by one process or parallelism: ddp); resume it "
            "that way, or start over with --resume never"
        )
    raise UserError(
        f"{checkpoint} holds FSDP shards (parallelism: fsdp); resume it under torchrun with "
        "parallelism: fsdp, or start over with --resume never"
    )
