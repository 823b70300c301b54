"""The one event core every simulator runs on: frozen events, one order, handlers that return events.

Events sort by `(time, phase, seq)` and by nothing else:

- `time`: simulated seconds.
- `phase`, at equal times, in the order of `Phase`: a request that arrives exactly when a batch
  ends is seen by the scheduling decision taken at that moment; every batch ending at that
  moment is applied before replicas form their next batches; and an RL step acts on its
  rollout only once the serving cluster is settled at that time. (Vidur states an order by
  event type but its heap compares creation ids first, so its ties fall to creation order.)
- `seq`: the queue's counter at the event's creation, so equal (time, phase) keep creation order.

A handler takes its event and returns the events it causes (`NO_EVENTS` for none); the loop
(`ServingSimulator.advance`) pushes them. Nothing else pushes, except the simulators' public
entry points, which act between events.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from enum import IntEnum
from itertools import count
from typing import Any, NamedTuple


class Phase(IntEnum):
    # serving cluster
    ARRIVAL = 0  # a request reaches the cluster and is routed
    STAGE_END = 1  # a batch finishes a pipeline stage
    SCHEDULE = 2  # a replica forms its next batches
    # an RL step, once the serving events at that time are in
    ROLLOUT = 3  # finished samples reported to the step
    REWARD = 4  # a group of samples rewarded, ready for inference
    INFERENCE = 5  # an inference pass ends
    TRAIN = 6  # a mini-batch (or an actor reshard) ends
    SYNC = 7  # the weight sync ends: the step is over
    MOVE = 8  # instances come and go (spot ready, notice, kill; offload budget; sequences handed back)


class Event(NamedTuple):
    """Immutable; `seq` is unique, so comparison never reaches the fields after it."""

    time: float
    phase: Phase
    seq: int
    handler: Handler
    target: int = 0  # replica, instance, group or slot the event is about
    stage: int = 0
    payload: Any = None  # the batch of a stage end, the requests of a rollout event, ...
    version: int = 0  # a stage end whose batch has a newer version was superseded (a cut run)


Handler = Callable[[Event], Sequence[Event]]
NO_EVENTS: tuple[Event, ...] = ()


class EventQueue:
    def __init__(self) -> None:
        self.heap: list[Event] = []  # a heapq heap; the simulator's loop pops it directly
        self.next_seq = count(1).__next__  # hot paths build `Event(..., next_seq(), ...)` themselves

    def event(
        self,
        time: float,
        phase: Phase,
        handler: Handler,
        target: int = 0,
        stage: int = 0,
        payload: Any = None,
        version: int = 0,
    ) -> Event:
        """A new event numbered by this queue (not yet pushed)."""
        return Event(time, phase, self.next_seq(), handler, target, stage, payload, version)

    def push(self, event: Event) -> None:
        heapq.heappush(self.heap, event)

    def push_all(self, events: Sequence[Event]) -> None:
        for event in events:
            heapq.heappush(self.heap, event)

    def pop(self) -> Event:
        return heapq.heappop(self.heap)

    def __len__(self) -> int:
        return len(self.heap)
