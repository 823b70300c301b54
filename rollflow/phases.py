"""Named phases of an RL step, timed and traced by one `PhaseTimer`, in simulation and live.

The phase names are shared: the RL simulator's step (simulated clock) and a trainer (wall clock)
record the same `rollout`, `inference`, `training`, `reshard`, `sync` phases, so a simulated
step and a measured one line up phase by phase. A phase is a span (start, end, and the GPUs it
held); totals per phase are sums over its spans.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

PHASES = ("rollout", "rollout_spot", "inference", "training", "reshard", "sync")


@dataclass(frozen=True)
class PhaseSpan:
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
        self.spans: list[PhaseSpan] = []

    def record(
        self, phase: str, start: float, end: float, gpu_start: int = 0, num_gpus: int = 0, label: str = ""
    ) -> PhaseSpan:
        """A phase whose end is known (a simulator schedules it); returns its span."""
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}; phases: {', '.join(PHASES)}")
        span = PhaseSpan(phase, gpu_start, num_gpus, start, end, label)
        self.spans.append(span)
        return span

    def start(
        self, phase: str, seconds: float, gpu_start: int = 0, num_gpus: int = 0, label: str = ""
    ) -> PhaseSpan:
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

    def totals_since(self, start: float) -> dict[str, float]:
        """Seconds per phase over the spans that began at or after `start` (one step of a longer run)."""
        out: dict[str, float] = {}
        for span in self.spans:
            if span.start >= start:
                out[span.component] = out.get(span.component, 0.0) + span.end - span.start
        return out


def write_chrome_trace(path: Path, steps_and_spans: Iterable[tuple[int, PhaseSpan]]) -> Path:
    """Spans as a chrome trace (open in https://ui.perfetto.dev), one track per GPU range.

    The RL simulator and the live trainer both write their phases through this, so a simulated
    step and a measured one open side by side with the same names and tracks.
    """
    events: list[dict] = []
    tracks: dict[tuple[int, int], int] = {}
    for step, span in steps_and_spans:
        pid = tracks.setdefault((span.gpu_start, span.num_gpus), len(tracks))
        gpus = f"{span.gpu_start}-{span.gpu_start + max(span.num_gpus, 1) - 1}"
        events.append(
            {
                "name": span.label or span.component,
                "cat": span.component,
                "ph": "X",
                "pid": pid,
                "tid": 0,
                "ts": span.start * 1e6,
                "dur": (span.end - span.start) * 1e6,
                "args": {"step": step, "gpus": gpus},
            }
        )
    for (gpu_start, num_gpus), pid in tracks.items():
        name = f"GPUs {gpu_start}-{gpu_start + max(num_gpus, 1) - 1}"
        events.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}})
        events.append(
            {"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": gpu_start}}
        )
    path.write_text(json.dumps({"displayTimeUnit": "ms", "traceEvents": events}) + "\n")
    return path
