"""Replica batch schedulers: which requests run in the next iteration, and paged-KV accounting.

Each call to `next_batch` decides one iteration, with the semantics of Vidur's replica
schedulers so that the two simulators agree:

- `vllm`: new requests are prefilled whole, in batches of their own, while their blocks fit
  above the watermark and `batch size x longest prompt <= max_tokens_in_batch`; otherwise all
  running requests decode together. A running request that cannot get a block preempts the
  latest-arrived running request (restart by recompute), or itself if none is left.
- `sarathi`: every iteration carries all decodes, then running prefill chunks, then new
  requests, within a `chunk_size` token budget (chunked prefill); same preemption rule.
- `orca`: iteration-level batching that reserves blocks for the full request length at
  admission, so it never preempts.

Requests in flight (in a batch not yet finished) are in neither queue. With one pipeline
stage, vllm and sarathi keep decoding requests in a `DecodeCohort` and schedule them in
aggregate while no block request can fail; otherwise they go request by request.

With prefix caching on (vllm and sarathi), a request admitted with a cached prefix starts with
that prefix computed (at least its last prompt token is left to compute) and references the
cached blocks instead of allocating them; its full prompt blocks join the cache at admission
(so later requests share them: as in vLLM v1, which caches blocks when it schedules them, and
here a request admitted later runs in the iteration of every earlier prompt's last chunk), and
when it finishes or is preempted its blocks are released and its computed output blocks cached,
all evictable (see `prefix_cache`); prompt blocks a preempted prefill never computed are dropped.
"""

from __future__ import annotations

from collections import deque
from math import ceil

from rollflow.sim.cohort import DecodeCohort
from rollflow.sim.prefix_cache import PrefixCache, block_hashes
from rollflow.sim.request import IterationBatch, SimRequest


class ReplicaScheduler:
    """Waiting queue, running set and KV blocks of one replica; subclasses pick batches."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        batch_size_cap: int,
        num_stages: int,
        watermark_blocks_fraction: float,
        aggregate_decodes: bool = False,
        prefix_caching: bool = False,
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.batch_size_cap = batch_size_cap
        self.max_micro_batch_size = max(1, batch_size_cap // num_stages)
        self.watermark_blocks = int(watermark_blocks_fraction * num_blocks)
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []  # resident, not in flight; Vidur calls these "preempted"
        self.cohort = DecodeCohort(block_size) if aggregate_decodes and num_stages == 1 else None
        self._cohort_first_blocks = 0  # blocks the cohort took for the batch just formed
        self.num_allocated_blocks = 0
        self.num_resident = 0  # requests holding blocks (running, in the cohort, or in flight)
        self.waiting_tokens = 0  # prompt + output tokens of the waiting requests
        self.resident_remaining_tokens = 0  # tokens the resident requests still have to process
        self.num_preemptions = 0
        self.prefix_cache = PrefixCache() if prefix_caching else None

    # -- KV blocks ---------------------------------------------------------------------------
    @property
    def free_blocks(self) -> int:
        return self.num_blocks - self.num_allocated_blocks

    def _allocate(self, request: SimRequest, num_blocks: int, newly_allocated: int | None = None) -> None:
        """Give `request` `num_blocks` more blocks, of which `newly_allocated` (default: all) come
        out of free memory (the rest are cached blocks other requests already hold)."""
        if request.blocks == 0:
            self.num_resident += 1
            self.resident_remaining_tokens += request.total_tokens - request.processed
        request.blocks += num_blocks
        self.num_allocated_blocks += num_blocks if newly_allocated is None else newly_allocated

    def free(self, request: SimRequest) -> None:
        cache = self.prefix_cache
        if cache is None:
            self.num_allocated_blocks -= request.blocks
        else:
            self._trim_cache()
            shared = request.shared
            self.num_allocated_blocks -= request.blocks - len(shared) + cache.release(shared)
            kv_tokens = request.processed - 1 if request.prefill_done else request.processed
            # preempted mid-prefill: prompt blocks it registered but never computed are not a cache
            cache.discard_unreferenced(shared[kv_tokens // self.block_size :])
            cache.insert_evictable(self._hashes(request)[len(shared) : kv_tokens // self.block_size])
            request.shared = []
            if request.completed_at is not None:
                request.hashes = None  # not needed again; a long run keeps every request
        self.resident_remaining_tokens -= request.total_tokens - request.processed
        request.blocks = 0
        self.num_resident -= 1

    def _can_admit_or_grow(self, request: SimRequest) -> bool:
        if request.blocks == 0:
            needed = ceil(request.num_prefill / self.block_size)
            if self.prefix_cache is not None:
                needed -= self._look_up_prefix(request)
            return self.num_blocks - self.num_allocated_blocks - needed >= self.watermark_blocks
        return self.num_blocks - self.num_allocated_blocks >= 1

    def _admit_or_grow(self, request: SimRequest) -> None:
        if request.blocks == 0:
            num_blocks = ceil(request.num_prefill / self.block_size)
            cache = self.prefix_cache
            if cache is None:
                self._allocate(request, num_blocks)
                return
            self._look_up_prefix(request)
            prompt = self._hashes(request)[: request.num_prefill // self.block_size]
            taken = cache.acquire(prompt)
            request.shared = prompt
            if request.num_restarts == 0:
                request.cached_tokens = request.processed
            self._allocate(request, num_blocks, taken + num_blocks - len(prompt))
            self._trim_cache()
        elif request.processed > request.blocks * self.block_size:
            self._allocate(request, 1)

    # -- prefix cache ----------------------------------------------------------------------------
    def _hashes(self, request: SimRequest) -> list[int]:
        if request.hashes is None:
            total = request.prompt_tokens + request.output_tokens
            request.hashes = block_hashes(request.segments, total, self.block_size)
        return request.hashes

    def _look_up_prefix(self, request: SimRequest) -> int:
        """Mark a waiting request's cached prefix computed (all but its last prompt token at most);
        return how many of its prompt blocks other requests hold (admitting it allocates none)."""
        cache = self.prefix_cache
        assert cache is not None
        self._trim_cache()
        prompt = self._hashes(request)[: request.num_prefill // self.block_size]
        hit_tokens = cache.match(prompt) * self.block_size
        request.processed = min(hit_tokens, request.num_prefill - 1)
        return cache.num_referenced_among(prompt)

    def cached_prefix_tokens(self, request: SimRequest) -> int:
        """Prompt tokens of `request` this replica has cached now (0 without prefix caching)."""
        cache = self.prefix_cache
        if cache is None:
            return 0
        self._trim_cache()
        prompt = self._hashes(request)[: request.num_prefill // self.block_size]
        return cache.match(prompt) * self.block_size

    def _trim_cache(self) -> None:
        """Evict what blocks taken since (decode growth) need: unreferenced cached blocks live in
        free memory, so at most `num_blocks - allocated` stay. Done lazily, before the cache is
        read or changed; the LRU order is the same as evicting at each allocation."""
        cache = self.prefix_cache
        if cache is not None:
            cache.evict_to(self.num_blocks - self.num_allocated_blocks)

    def _preempt_for(self, request: SimRequest) -> bool:
        """Free blocks for a running request by restarting the latest arrivals; False if it lost."""
        running = self.running
        while not self._can_admit_or_grow(request):
            if running:
                self._restart(running.pop())
            else:
                self._restart(request)
                return False
        self._admit_or_grow(request)
        return True

    def _restart(self, request: SimRequest) -> None:
        self.num_preemptions += 1
        self.free(request)
        request.restart()
        self.waiting.appendleft(request)
        self.waiting_tokens += request.total_tokens

    def _pop_waiting(self) -> SimRequest:
        request = self.waiting.popleft()
        self.waiting_tokens -= request.total_tokens
        return request

    # -- scheduling ----------------------------------------------------------------------------
    def add_request(self, request: SimRequest) -> None:
        self.waiting.append(request)
        self.waiting_tokens += request.total_tokens

    def next_batch(self) -> IterationBatch | None:
        raise NotImplementedError

    def _schedule_cohort(self) -> int:
        """Schedule every decoding request for the next iteration in aggregate, if safe.

        Safe means no block request can fail (one block stays free after the cohort's new
        blocks) and the batch cap is not reached. Returns how many were scheduled; on 0 with a
        non-empty cohort its members are back in `running` for the per-request path.
        """
        cohort = self.cohort
        if cohort is None:
            return 0
        running = self.running
        if running:
            decoding = [r for r in running if r.prefill_done]
            if decoding:
                for request in decoding:
                    cohort.join(request)
                running[:] = [r for r in running if not r.prefill_done]
        size = len(cohort)
        if not size:
            return 0
        needed = cohort.blocks_needed()
        if size < self.max_micro_batch_size and self.num_blocks - self.num_allocated_blocks - needed >= 1:
            self.num_allocated_blocks += needed
            self._cohort_first_blocks = needed
            return size
        running.extend(cohort.release_all())
        return 0

    def _batch(
        self,
        requests: list[SimRequest],
        num_tokens: list[int],
        cohort_size: int,
        num_prefill_tokens: int | None = None,
    ) -> IterationBatch | None:
        if not requests and not cohort_size:
            return None
        kv_sum = self.cohort.kv_sum if cohort_size else 0
        return IterationBatch(requests, num_tokens, cohort_size, kv_sum, num_prefill_tokens)

    # -- decode runs ---------------------------------------------------------------------------
    def plan_run(self, batch: IterationBatch) -> int:
        """Iterations the just-formed `batch` can repeat with no scheduling change.

        A cohort-only batch repeats while no request finishes, no block request can fail (every
        check passes while one block stays free), and no waiting request could be admitted: when
        a decode-only batch is formed the waiting queue is empty or blocked, and a blocked queue
        stays blocked while blocks are only taken, never freed. Schedulers with chunked prefill
        also repeat a batch whose one prefill takes the whole token budget (`_chunk_run_limit`).
        """
        cohort = self.cohort
        if cohort is None or not batch.cohort_size:
            return 1
        limit = cohort.iterations_to_next_finish()
        if batch.requests:
            limit = min(limit, self._chunk_run_limit(batch))
        elif self.waiting and not self._waiting_blocked(batch):
            return 1  # a request preempted while forming this batch may be admitted next
        if limit <= 1:
            return 1
        first = self._cohort_first_blocks  # taken when the batch formed
        free = self.num_blocks - self.num_allocated_blocks - 1
        if cohort.blocks_needed(limit) - first <= free:
            return limit
        lo, hi = 1, limit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if cohort.blocks_needed(mid) - first <= free:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _chunk_run_limit(self, batch: IterationBatch) -> int:
        """Iterations a batch with explicit requests can repeat unchanged; 1 unless chunking."""
        return 1

    def _waiting_blocked(self, batch: IterationBatch) -> bool:
        """Whether the head of the waiting queue cannot join the next iteration of `batch`."""
        return (
            self.num_resident == self.batch_size_cap
            or batch.size >= self.max_micro_batch_size
            or not self._can_admit_or_grow(self.waiting[0])
        )

    def release_all(self) -> list[SimRequest]:
        """Empty the replica (it is retired): every waiting and resident request not in flight is
        handed back, its KV blocks freed and its tokens taken off the totals."""
        released = list(self.waiting)
        self.waiting.clear()
        if self.prefix_cache is not None:
            for request in released:
                request.processed = 0  # a cache look-up's mark, meaningless on another replica
        self.waiting_tokens = 0
        resident = [*self.running, *(self.cohort.release_all() if self.cohort is not None else ())]
        self.running.clear()
        for request in resident:
            self.free(request)
        return released + resident

    # -- finishing -----------------------------------------------------------------------------
    def finish(self, batch: IterationBatch, now: float) -> list[SimRequest]:
        """Apply a finished batch to its requests; return those that completed."""
        iterations = batch.num_iterations
        completed: list[SimRequest] = []
        processed = 0
        if batch.cohort_size:
            cohort = self.cohort
            if iterations > 1:  # the first iteration's blocks were taken when the batch formed
                self.num_allocated_blocks += cohort.blocks_needed(iterations) - self._cohort_first_blocks
            for request in cohort.advance(iterations, now):
                self.free(request)
                completed.append(request)
            processed += iterations * batch.cohort_size
        if iterations > 1:
            for request, tokens in zip(batch.requests, batch.num_tokens, strict=True):
                request.processed += iterations * tokens
                if request.processed == request.num_prefill + request.num_decode:
                    request.completed_at = now
                processed += iterations * tokens
        else:
            for request, tokens in zip(batch.requests, batch.num_tokens, strict=True):
                before = request.processed
                request.on_iteration_end(now, tokens)
                processed += request.processed - before
        self.resident_remaining_tokens -= processed
        cohort = self.cohort
        for request in batch.requests:
            if request.completed_at is not None:
                self.free(request)
                completed.append(request)
            elif cohort is not None and request.prefill_done:
                cohort.join(request)
            else:
                self.running.append(request)
        return completed


class VllmScheduler(ReplicaScheduler):
    def __init__(self, *args: object, max_tokens_in_batch: int, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.max_tokens_in_batch = max_tokens_in_batch

    def next_batch(self) -> IterationBatch | None:
        requests: list[SimRequest] = []
        num_tokens: list[int] = []
        longest = 0
        waiting = self.waiting
        while waiting:
            request = waiting[0]
            if not self._can_admit_or_grow(request):
                break
            tokens = 1 if request.prefill_done else request.num_prefill - request.processed
            if (len(requests) + 1) * max(longest, tokens) > self.max_tokens_in_batch:
                break
            if self.num_resident == self.batch_size_cap or len(requests) == self.max_micro_batch_size:
                break
            self._pop_waiting()
            self._admit_or_grow(request)
            requests.append(request)
            num_tokens.append(tokens)
            longest = max(longest, tokens)
        if requests:
            return IterationBatch(requests, num_tokens)

        cohort_size = self._schedule_cohort()
        running = self.running
        running.sort(key=_arrival)
        while running and len(requests) + cohort_size < self.max_micro_batch_size:
            request = running.pop(0)
            if self._preempt_for(request):
                requests.append(request)
                num_tokens.append(1 if request.prefill_done else request.num_prefill - request.processed)
        return self._batch(requests, num_tokens, cohort_size)

    def _waiting_blocked(self, batch: IterationBatch) -> bool:
        head = self.waiting[0]
        return super()._waiting_blocked(batch) or head.num_prefill > self.max_tokens_in_batch


class SarathiScheduler(ReplicaScheduler):
    def __init__(self, *args: object, chunk_size: int, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.chunk_size = chunk_size

    def _chunk(self, request: SimRequest, batch_tokens: int) -> int:
        if request.prefill_done:
            return 1
        # max(0, min(left, budget)), without the calls: it runs once per prefill per iteration
        left = request.num_prefill - request.processed
        budget = self.chunk_size - batch_tokens
        tokens = left if left < budget else budget
        return tokens if tokens > 0 else 0

    def next_batch(self) -> IterationBatch | None:
        requests: list[SimRequest] = []
        num_tokens: list[int] = []
        prefilling: list[SimRequest] = []
        skipped: list[SimRequest] = []
        cohort_size = self._schedule_cohort()
        batch_tokens = cohort_size
        running = self.running
        # Arrival order, so that preemption always takes the latest arrivals (see docs/vidur.md).
        running.sort(key=_arrival)
        while running and len(requests) + cohort_size < self.max_micro_batch_size:
            request = running.pop(0)
            if not request.prefill_done:
                prefilling.append(request)
                continue
            if self._preempt_for(request):
                batch_tokens += 1
                requests.append(request)
                num_tokens.append(1)
        prefill_tokens = 0  # counted here for the IterationBatch, which would otherwise sum them again
        for request in prefilling:
            tokens = self._chunk(request, batch_tokens)
            if tokens == 0:
                skipped.append(request)
                continue
            batch_tokens += tokens
            prefill_tokens += tokens
            requests.append(request)
            num_tokens.append(tokens)
        if skipped:
            running[:0] = skipped

        waiting = self.waiting
        while waiting:
            if (
                self.num_resident == self.batch_size_cap
                or len(requests) + cohort_size == self.max_micro_batch_size
            ):
                break
            request = waiting[0]
            if not self._can_admit_or_grow(request):
                break
            tokens = self._chunk(request, batch_tokens)
            if tokens == 0:
                break
            self._pop_waiting()
            self._admit_or_grow(request)
            batch_tokens += tokens
            if not request.prefill_done:  # a request handed over mid-decode may wait here
                prefill_tokens += tokens
            requests.append(request)
            num_tokens.append(tokens)
        return self._batch(requests, num_tokens, cohort_size, prefill_tokens)

    def _waiting_blocked(self, batch: IterationBatch) -> bool:
        return super()._waiting_blocked(batch) or batch.size >= self.chunk_size

    def _chunk_run_limit(self, batch: IterationBatch) -> int:
        """A lone prefill that takes the whole budget gets the same chunk until its last one.

        Decodes come first and each takes one token, then prefills in arrival order: the lone
        prefill is the earliest, later prefills and new requests get no budget, and that holds
        until its remaining prompt no longer exceeds the budget.
        """
        if len(batch.requests) != 1:
            return 1
        request, tokens = batch.requests[0], batch.num_tokens[0]
        if request.prefill_done or tokens + batch.cohort_size != self.chunk_size:
            return 1
        return (request.num_prefill - request.processed - 1) // tokens


class OrcaScheduler(ReplicaScheduler):
    def __init__(self, *args: object, max_batch_size: int, max_tokens: int, **kwargs: object) -> None:
        kwargs["aggregate_decodes"] = False  # blocks are reserved per request up front
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.max_batch_size = max_batch_size
        self.blocks_per_request = max_tokens // self.block_size

    def next_batch(self) -> IterationBatch | None:
        requests: list[SimRequest] = []
        num_tokens: list[int] = []
        running = self.running
        while running and len(requests) < self.max_batch_size:
            request = running.pop(0)
            requests.append(request)
            num_tokens.append(1 if request.prefill_done else request.num_prefill)
        waiting = self.waiting
        while waiting and len(requests) < self.max_batch_size:
            if self.free_blocks < self.blocks_per_request:
                break
            request = self._pop_waiting()
            self._allocate(request, self.blocks_per_request)
            requests.append(request)
            num_tokens.append(1 if request.prefill_done else request.num_prefill)
        return self._batch(requests, num_tokens, 0)

    def plan_run(self, batch: IterationBatch) -> int:
        # Blocks were reserved for the whole request at admission; only admissions can change.
        if batch.num_prefill_tokens or (self.waiting and not self._waiting_blocked(batch)):
            return 1
        return min(r.num_prefill + r.num_decode - r.processed for r in batch.requests)

    def _waiting_blocked(self, batch: IterationBatch) -> bool:
        return batch.size >= self.max_batch_size or self.free_blocks < self.blocks_per_request


def _arrival(request: SimRequest) -> float:
    return request.arrived_at
