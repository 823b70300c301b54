"""The live run's state as the resource policy's `ResourceSnapshot`: the same frozen record the
simulator builds (rollflow/sim/rl/resources.py), so one policy object decides in both.

`LiveLayout` is where things sit (which device each engine holds, the actor's size, inference's
range); `LiveProgress` is what the manager and trainer report at one moment (unfinished samples per
engine, samples finished since the last actor mini-batch, mini-batches done, inference done).
`build_snapshot` is a pure function of the two.
"""

from __future__ import annotations

from dataclasses import dataclass

from rollflow.policy.resources import ResourceSnapshot, RolloutInstanceState, Trigger


@dataclass(frozen=True)
class EngineSlot:
    """One rollout engine and the devices it holds."""

    engine_id: int  # the manager's id
    device_start: int  # first device
    num_devices: int
    borrowed: bool  # on the actor's devices at step start (pre_process)


@dataclass(frozen=True)
class LiveLayout:
    num_devices: int
    actor_devices: int  # the actor holds devices [0, actor_devices), or is growing to that
    actor_model_parallel: int  # devices per actor model replica
    engines: tuple[EngineSlot, ...]  # engines serving rollout now (released ones are gone)
    inference_range: tuple[int, int] | None  # (first device, count) while inference holds devices


@dataclass(frozen=True)
class LiveProgress:
    now: float  # seconds since the step started
    engine_unfinished: dict[
        int, int
    ]  # engine id -> unfinished samples on it (running, plus its share of the queue)
    num_samples: int  # samples in the step
    num_unfinished: int  # not yet generated
    finished_since_minibatch: int  # samples finished since the actor's last mini-batch ended
    minibatch_samples: int
    num_minibatches: int
    minibatches_done: int
    inference_done: bool  # inference has processed every sample of the step


def build_snapshot(trigger: Trigger, layout: LiveLayout, progress: LiveProgress) -> ResourceSnapshot:
    """The snapshot the simulator would build in the same state."""
    engines = sorted(layout.engines, key=lambda e: e.device_start)
    instances = tuple(
        RolloutInstanceState(
            e.engine_id,
            e.device_start,
            e.num_devices,
            progress.engine_unfinished.get(e.engine_id, 0),
            e.borrowed,
        )
        for e in engines
    )
    return ResourceSnapshot(
        now=progress.now,
        trigger=trigger,
        num_gpus=layout.num_devices,
        actor_gpus=layout.actor_devices,
        actor_model_parallel=layout.actor_model_parallel,
        minibatch_samples=progress.minibatch_samples,
        num_minibatches=progress.num_minibatches,
        minibatches_done=progress.minibatches_done,
        rollout_instances=instances,
        unfinished_fraction=progress.num_unfinished / progress.num_samples,
        samples_per_instance_per_minibatch=progress.finished_since_minibatch / max(1, len(instances)),
        inference_range=layout.inference_range,
        inference_done=progress.inference_done,
    )


def spread_queue(running: dict[int, int], num_waiting: int) -> dict[int, int]:
    """Unfinished samples per engine: each engine's running ones plus an even share of the manager's
    queue (queued samples go to whichever engine frees first; the policy reads only their sum and
    where they are, so an even share keeps both right)."""
    ids = sorted(running)
    if not ids:
        return {}
    share, extra = divmod(num_waiting, len(ids))
    return {engine_id: running[engine_id] + share + (i < extra) for i, engine_id in enumerate(ids)}
