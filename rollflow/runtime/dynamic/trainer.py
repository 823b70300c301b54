"""The trainer of a run whose devices move: the streaming trainer, followed step by step by the executor.

Three things differ from `Trainer`, each so that a dynamic run learns exactly what a static one does:

- each step's batch carries a sampling seed (from `seed` and the step), and the manager derives one
  per sample, so two runs draw the same samples, however often a sample moves between engines;
- micro-batches are taken in submission order (groups 0..k-1, then k..2k-1, ...) rather than as
  groups finish, so the mini-batches, and the optimizer steps, are the same in both runs (except
  under partial rollout, which trains the groups that finish first by design);
- the executor follows each step: it starts when the step's training does, decides at every
  mini-batch end (rollout may release engines, the actor grows for the next mini-batch), and at
  step end wakes released engines before the weights are pushed, so they load the new version.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rollflow.runtime.dynamic.executor import DynamicExecutor, StepInputs
from rollflow.runtime.manager.client import BatchHandle
from rollflow.runtime.trainer.learner import StepTotals
from rollflow.runtime.trainer.loop import Trainer
from rollflow.runtime.trainer.partial import PartialStep

SEED_STRIDE = 1_000_003  # step seeds of runs with neighbouring `seed`s do not meet for a million steps


class DynamicTrainer(Trainer):
    executor: DynamicExecutor | None = None  # None: a static run (the same samples and mini-batches)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # the manager's counters at each step's end, before the next batch is submitted
        self.step_counters: list[dict[str, float]] = []

    @property
    def minibatch_samples(self) -> int:
        config = self.config
        return config.micro_batch_groups * config.mini_batch_micro_batches * config.n_samples

    @property
    def num_minibatches(self) -> int:
        return self.config.minibatches_per_step

    def follow(self, executor: DynamicExecutor) -> None:
        """Let `executor` move devices during every step from now on."""
        self.executor = executor
        self.minibatch_end_hooks.append(self._on_minibatch_end)

    def sampling_params(self) -> dict[str, Any]:
        # seeded per step, so a static and a dynamic run draw the same samples
        return super().sampling_params() | {"sampling_seed": self.config.seed * SEED_STRIDE + self.step}

    def train_on(self, batch: BatchHandle) -> StepTotals:
        totals = self._follow(batch) if self.executor is not None else super().train_on(batch)
        self.step_counters.append(self.client.metrics())
        return totals

    def _follow(self, batch: BatchHandle | PartialStep) -> StepTotals:
        # partial rollout: the executor follows the fresh batch and the carried samples' resumes, until
        # the quota of groups is in (what runs then is aborted and carried: the rollout is done)
        states = batch.states if isinstance(batch, PartialStep) else None
        inputs = StepInputs(
            self.step + 1,
            batch.batch_id,
            batch.num_samples,
            self.minibatch_samples,
            self.num_minibatches,
            states,
        )
        if self.inference is not None:
            self.inference.step_done = False  # the last step's, until this step's stream starts
        self.executor.begin_step(inputs)
        self.executor.before_minibatch(0)
        try:
            totals = super().train_on(batch)
        finally:
            self.executor.end_step()
        return totals

    def _on_minibatch_end(self, step: int, minibatches_done: int) -> None:
        self.executor.minibatch_end()
        if minibatches_done < self.num_minibatches:
            self.executor.before_minibatch(minibatches_done)

    def micro_batches(self, batch: BatchHandle | PartialStep) -> Iterator[list[list[dict]]]:
        """Micro-batches of `micro_batch_groups` groups in submission order. Under partial rollout, the
        first groups to finish, as `Trainer` takes them: the step trains those and carries the rest."""
        if isinstance(batch, PartialStep):
            return super().micro_batches(batch)
        return in_submission_order(batch, self.config.micro_batch_groups)


def in_submission_order(batch: BatchHandle, size: int) -> Iterator[list[list[dict]]]:
    """Groups 0..size-1, then size..2*size-1, ...: each micro-batch as soon as all of its groups are done."""
    arriving = batch.micro_batches(min_groups=1)
    ready: dict[int, list[dict]] = {}
    for first in range(0, batch.num_groups, size):
        wanted = range(first, min(first + size, batch.num_groups))
        while any(index not in ready for index in wanted):
            groups = next(arriving, None)
            if groups is None:
                raise RuntimeError(f"batch {batch.batch_id} ended without groups {list(wanted)}")
            ready |= {group[0]["group_index"]: group for group in groups}
        yield [ready.pop(index) for index in wanted]
