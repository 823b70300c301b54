"""The step's preemptible (spot) instances, as RLBoost runs them: one per slot of the `SpotMarket`.

A slot's instance is ready once its life has started up, stops taking work at its preemption notice,
and is preempted when its life ends (its sequences resume elsewhere, by `spot.on_preemption`); the
slot's next life brings a new instance. A life too short to serve is skipped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rollflow.sim.events import Event, Phase
from rollflow.sim.rl.spot import SpotMarket, serving_window

if TYPE_CHECKING:
    from rollflow.sim.rl.step import StepSimulator


class SpotInstances:
    def __init__(self, step: StepSimulator, market: SpotMarket) -> None:
        self.step = step
        self.market = market
        self.slot_to_instance: dict[int, int] = {}
        self.preemptions = 0

    def start(self) -> None:
        """At the step's start: every slot's instance that is ready now joins, the others later."""
        for slot in range(self.market.num_slots):
            self._schedule(slot, self.step.start, at_start=True)

    def _schedule(self, slot: int, after: float, at_start: bool = False) -> None:
        """The slot's next instance: the first life that serves after `after`."""
        market = self.market
        life = market.life_at_or_after(slot, after)
        while life is not None:
            ready, stop = serving_window(life, market)
            if ready < stop and stop > after:
                break
            life = market.life_at_or_after(slot, life[1])
        if life is None:
            return
        if at_start and ready <= after:
            self._ready(slot, life)
        else:
            self.step.emit(max(ready, after), Phase.MOVE, self._on_ready, (slot, life))

    def _on_ready(self, event: Event) -> list[Event]:
        self._ready(*event.payload)
        return self.step.emitted()

    def _ready(self, slot: int, life: tuple[float, float]) -> None:
        step = self.step
        gpu_start = step.config.num_gpus + slot * step.config.rollout.tensor_parallel
        instance_id = step.pool.add_instance(gpu_start, "spot")
        self.slot_to_instance[slot] = instance_id
        _, stop = serving_window(life, self.market)
        step.emit(stop, Phase.MOVE, self._on_notice, instance_id)
        step.emit(life[1], Phase.MOVE, self._on_preempted, (slot, life))
        step.instances.on_instance_ready()
        step.offload.on_target_ready()

    def _on_notice(self, event: Event) -> list[Event]:
        self.step.pool.stop_accepting(event.payload)
        return self.step.emitted()

    def _on_preempted(self, event: Event) -> list[Event]:
        step = self.step
        slot, life = event.payload
        instance_id = self.slot_to_instance.pop(slot)
        if step.pool.is_up(instance_id):
            self.preemptions += 1
            step.instances.retire(instance_id, step.config.spot.on_preemption, preempted=True)
        self._schedule(slot, life[1])
        return step.emitted()
