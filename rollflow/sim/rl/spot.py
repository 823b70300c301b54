"""When each preemptible instance slot is alive: from a trace file, or a generated up/down process.

A slot's lives are `(up, down)` intervals in simulated seconds. Generated slots start up at
time 0, live an exponential time (mean `mean_lifetime_s`), stay down an exponential time
(mean `mean_downtime_s`), and so on; intervals are drawn on demand, so any horizon works.
"""

from __future__ import annotations

import numpy as np

from rollflow.errors import UserError
from rollflow.sim.rl.config import GeneratedAvailability, SpotConfig, TraceAvailability
from rollflow.sim.workload import read_trace_columns


class SpotMarket:
    def __init__(self, spot: SpotConfig, seed: int) -> None:
        self.num_slots = spot.instances
        self.notice_s = spot.availability.notice_s
        self.startup_s = spot.startup_s
        self._availability = spot.availability
        # One generator per slot: a slot's lives do not depend on the order slots are asked about.
        self._rngs = [np.random.default_rng([seed, slot]) for slot in range(self.num_slots)]
        self._lives: list[list[tuple[float, float]]] = [[] for _ in range(self.num_slots)]
        if isinstance(spot.availability, TraceAvailability):
            self._load_trace(spot.availability)

    def _load_trace(self, trace: TraceAvailability) -> None:
        cols = read_trace_columns(trace.file, ("instance", "start_s", "end_s"))
        for slot, up, down in zip(cols["instance"], cols["start_s"], cols["end_s"], strict=True):
            if not 0 <= slot < self.num_slots or slot != int(slot):
                raise UserError(
                    f"{trace.file}: instance {slot:g} is outside 0..{self.num_slots - 1} (spot.instances={self.num_slots})"
                )
            if down <= up:
                raise UserError(f"{trace.file}: instance {int(slot)} has end_s {down:g} <= start_s {up:g}")
            self._lives[int(slot)].append((float(up), float(down)))
        for lives in self._lives:
            lives.sort()

    def life_at_or_after(self, slot: int, time: float) -> tuple[float, float] | None:
        """The first life of `slot` that has not ended by `time`, or None if there is none."""
        lives = self._lives[slot]
        if isinstance(self._availability, GeneratedAvailability):
            self._extend(slot, time)
        for up, down in lives:
            if down > time:
                return up, down
        return None

    def _extend(self, slot: int, time: float) -> None:
        config = self._availability
        lives = self._lives[slot]
        while not lives or lives[-1][1] <= time:
            rng = self._rngs[slot]
            up = lives[-1][1] + rng.exponential(config.mean_downtime_s) if lives else 0.0
            lives.append((up, up + rng.exponential(config.mean_lifetime_s)))

    def alive_seconds(self, slot: int, start: float, end: float) -> float:
        """Seconds `slot` is alive (paid for) within [start, end]."""
        total = 0.0
        time = start
        while time < end:
            life = self.life_at_or_after(slot, time)
            if life is None or life[0] >= end:
                break
            total += min(life[1], end) - max(life[0], start)
            time = life[1]
        return total


def serving_window(life: tuple[float, float], market: SpotMarket) -> tuple[float, float]:
    """When a life serves: after startup, until its preemption notice (ready >= stop: never)."""
    up, down = life
    return up + market.startup_s, max(down - market.notice_s, up)
