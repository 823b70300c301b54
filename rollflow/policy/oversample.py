"""How many extra prompts' groups a partial-rollout step runs (`partial_rollout: auto`).

A step trains on its batch of `B` groups, and a group is ready when its longest response ends, so
without partial rollout the rollout lasts as long as the slowest of B groups: the long tail. Partial
rollout runs `B + N` groups and trains the first B to finish; the rest are carried into the next step
with their tokens. The rollout then ends with the B-th fastest of B + N groups, whose expected place
in the distribution of group lengths is the order statistic's quantile

    q(N) = B / (B + N + 1)        (N = 0: B / (B + 1), the tail; N = B: about the median)

so the policy picks

    N = the smallest n in [0, max_extra] with  Q(q(n)) <= (1 + slack) * Q(1/2)

where Q is the empirical quantile of the lengths of the groups trained in the last `window_steps`
steps (a group's length: its longest response, in tokens). Why that N:

- The smallest such n: every extra group costs something. Its tokens are trained a version or more
  stale (bounded by `max_staleness`), a carried sample re-prefills its prompt and tokens on resume, and
  more samples share the engines. So over-sample only as far as it brings the step's end down to
  about a typical group's, no further.
- Uniform lengths: Q is flat, n = 0 meets the bound: nothing to cut, nothing carried.
- A heavier tail: Q climbs more steeply towards 1, so a lower quantile, hence a larger n, is needed
  before the batch's end comes within `slack` of the median group.
- n = B gives q(n) < 1/2, where Q is at most the median: the bound always holds there, so N <= B.
- Lengths, not times: a group's rollout time follows its longest response's decode, and lengths are
  what the simulator draws and the live trainer reads alike, while times depend on load and hardware.
- No groups seen yet (a run's first step): 0, as there is no evidence of a tail.

Pure: `choose_extra_groups` reads a frozen snapshot. `Oversampler` is the small state both sides keep
(the recent groups' lengths, and a fixed `partial_rollout: N` that needs no choosing): the RL simulator
(`rollflow.sim.rl.runner`) and the live trainer (`rollflow.runtime.trainer.partial`) each feed it the
groups they trained and ask it for the next step's N.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field

# `partial_rollout` in `rollflow rl-sim` and `rollflow train`: a fixed N, or `auto` (chosen per step)
PartialRollout = Annotated[int, Field(ge=0)] | Literal["auto"]


@dataclass(frozen=True)
class OversampleSettings:
    window_steps: int = 4  # steps whose trained groups' lengths the choice reads
    slack: float = 0.25  # how far above the median group the batch's end may stay
    max_extra: int | None = None  # most extra groups; None: the batch size B (the bound never needs more)

    def __post_init__(self) -> None:
        if self.window_steps < 1:
            raise ValueError(f"window_steps must be >= 1, got {self.window_steps}")
        if self.slack < 0:
            raise ValueError(f"slack must be >= 0, got {self.slack}")
        if self.max_extra is not None and self.max_extra < 0:
            raise ValueError(f"max_extra must be >= 0, got {self.max_extra}")


@dataclass(frozen=True)
class LengthSnapshot:
    group_lengths: tuple[int, ...]  # each recently trained group's longest response, in tokens
    num_prompts: int  # groups a step trains (its batch, B)


@dataclass(frozen=True)
class OversamplePlan:
    num_extra: int  # groups to run beside the batch
    reason: str  # one line for the log


def quantile(sorted_values: tuple[int, ...] | list[int], q: float) -> float:
    """The q-quantile of sorted values, linearly interpolated between order statistics (numpy's
    default), so that it moves smoothly with q."""
    position = q * (len(sorted_values) - 1)
    low = int(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (position - low) * (sorted_values[high] - sorted_values[low])


def choose_extra_groups(snapshot: LengthSnapshot, settings: OversampleSettings) -> OversamplePlan:
    """The smallest N that brings the batch's expected end within `slack` of the median group."""
    lengths = sorted(snapshot.group_lengths)
    batch = snapshot.num_prompts
    if not lengths:
        return OversamplePlan(0, "no group lengths seen yet: no tail to cut")
    cap = batch if settings.max_extra is None else settings.max_extra
    median = quantile(lengths, 0.5)
    target = (1 + settings.slack) * median
    for extra in range(cap + 1):
        end = quantile(lengths, batch / (batch + extra + 1))
        if end <= target:
            return OversamplePlan(
                extra,
                f"{len(lengths)} groups, median {median:.0f} tokens: the batch's {batch}th of {batch + extra} "
                f"ends near {end:.0f} (<= {target:.0f})",
            )
    return OversamplePlan(
        cap, f"{len(lengths)} groups, median {median:.0f} tokens: tail beyond reach, at the cap of {cap}"
    )


class Oversampler:
    """The extra groups of each step: a fixed `partial_rollout: N`, or (`auto`) chosen by
    `choose_extra_groups` from the groups trained in the last `window_steps` steps."""

    def __init__(
        self, partial_rollout: PartialRollout, num_prompts: int, settings: OversampleSettings | None = None
    ) -> None:
        self.partial_rollout = partial_rollout
        self.num_prompts = num_prompts
        self.settings = settings or OversampleSettings()
        self._lengths: deque[int] = deque(maxlen=self.settings.window_steps * num_prompts)

    def observe(self, group_lengths: Iterable[int]) -> None:
        """Groups just trained, each as its longest response's length."""
        self._lengths.extend(group_lengths)

    def snapshot(self) -> LengthSnapshot:
        return LengthSnapshot(tuple(self._lengths), self.num_prompts)

    def plan(self) -> OversamplePlan:
        """The next step's extra groups."""
        if self.partial_rollout != "auto":
            return OversamplePlan(self.partial_rollout, "fixed (partial_rollout)")
        return choose_extra_groups(self.snapshot(), self.settings)
