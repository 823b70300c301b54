"""The decoding requests of a replica, advanced as one aggregate: O(1) per iteration, not O(batch).

Every decoding request gains exactly one token per iteration, so the cohort keeps a clock (the
iterations it has run) and each member keeps `decode_base = processed - clock`. From that the
aggregate needs of an iteration follow without touching members:

- KV tokens: sum(processed) = sum(decode_base) + size * clock;
- new blocks: a request scheduled with `processed = P` needs a block when P = 1 (mod block),
  so members are counted by `decode_base mod block` and one class needs a block per iteration;
- completions: a member finishes when its clock reaches `total - decode_base`, kept in a heap.

A member's own fields are brought up to date (materialised) only when it leaves the cohort.
The batch schedulers fall back to their per-request path when a block request could fail,
and hand the members back to that path.
"""

from __future__ import annotations

import heapq

from rollflow.sim.request import SimRequest


class DecodeCohort:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.clock = 0
        self.members: set[SimRequest] = set()
        self.base_sum = 0
        self.phase_counts = [0] * block_size
        self._finish_heap: list[tuple[int, float, int, SimRequest]] = []

    def __len__(self) -> int:
        return len(self.members)

    @property
    def kv_sum(self) -> int:
        return self.base_sum + len(self.members) * self.clock

    def join(self, request: SimRequest) -> None:
        """Add a request whose prefill just finished; its `processed` and `blocks` are current."""
        base = request.processed - self.clock
        request.decode_base = base
        self.members.add(request)
        self.base_sum += base
        self.phase_counts[base % self.block_size] += 1
        finish = request.num_prefill + request.num_decode - base
        heapq.heappush(self._finish_heap, (finish, request.arrived_at, request.id, request))

    def blocks_needed(self, iterations: int = 1) -> int:
        """New blocks the next `iterations` iterations allocate in total."""
        counts, block = self.phase_counts, self.block_size
        if iterations == 1:
            return counts[(1 - self.clock) % block]
        cycles, rest = divmod(iterations, block)
        total = cycles * len(self.members)
        if rest:  # the classes start, start - 1, ..., start - rest + 1 (mod block): one or two slices
            start = (1 - self.clock) % block
            first = start - rest + 1
            if first >= 0:
                total += sum(counts[first : start + 1])
            else:
                total += sum(counts[: start + 1]) + sum(counts[block + first :])
        return total

    def iterations_to_next_finish(self) -> int:
        return self._finish_heap[0][0] - self.clock if self._finish_heap else 0

    def advance(self, iterations: int, now: float) -> list[SimRequest]:
        """Account `iterations` finished iterations; return members that completed (materialised)."""
        self.clock += iterations
        finished = []
        heap = self._finish_heap
        while heap and heap[0][0] <= self.clock:
            request = heapq.heappop(heap)[3]
            self._remove(request)
            request.completed_at = now
            finished.append(request)
        return finished

    def release_all(self) -> list[SimRequest]:
        """Hand every member back to per-request scheduling, materialised, in arrival order."""
        members = sorted(self.members, key=lambda r: (r.arrived_at, r.id))
        for request in members:
            self._materialise(request)
        self.members.clear()
        self._finish_heap.clear()
        self.base_sum = 0
        self.phase_counts = [0] * self.block_size
        return members

    def _remove(self, request: SimRequest) -> None:
        self.members.discard(request)
        self.base_sum -= request.decode_base
        self.phase_counts[request.decode_base % self.block_size] -= 1
        self._materialise(request)

    def _materialise(self, request: SimRequest) -> None:
        request.processed = request.decode_base + self.clock
        # Blocks after the last scheduled iteration (at processed - 1): ceil((processed - 1) / block).
        request.blocks = -(-(request.processed - 1) // self.block_size)
