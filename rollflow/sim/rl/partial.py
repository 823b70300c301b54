"""Partial rollout: samples a full batch leaves unfinished carry over to the next step.

As slime's `--partial-rollout` (and AReaL's interruptible generation): a step keeps more groups
generating than it trains on; once its batch is full the others stop at their instance's next
iteration boundary, keep the tokens they generated, and the next step resumes them (prompt plus
generated tokens re-prefilled, the rest generated on its weights). Samples of a group that is not
trained carry over whether finished or not, so a group always trains whole.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rollflow.sim.events import Event, Phase
from rollflow.sim.request import SimRequest
from rollflow.sim.rl.config import RLSimConfig
from rollflow.sim.rl.rollout import resume
from rollflow.sim.rl.staleness import merge_versions, sample_versions, spread_versions
from rollflow.sim.workload import build_requests

if TYPE_CHECKING:
    from rollflow.sim.rl.step import StepSimulator


@dataclass
class CarriedSample:
    """A sample of a group the step did not train, handed to the next step."""

    request: SimRequest  # finished, or reset to resume from its prompt plus generated tokens
    group: int  # its group in the step it comes from (samples of one group stay together)
    versions: dict[int, int] = field(
        default_factory=dict
    )  # response tokens generated so far, per weight version


def stop_sample(
    request: SimRequest, group: int, versions: dict[int, int], now: float, sync_ends: Sequence[float]
) -> CarriedSample:
    """A sample stopped at `now` with its tokens: which versions made this stint's, then reset it.

    `versions`: its tokens from earlier steps. This stint's first token is its (re-)prefill's;
    a sample stopped before that made none in it."""
    generated = (request.processed if request.prefill_done else request.num_prefill) - request.prompt_tokens
    made = max(0, generated - sum(versions.values()))
    first = request.prefill_completed_at if request.prefill_completed_at is not None else now
    stint = spread_versions(first, now, made, sync_ends)
    resume(request, "migrate")
    request.prefill_completed_at = None  # the next stint's first token starts its window
    return CarriedSample(request, group, merge_versions(versions, stint))


def step_samples(
    config: RLSimConfig, index: int, carried: Sequence[CarriedSample]
) -> tuple[list[SimRequest], dict[int, dict[int, int]]]:
    """A step's samples, numbered so that sample i is in group i // samples_per_prompt: the carried
    groups first, then new ones up to num_prompts + partial_rollout groups in all. Also the
    tokens each carried sample made in earlier steps, by its new id."""
    workload = config.workload
    carried = sorted(carried, key=lambda c: (c.group, c.request.id))
    num_carried_groups = len(carried) // workload.samples_per_prompt
    fresh = workload.num_prompts + config.partial_rollout - num_carried_groups
    requests = [c.request for c in carried]
    if fresh > 0:
        requests += build_requests(workload.model_copy(update={"num_prompts": fresh}), config.seed + index)
    for new_id, request in enumerate(requests):
        request.id = new_id
    return requests, {new_id: c.versions for new_id, c in enumerate(carried)}


class PartialRollout:
    """A step's part in partial rollout: what it got from the step before, and what it hands on.

    Without partial rollout (`enabled` false) nothing is carried either way."""

    def __init__(
        self, step: StepSimulator, requests: list[SimRequest], earlier_versions: dict[int, dict[int, int]]
    ) -> None:
        """`requests`: the step's samples, the carried-in ones first (`step_samples`)."""
        self.step = step
        self.enabled = step.config.partial_rollout > 0
        self.earlier_versions = earlier_versions  # carried-in samples' tokens per version, by id
        # carried-in samples re-prefill their prompt and the tokens they generated
        self.reprefill = sum(r.num_prefill for r in requests[: len(earlier_versions)] if not r.completed)
        self.carried_out: list[CarriedSample] = []  # for the next step

    def batch_full(self) -> None:
        """The batch is full: the other groups stop where they are and wait for the next step.
        Every instance stops first, so the resource scheduler finds none left to release."""
        step = self.step
        step.progress.finish()
        self.carry(step.instances.take_waiting())  # held back, or a preempted instance's
        pool = step.pool
        for instance_id in pool.live_ids():
            pool.retire(
                instance_id,
                lambda requests: (
                    step.queue.event(step.now, Phase.MOVE, self._on_aborted, payload=requests),
                ),
            )
        step.resources.decide("rollout_done")

    def _on_aborted(self, event: Event) -> list[Event]:
        step = self.step
        self.carry(event.payload)
        progress = step.progress
        progress.rollout_end = max(progress.rollout_end or step.now, step.now)  # instances busy until here
        step.lanes.dispatch()
        return step.emitted()

    def carry(self, requests: list[SimRequest]) -> None:
        """Stop these unfinished samples now and hand them to the next step."""
        step = self.step
        group_size = step.progress.group_size
        for request in requests:
            earlier = self.earlier_versions.get(request.id, {})
            self.carried_out.append(
                stop_sample(request, request.id // group_size, earlier, step.now, step.sync_ends)
            )

    def carry_finished(self) -> None:
        """At the step's end: the finished samples of groups it did not train carry over too."""
        if not self.enabled:
            return
        step, progress = self.step, self.step.progress
        trained = set(progress.trained_groups)
        for request in progress.requests:
            group = request.id // progress.group_size
            if request.completed and group not in trained:
                versions = self.earlier_versions.get(request.id)
                self.carried_out.append(
                    CarriedSample(request, group, sample_versions(request, step.sync_ends, versions))
                )
        expected = len(progress.requests) - progress.num_samples
        if len(self.carried_out) != expected:
            raise RuntimeError(
                f"step {step.index}: {len(self.carried_out)} samples carried over, expected "
                f"{expected} (an instance had not stopped by the step's end)"
            )

    @property
    def num_tokens_carried_out(self) -> int:
        return sum(sum(c.versions.values()) for c in self.carried_out)


def trained_group_lengths(
    requests: Sequence[SimRequest], trained: Sequence[int], group_size: int
) -> list[int]:
    """Each trained group's length as the over-sampling policy reads it: its longest response."""
    return [
        max(r.output_tokens for r in requests[group * group_size : (group + 1) * group_size])
        for group in trained
    ]


def resume_order(unfinished: list[SimRequest], num_carried: int, seed: int, step: int) -> list[SimRequest]:
    """The order a step's unfinished samples reach the instances: the carried ones (ids below
    `num_carried`) first, in an arbitrary order, then the new ones in group order.

    As live (`rollflow.runtime.trainer.partial.PartialStep`): every carried sample is resumed by a
    `/generate` of its own, all sent at once from a pool of threads before the step's new prompts, so
    they reach the manager's queue in whatever order the requests arrive, not group by group. Where
    the engines cannot run them all at once, that order decides which carried groups finish first and
    how many tokens the others have made when the batch fills. A seeded shuffle (the run's seed and the
    step's index) stands for it, so a simulated run stays repeatable."""
    carried = [r for r in unfinished if r.id < num_carried]
    random.Random(f"resume-{seed}-{step}").shuffle(carried)
    return carried + [r for r in unfinished if r.id >= num_carried]
