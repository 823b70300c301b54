"""What happened to each engine over the run, sampled from the manager, and its picture.

The manager is polled (GET /workers) rather than instrumented: the timeline shows what an
operator watching the manager would see, and costs the run nothing but one request per tick.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from rollflow.runtime.manager.client import ManagerClient, ManagerError, ManagerUnreachable


@dataclass(frozen=True)
class EngineObservation:
    t: float  # seconds since the run began
    engine_id: int
    kind: str
    state: str  # healthy | updating | failed | removed
    running: int  # samples streaming from it
    capacity: int
    weight_version: int | None


@dataclass(frozen=True)
class Event:
    t: float
    kind: str  # preempted | joined | step
    text: str
    engine_id: int | None = None
    value: float | None = None  # a step's mean reward


@dataclass
class Timeline:
    started: float = field(default_factory=time.monotonic)
    observations: list[EngineObservation] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def now(self) -> float:
        return time.monotonic() - self.started

    def observe(self, workers: list[dict]) -> None:
        t = self.now()
        with self._lock:
            self.observations += [
                EngineObservation(
                    t, w["id"], w["kind"], w["state"], w["running"], w["capacity"], w["weight_version"]
                )
                for w in workers
            ]

    def event(self, kind: str, text: str, engine_id: int | None = None, value: float | None = None) -> None:
        with self._lock:
            self.events.append(Event(self.now(), kind, text, engine_id, value))


class EngineSampler(threading.Thread):
    """Polls the manager's engine list into a Timeline until stopped."""

    def __init__(self, client: ManagerClient, timeline: Timeline, interval_s: float) -> None:
        super().__init__(name="engine-sampler", daemon=True)
        self.client = client
        self.timeline = timeline
        self.interval_s = interval_s
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            # a failed poll is a gap in the picture; the trainer reports a manager that is really gone
            with contextlib.suppress(ManagerError, ManagerUnreachable):
                self.timeline.observe(self.client.workers())
            self._stop_event.wait(self.interval_s)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


STATE_COLORS = {"generating": "#2b8cbe", "idle": "#d9d9d9", "updating": "#fdae6b"}


def plot_timeline(timeline: Timeline, path: Path, title: str) -> None:
    """Engines as rows (generating / idle / loading weights), kills and joins marked, reward below."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    by_engine: dict[int, list[EngineObservation]] = {}
    for obs in timeline.observations:
        by_engine.setdefault(obs.engine_id, []).append(obs)
    engine_ids = sorted(by_engine)
    end = timeline.now()
    fig, (top, bottom) = plt.subplots(
        2,
        1,
        figsize=(12, 2.2 + 0.55 * len(engine_ids)),
        sharex=True,
        height_ratios=[max(len(engine_ids), 2), 2],
    )
    for row, engine_id in enumerate(engine_ids):
        observations = by_engine[engine_id]
        for current, following in zip(observations, [*observations[1:], None], strict=True):
            stop = following.t if following is not None else min(current.t + 0.2, end)
            state = _display_state(current)
            if state is None:
                continue
            alpha = (
                0.35 + 0.65 * min(current.running / max(current.capacity, 1), 1.0)
                if state == "generating"
                else 1.0
            )
            top.broken_barh(
                [(current.t, stop - current.t)],
                (row - 0.35, 0.7),
                color=STATE_COLORS[state],
                alpha=alpha,
                linewidth=0,
            )
    labels = [f"engine {i} ({by_engine[i][0].kind})" for i in engine_ids]
    top.set_yticks(range(len(engine_ids)), labels)
    top.set_ylim(-0.7, len(engine_ids) - 0.3)
    top.invert_yaxis()
    row_of = {engine_id: row for row, engine_id in enumerate(engine_ids)}
    steps = [e for e in timeline.events if e.kind == "step"]
    for event in steps:
        for axis in (top, bottom):
            axis.axvline(event.t, color="#969696", linestyle=":", linewidth=0.8)
    for event in timeline.events:
        if event.kind in ("preempted", "joined") and event.engine_id in row_of:
            marker, color = ("X", "#d7301f") if event.kind == "preempted" else ("^", "#238443")
            top.plot(
                event.t, row_of[event.engine_id], marker=marker, color=color, markersize=12, linestyle="none"
            )
            top.annotate(
                event.text,
                (event.t, row_of[event.engine_id]),
                xytext=(8, -14),
                textcoords="offset points",
                fontsize=8,
                color=color,
            )
    legend = [
        Patch(color=color, label=name.replace("updating", "loading weights"))
        for name, color in STATE_COLORS.items()
    ]
    top.legend(handles=legend, loc="upper right", fontsize=8, ncol=3)
    top.set_title(title)
    if steps:
        bottom.plot([e.t for e in steps], [e.value for e in steps], marker="o", color="#6a51a3")
    bottom.set_ylabel("mean reward")
    bottom.set_xlabel("seconds since start (dotted: end of each training step)")
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _display_state(obs: EngineObservation) -> str | None:
    if obs.state == "updating":
        return "updating"
    if obs.state != "healthy":
        return None
    return "generating" if obs.running else "idle"
