"""The training loop: rollout -> (per micro-batch: reward, advantage, backward) -> update weights -> log.

Weight version N is the policy after N optimizer steps' worth of training steps; engines start on
version 0 (the `model` folder). After step N the trainer saves weights/vN and tells every engine,
through the manager, to load it; the manager holds each engine out of the pool until it has. With
`weights_url`, weights/vN is also published to that weight server and engines pull it from there
(a delta against the version they hold), so they need no disk shared with the trainer.

On-policy (default): the next batch is submitted after the push, so every token of it comes from
the trainer's current version. Off-policy: the next batch is submitted before training on this one,
so its samples are generated while the weights change under them (`allow_off_policy`); each token
keeps the version that made it, samples older than `max_staleness` are dropped, and the importance
ratio uses the engines' recorded log-probs token by token. Partial rollout (`partial_rollout: N`,
partial.py): each step over-samples N groups, trains the first `prompts_per_step` to finish and carries
the rest, aborted with their tokens, into the next step.

What is trained, and on how many ranks, is the `Learner`'s (learner.py): under torchrun, rank 0 runs
this loop and every other rank only `obey`s its learner; with an elastic actor (elastic.py,
`trainer.learner.actor`) this process is its rank 0, and each mini-batch trains on the ranks active
for it; `minibatch_end_hooks` run between mini-batches, where a live executor resizes the actor.
Pushing each version to the engines is `WeightPush`'s (weight_push.py).
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import random
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollflow.phases import PhaseSpan, PhaseTimer, write_chrome_trace
from rollflow.policy.oversample import Oversampler
from rollflow.runtime.manager.client import BatchHandle, ManagerClient, ManagerError, ManagerUnreachable
from rollflow.runtime.manager.token import TOKEN_ENV as MANAGER_TOKEN_ENV
from rollflow.runtime.trainer import checkpoints
from rollflow.runtime.trainer.config import TrainConfig
from rollflow.runtime.trainer.distributed import DataParallel
from rollflow.runtime.trainer.episodes import EpisodeBatch, EpisodeRunner
from rollflow.runtime.trainer.learner import Learner, StepTotals
from rollflow.runtime.trainer.metrics import MetricsWriter, StepMetrics
from rollflow.runtime.trainer.partial import CarryBook, PartialStep, carried_tokens
from rollflow.runtime.trainer.rollouts import filter_stale
from rollflow.runtime.trainer.tasks import load_callable
from rollflow.runtime.trainer.weight_push import WeightPush

if TYPE_CHECKING:
    from rollflow.runtime.inference.workers import InferencePool, OldPolicy

log = logging.getLogger(__name__)


class Trainer:
    def __init__(self, config: TrainConfig, resume: bool, parallel: DataParallel | None = None) -> None:
        """`parallel`: this process's rank under torchrun (see distributed.py); None trains alone."""
        from transformers import AutoTokenizer
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()  # per-push "Writing model shards" bars drown the step lines

        self.config = config
        self.output_dir = Path(config.output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.prompts_fn = load_callable(config.prompts, "prompts")
        self.environment_fn = load_callable(config.environment, "environment") if config.environment else None
        token = config.manager_token or os.environ.get(MANAGER_TOKEN_ENV)
        self.client = ManagerClient(config.manager_url, token=token, reconnect_s=config.manager_reconnect_s)

        self.parallel = parallel
        self.inference: InferencePool | None = None  # set by inference.workers.start_inference
        # each called as hook(step being trained, optimizer steps done in it) between mini-batches
        self.minibatch_end_hooks: list[Callable[[int, int], None]] = []
        # each called as hook(version that will train on it) just before a step's rollout is submitted:
        # between steps, after the last push (off-policy: as the previous rollout ends). Where a launcher
        # preempts or adds engines between steps, and where partial rollout's carried groups wait
        self.rollout_start_hooks: list[Callable[[int], None]] = []
        self.timer = PhaseTimer()  # rollout (waiting), training, sync: the RL simulator's phase names
        self._phase_spans: list[tuple[int, PhaseSpan]] = []  # (step, span) for chrome_trace.json
        checkpoint = checkpoints.latest_checkpoint(self.output_dir) if resume else None
        if parallel is not None:  # every rank resumes from the checkpoint rank 0 picked
            checkpoint = parallel.broadcast(checkpoint)
        self.tokenizer = AutoTokenizer.from_pretrained(checkpoint or Path(config.model))
        # the models and optimizer, their checkpointed state restored (elastic.start_elastic sets its actor)
        self.learner = Learner(config, self.tokenizer, parallel, checkpoint)
        self.weights = WeightPush(config, self.client, self.output_dir, self.learner)
        self.step = 0
        self.rng = random.Random(config.seed)
        self.carry = CarryBook() if config.partial_rollout else None
        # partial rollout: each step's extra groups, fixed or chosen from the trained groups' lengths
        self.oversampler = Oversampler(config.partial_rollout, config.prompts_per_step)
        self._carried_out: list[list[dict]] = []  # what the step now training carries into the next
        # off-policy partial rollout: the next step's rollout, started as this one's ended
        self._early: PartialStep | None = None
        # trained tokens by staleness: the trainer's version less the token's
        self.tokens_by_staleness: Counter[int] = Counter()
        if checkpoint is not None:
            self._restore(checkpoint)

    def _restore(self, checkpoint: Path) -> None:
        """The trainer's own state (the learner restored its own): steps done, prompt order, carried groups."""
        state = checkpoints.read_state(checkpoint)
        self.step = state["step"]
        self.rng.setstate(_tuple_state(state["rng"]))
        if self.carry is not None:
            self.carry.groups = state.get("carried", [])
            # `partial_rollout: auto` reads them: without, a resumed run's first step would pick N = 0
            self.oversampler.observe(state.get("group_lengths", []))
        log.info("resumed from %s (step %d)", checkpoint, self.step)

    def run(self, on_step: Callable[[StepMetrics], None] = lambda m: None) -> None:
        """Train until `config.steps` steps are done in total (across resumes)."""
        if self.parallel is not None and not self.parallel.is_leader:
            while self.learner.obey():
                pass
            return
        self.weights.sync(self.step)
        metrics = MetricsWriter(self.output_dir)
        pending = None
        try:
            pending = self._submit(self.step) if self.step < self.config.steps else None
            while self.step < self.config.steps:
                batch, pending = pending, None
                if self.config.off_policy and self.carry is None and self.step + 1 < self.config.steps:
                    pending = self._submit(self.step + 1)
                result = self._train_step(batch)
                if self._early is not None:  # partial rollout, off-policy: submitted as this rollout ended
                    pending, self._early = self._early, None
                if pending is None and self.step < self.config.steps:
                    pending = self._submit(self.step)
                metrics.write(result)
                on_step(result)
            self.learner.stop_ranks()
            self._write_summary()
        finally:
            self.learner.close()
            if self.inference is not None:
                self.inference.close()
            metrics.close()
            # once per run, not per step: rewriting every span of the run each step grows quadratically
            write_chrome_trace(self.output_dir / "chrome_trace.json", self._phase_spans)
            # interrupted: stop the manager generating for a step that won't come
            for left in (pending, self._early):
                if left is not None:
                    with contextlib.suppress(OSError, ManagerError, ManagerUnreachable):
                        left.cancel()

    def _submit(self, train_version: int) -> BatchHandle | EpisodeBatch | PartialStep:
        """The rollout of the step that version `train_version` of the policy will train on."""
        for hook in self.rollout_start_hooks:
            hook(train_version)
        if self.carry is not None:
            return self._submit_partial(train_version)
        prompts = self.prompts_fn(self.tokenizer, self.config.prompts_per_step, self.rng)
        if self.environment_fn is not None:
            runner = EpisodeRunner(
                self.client,
                self.environment_fn,
                self.tokenizer,
                self.config.max_turns,
                self.sampling_params(),
                allow_off_policy=self.config.off_policy,
            )
            return EpisodeBatch(runner, prompts, self.config.n_samples)
        return self.client.submit(
            prompts,
            n=self.config.n_samples,
            allow_off_policy=self.config.off_policy,
            **self.sampling_params(),
        )

    def _submit_partial(self, train_version: int) -> PartialStep:
        """The carried groups, resumed first, and fresh prompts making up `prompts_per_step +
        partial_rollout` groups in all."""
        assert self.carry is not None
        carried = self.carry.take(train_version, self.config.max_staleness)
        plan = self.oversampler.plan()
        log.info("partial rollout: %d extra groups (%s)", plan.num_extra, plan.reason)
        # at least one new group: the manager refuses an empty batch, and a step whose carried groups
        # fill the batch (the previous N was B, this one 0) still has one to submit
        num_fresh = max(1, self.config.prompts_per_step + plan.num_extra - len(carried))
        prompts = self.prompts_fn(self.tokenizer, num_fresh, self.rng)

        def submit_fresh() -> BatchHandle:
            return self.client.submit(
                prompts,
                n=self.config.n_samples,
                allow_off_policy=self.config.off_policy,
                **self.sampling_params(),
            )

        return PartialStep(
            self.client,
            carried,
            submit_fresh,
            self.config.n_samples,
            self.sampling_params(),
            quota=self.config.prompts_per_step,
            on_end=self._rollout_ended,
            extra_groups=plan.num_extra,
        )

    def _rollout_ended(self, leftover: list[list[dict]]) -> None:
        """Partial rollout: the step's rollout is over and `leftover` is what it carries; off-policy, the
        next step's rollout starts now, beside this step's training."""
        assert self.carry is not None
        self.carry.carry(leftover)
        # as carried (for the checkpoint): off-policy, the next rollout goes on with them at once
        self._carried_out = copy.deepcopy(leftover)
        (self.output_dir / "carried.json").write_text(json.dumps({"step": self.step + 1, "groups": leftover}))
        if self.config.off_policy and self.step + 1 < self.config.steps:
            self._early = self._submit(self.step + 1)

    def sampling_params(self) -> dict[str, Any]:
        """SGLang sampling params of the step's batch. DynamicTrainer extends them with a per-step
        sampling seed, so a static and a dynamic run draw the same samples."""
        params = {"max_new_tokens": self.config.max_new_tokens, "temperature": self.config.temperature}
        return params | ({"stop": self.config.stop} if self.config.stop else {})

    def _train_step(self, batch: BatchHandle | EpisodeBatch | PartialStep) -> StepMetrics:
        started = self.timer.clock()
        self._carried_out = []
        totals = self.train_on(batch)
        self.step += 1
        with self.timer.phase(
            "sync", num_gpus=self.learner.num_ranks(), label=f"update weights v{self.step}"
        ):
            self.weights.push(self.step)
        step_time = self.timer.clock() - started
        seconds = self.timer.totals_since(started)
        wait_s = seconds.get("rollout", 0.0)
        # rollout time as the trainer sees it: until the last micro-batch arrived (a launcher's autoscaler reads it)
        rollout_s = (totals.last_arrival or started) - started
        self.client.report_step(step_time, wait_s, rollout_s=rollout_s)
        self._phase_spans += [(self.step, span) for span in self.timer.spans if span.start >= started]
        if self.step % self.config.checkpoint_every == 0 or self.step == self.config.steps:
            self.save_checkpoint()
        return StepMetrics(
            step=self.step,
            weight_version=self.step,
            reward_mean=sum(totals.rewards) / max(len(totals.rewards), 1),
            kl=totals.token_mean("kl"),
            entropy=totals.token_mean("entropy"),
            policy_loss=totals.token_mean("policy_loss"),
            value_loss=totals.token_mean("value_loss"),
            clip_fraction=totals.token_mean("clip_fraction"),
            samples=len(totals.rewards),
            samples_rejected_stale=totals.rejected,
            samples_resumed=totals.resumed,
            extra_groups=batch.extra_groups if isinstance(batch, PartialStep) else 0,
            samples_carried=sum(len(group) for group in self._carried_out),
            tokens_carried=carried_tokens(self._carried_out),
            tokens=totals.tokens,
            tokens_per_s=totals.tokens / step_time,
            rollout_wait_s=wait_s,
            train_s=seconds.get("training", 0.0),
            update_weights_s=seconds.get("sync", 0.0),
            step_time_s=step_time,
        )

    def train_on(self, batch: BatchHandle) -> StepTotals:
        """Train on the batch's micro-batches as they arrive: a backward each, an optimizer step every
        `mini_batch_micro_batches` of them and one after the last (a partial mini-batch).

        Called once per step by `run`; DynamicTrainer wraps it so that its executor follows the
        step, and tests call it to train one step's rollouts without a manager."""
        totals = StepTotals()
        pending_micro_batches = 0
        minibatches_done = 0
        per_mini_batch = self.config.mini_batch_micro_batches
        for groups in self.timed_micro_batches(batch):
            totals.last_arrival = self.timer.clock()
            groups, rejected = self._accept(groups)
            totals.rejected += rejected
            if not groups:
                continue
            self._note_trained(groups)
            with self.timer.phase("training", num_gpus=self.learner.num_ranks(), label="micro-batch"):
                self.learner.train_micro_batch(groups, totals, scale=1.0 / per_mini_batch)
                pending_micro_batches += 1
                if pending_micro_batches == per_mini_batch:
                    self.learner.optimizer_step()
                    pending_micro_batches = 0
            if pending_micro_batches == 0:
                minibatches_done += 1
                for hook in self.minibatch_end_hooks:
                    hook(self.step + 1, minibatches_done)
        if pending_micro_batches:
            with self.timer.phase("training", num_gpus=self.learner.num_ranks(), label="optimizer step"):
                self.learner.optimizer_step()
            for hook in self.minibatch_end_hooks:
                hook(self.step + 1, minibatches_done + 1)
        self.learner.end_step()
        return totals

    def micro_batches(self, batch: BatchHandle) -> Iterator[list[list[dict]]]:
        """The batch's groups, in the micro-batches the step trains on.

        Each holds exactly `micro_batch_groups` groups (the step's last may hold fewer), however many
        have finished when the trainer asks: otherwise a trainer that fell behind would take every
        finished group in one micro-batch, and how many optimizer steps a training step takes (so what
        is learned) would depend on timing, e.g. differ between one process and torchrun ranks.
        DynamicTrainer overrides it to take the groups in submission order.
        """
        size = self.config.micro_batch_groups
        return batch.micro_batches(min_groups=size, max_groups=size)

    def timed_micro_batches(self, batch: BatchHandle) -> Iterator[list[list[dict]]]:
        """`micro_batches`, through the inference workers when the placement has them (rollout ->
        inference -> actor), timing the wait for each as the trainer's `rollout` phase."""
        iterator = self.micro_batches(batch)
        if self.inference is not None:
            iterator = self.inference.stream(iterator, self.tokenizer.pad_token_id, self._old_policy())
        while True:
            with self.timer.phase(
                "rollout", num_gpus=self.learner.num_ranks(), label="waiting for micro-batch"
            ):
                groups = next(iterator, None)
            if groups is None:
                return
            yield groups

    def _old_policy(self) -> OldPolicy | None:
        """PPO with inference workers: the version this step's samples come from, for its recomputed
        log-probs (on-policy, the trainer's current one; its folder was written by the last push).
        Handed to `InferencePool.stream` by `timed_micro_batches`."""
        if self.config.algorithm != "ppo":
            return None
        from rollflow.runtime.inference.workers import OldPolicy

        folder = checkpoints.weights_folder(self.output_dir, self.step)
        return OldPolicy(str(folder.resolve()), self.step) if folder.is_dir() else None

    def _accept(self, groups: list[list[dict]]) -> tuple[list[list[dict]], int]:
        """Finished samples within the staleness bound (on-policy: from the current version only)."""
        finished = [[s for s in group if s["state"] == "finished"] for group in groups]
        failed = sum(len(g) for g in groups) - sum(len(g) for g in finished)
        if failed:
            log.warning("%d samples failed in the manager and are skipped", failed)
        # partial rollout trains carried tokens a version or more behind, as off-policy does
        bound = self.config.max_staleness if self.config.off_policy or self.carry is not None else 0
        return filter_stale([g for g in finished if g], self.step, bound)

    def _note_trained(self, groups: list[list[dict]]) -> None:
        """Count the tokens about to be trained by staleness; under partial rollout, log each sample
        (trained_samples.jsonl: its step, whether it was carried, the version of each token span)."""
        for sample in (sample for group in groups for sample in group):
            for span in sample["spans"]:
                if span["weight_version"] is not None:
                    staleness = self.step - span["weight_version"]
                    self.tokens_by_staleness[staleness] += span["end"] - span["start"]
        if self.carry is None:
            return
        self.oversampler.observe(max(len(sample["output_ids"]) for sample in group) for group in groups)
        with open(self.output_dir / "trained_samples.jsonl", "a") as file:
            for group in groups:
                for sample in group:
                    record = {
                        "step": self.step + 1,
                        "sample_id": sample["sample_id"],
                        "carried": sample.get("carried", 0),
                        "num_output": len(sample["output_ids"]),
                        "spans": sample["spans"],
                    }
                    file.write(json.dumps(record) + "\n")

    def _write_summary(self) -> None:
        """summary.json: this run's totals (the steps it trained, not earlier runs' before a resume)."""
        summary: dict[str, Any] = {
            "steps": self.step,
            "tokens_by_staleness": {str(k): v for k, v in sorted(self.tokens_by_staleness.items())},
            "samples_carried": 0,
            "tokens_carried": 0,
        }
        if self.carry is not None:
            summary |= {
                "samples_carried": self.carry.samples_carried,
                "tokens_carried": self.carry.tokens_carried,
                "tokens_regenerated": self.carry.tokens_regenerated,
                "samples_left_carried": sum(len(group) for group in self.carry.groups),
            }
        (self.output_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")

    def save_checkpoint(self) -> None:
        """Writes this step's checkpoint (the learner's weights and optimizer, this loop's sampling
        state and carried groups) to the output folder; a step writes one every `checkpoint_every`
        steps, and a caller that drives `train_on` itself writes one with this."""
        state: dict[str, Any] = {"rng": _list_state(self.rng.getstate())}
        if self.carry is not None:  # a resumed run trains them: none is lost across a restart
            state["carried"] = self._carried_out
            state["group_lengths"] = list(self.oversampler.snapshot().group_lengths)
        self.learner.save_checkpoint(self.output_dir, self.step, state)


def _list_state(state: tuple) -> list:
    return [state[0], list(state[1]), state[2]]


def _tuple_state(state: list) -> tuple:
    return (state[0], tuple(state[1]), state[2])
