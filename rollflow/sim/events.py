"""Simulation events and their one ordering rule.

Events sort by `(time, phase, seq)` and by nothing else:

- `time`: simulated seconds.
- `phase`, at equal times: ARRIVAL < STAGE_END < SCHEDULE. A request that arrives exactly when
  a batch ends is therefore seen by the scheduling decision taken at that moment, every batch
  ending at that moment is applied first, and replicas form their next batches last, once all
  state changes at that time are in. (Vidur states an order by event type but its heap compares
  creation ids first, so its ties fall to creation order.)
- `seq`: the queue's own counter for heap events, the request index for arrivals; arrivals come
  from a separate sorted stream, which is equivalent to pushing them with phase ARRIVAL.
"""

from __future__ import annotations

import heapq
from enum import IntEnum
from typing import NamedTuple

from rollflow.sim.request import Batch


class Phase(IntEnum):
    ARRIVAL = 0
    STAGE_END = 1
    SCHEDULE = 2


class Event(NamedTuple):
    time: float
    phase: Phase
    seq: int
    replica_id: int
    stage: int = 0
    batch: Batch | None = None
    version: int = 0  # a stage end whose batch has a newer version was superseded (a cut run)


class EventQueue:
    def __init__(self) -> None:
        self._heap: list[Event] = []
        self._seq = 0

    def push(
        self,
        time: float,
        phase: Phase,
        replica_id: int,
        stage: int = 0,
        batch: Batch | None = None,
        version: int = 0,
    ) -> None:
        self._seq += 1
        heapq.heappush(self._heap, Event(time, phase, self._seq, replica_id, stage, batch, version))

    def pop(self) -> Event:
        return heapq.heappop(self._heap)

    def next_time(self) -> float:
        return self._heap[0].time if self._heap else float("inf")

    def __len__(self) -> int:
        return len(self._heap)
