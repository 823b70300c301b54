"""The live run as rl-sim draws a simulated one: devices x time, from what the executor and trainer recorded.

Light bars: a component holds the device (the executor's ledger). Colored bars: it works there —
rollout from step start until its last sample is generated, inference until it has processed every
sample, training and weight sync where the trainer's phase timer says (on the devices the actor held
at that moment), and each move on the devices it moved, for as long as it took (`reshard`).
"""

from __future__ import annotations

from pathlib import Path

from rollflow.gantt import Bar, draw_gantt
from rollflow.phases import PhaseSpan
from rollflow.runtime.dynamic.moves import DeviceLedger, Holding, Move, StepRecord


def live_bars(
    holdings: list[Holding],
    steps: list[StepRecord],
    moves: list[Move],
    phases: list[PhaseSpan],
    clock0: float,
) -> list[Bar]:
    """`phases`: the trainer's timer spans (absolute perf_counter times; `clock0` is the executor's zero)."""
    bars = [Bar(h.device, 1, h.start_s, h.end_s, None) for h in holdings if h.component != "idle"]
    for step in steps:
        windows = {
            "rollout": step.rollout_done_s or step.ended_s,
            "inference": step.inference_done_s or step.rollout_done_s or step.ended_s,
        }
        for component, done in windows.items():
            for h in holdings:
                start, end = max(h.start_s, step.started_s), min(h.end_s, done or h.end_s)
                if h.component == component and end > start:
                    bars.append(Bar(h.device, 1, start, end, component))
    actor = [h for h in holdings if h.component == "actor"]
    for span in phases:
        if span.component not in ("training", "sync"):
            continue
        start, end = span.start - clock0, span.end - clock0
        for h in actor:
            lo, hi = max(h.start_s, start), min(h.end_s, end)
            if hi > lo:
                bars.append(Bar(h.device, 1, lo, hi, span.component))
    for move in moves:
        if move.ok and move.seconds > 0:
            bars += [
                Bar(d, 1, move.started_s, move.started_s + move.seconds, "reshard") for d in move.devices
            ]
    return bars


def plot_live_gantt(
    path: Path,
    num_devices: int,
    ledger: DeviceLedger,
    steps: list[StepRecord],
    phases: list[PhaseSpan],
    clock0: float,
    title: str,
) -> Path:
    """A step ends once its weights are pushed (the trainer's `sync` phase), as in rl-sim."""
    moves = [m for step in steps for m in step.moves]
    step_ends = sorted(span.end - clock0 for span in phases if span.component == "sync")[-len(steps) :]
    holdings = ledger.close(max(step_ends, default=0.0))
    return draw_gantt(
        path,
        num_devices,
        live_bars(holdings, steps, moves, phases, clock0),
        step_ends,
        xlabel="time since the first step began (s)",
        ylabel="device slot",
        title=title,
        held_label="held, idle",
    )
