"""Named phases of an RL step, timed and traced by one `PhaseTimer`, in simulation and live.

The phase names are shared: the RL simulator's step (simulated clock) and a trainer (wall clock)
record the same `rollout`, `inference`, `training`, `reshard`, `sync` phases, so a simulated
step and a measured one line up phase by phase. A phase is a span (start, end, and the GPUs it
held); totals per phase are sums over its spans.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

PHASES = ("rollout", "rollout_spot", "inference", "training", "reshard", "sync")


@dataclass(frozen=True)
class Span:
    """GPUs [gpu_start, gpu_start + num_gpus) doing `component` from start to end."""

    component: str  # one of PHASES
    gpu_start: int
    num_gpus: int
    start: float
    end: float
    label: str = ""


class PhaseTimer:
    """Records phases as spans on a clock: `time.perf_counter` by default, a simulator's clock in simulation."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.spans: list[Span] = []

    def record(
        self, phase: str, start: float, end: float, gpu_start: int = 0, num_gpus: int = 0, label: str = ""
    ) -> Span:
        """A phase whose end is known (a simulator schedules it); returns its span."""
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}; phases: {', '.join(PHASES)}")
        span = Span(phase, gpu_start, num_gpus, start, end, label)
        self.spans.append(span)
        return span

    def start(
        self, phase: str, seconds: float, gpu_start: int = 0, num_gpus: int = 0, label: str = ""
    ) -> Span:
        """A phase that starts now on the clock and lasts `seconds`."""
        now = self.clock()
        return self.record(phase, now, now + seconds, gpu_start, num_gpus, label)

    @contextmanager
    def phase(self, phase: str, gpu_start: int = 0, num_gpus: int = 0, label: str = "") -> Iterator[None]:
        """Time the body of a `with` block as one span of `phase` (live code)."""
        began = self.clock()
        try:
            yield
        finally:
            self.record(phase, began, self.clock(), gpu_start, num_gpus, label)

    def totals(self) -> dict[str, float]:
        """Seconds per phase, summed over its spans (phases never recorded are absent)."""
        out: dict[str, float] = {}
        for span in self.spans:
            out[span.component] = out.get(span.component, 0.0) + span.end - span.start
        return out
