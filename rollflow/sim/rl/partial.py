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

from rollflow.sim.request import SimRequest
from rollflow.sim.rl.rollout import resume
from rollflow.sim.rl.staleness import merge_versions, spread_versions


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
