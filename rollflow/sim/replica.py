"""One model replica: a batch scheduler feeding a pipeline of stages, timed by the predictor.

Up to `num_stages` batches are in flight at once (pipeline parallelism); each stage runs one
batch at a time and queues the rest in order. With one stage, a decode-only batch is planned
as a run of many iterations (see `ReplicaScheduler.max_decode_run`); an arrival routed to the
replica mid-run cuts the run at the first iteration boundary at or after the arrival, which is
where a per-iteration simulator would have admitted it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from rollflow.perf.predictor import ExecutionTimePredictor
from rollflow.policy.view import InstanceView
from rollflow.sim.batching import ReplicaScheduler
from rollflow.sim.request import Batch, SimRequest


@dataclass
class ReplicaStats:
    """Totals a replica accumulates; the metrics module turns them into percentages."""

    busy_s: float = 0.0  # summed over stages
    flops: float = 0.0
    num_iterations: int = 0
    batches: list[tuple[float, float, int, int, int, int]] = field(default_factory=list)
    # (scheduled_at, duration, size, tokens per iteration, prefill tokens, iterations)
    kv_samples: list[tuple[float, float, int, int]] = field(default_factory=list)
    # (time, kv used fraction, waiting requests, resident requests)


class Replica:
    def __init__(
        self,
        replica_id: int,
        scheduler: ReplicaScheduler,
        predictor: ExecutionTimePredictor,
        fast_forward: bool,
        max_run_iterations: int = 1 << 20,
    ) -> None:
        self.id = replica_id
        self.scheduler = scheduler
        self.predictor = predictor
        self.num_stages = predictor.num_stages
        self.fast_forward = fast_forward and self.num_stages == 1
        self.max_run_iterations = max_run_iterations
        self.stage_busy = [False] * self.num_stages
        self.stage_queues: list[deque[Batch]] = [deque() for _ in range(self.num_stages)]
        self.num_running_batches = 0
        self.run_in_flight: Batch | None = None
        self.schedule_pending = False
        self.stats = ReplicaStats()

    # -- forming batches --------------------------------------------------------------------
    def form_batches(self, now: float) -> list[Batch]:
        batches = []
        scheduler = self.scheduler
        while self.num_running_batches < self.num_stages:
            batch = scheduler.next_batch()
            if batch is None:
                break
            self.num_running_batches += 1
            self._time_batch(batch)
            batch.scheduled_at = now
            for request in batch.requests:
                if request.scheduled_at is None:
                    request.scheduled_at = now
            batches.append(batch)
        if batches:
            self.stats.kv_samples.append(
                (
                    now,
                    scheduler.num_allocated_blocks / scheduler.num_blocks,
                    len(scheduler.waiting),
                    scheduler.num_resident,
                )
            )
        return batches

    def _time_batch(self, batch: Batch) -> None:
        predictor = self.predictor
        requests, num_tokens = batch.requests, batch.num_tokens
        decode_only = batch.num_prefill_tokens == 0
        if decode_only and self.fast_forward:
            limit = min(r.num_prefill + r.num_decode - r.processed for r in requests)
            iterations = self.scheduler.max_decode_run(batch, min(limit, self.max_run_iterations))
            if iterations > 1:
                kv_sum = sum(r.processed for r in requests)
                batch.num_iterations = iterations
                batch.pieces = predictor.decode_run(len(requests), kv_sum, iterations)
                return
        decode_size = 0
        kv_sum = 0
        prefills = []
        pairs = 0
        for request, tokens in zip(requests, num_tokens, strict=True):
            pairs += tokens * (tokens + request.processed)
            if request.prefill_done:
                decode_size += 1
                kv_sum += request.processed
            else:
                prefills.append((request.processed, tokens))
        total = sum(num_tokens)
        last = predictor.stage_seconds(total, decode_size, kv_sum, prefills, is_last_stage=True)
        middle = (
            predictor.stage_seconds(total, decode_size, kv_sum, prefills, is_last_stage=False)
            if self.num_stages > 1
            else last
        )
        batch.stage_seconds = (middle, last)
        batch.pieces = [(1, last)]
        batch.attention_pairs = pairs

    def stage_time(self, batch: Batch, stage: int) -> float:
        if batch.num_iterations > 1:
            return sum(count * seconds for count, seconds in batch.pieces)
        return batch.stage_seconds[1] if stage == self.num_stages - 1 else batch.stage_seconds[0]

    # -- finishing batches --------------------------------------------------------------------
    def finish_batch(self, batch: Batch, now: float) -> list[SimRequest]:
        """Apply a finished batch to its requests; return those that completed."""
        scheduler = self.scheduler
        completed = []
        iterations = batch.num_iterations
        before = 0
        after = 0
        if iterations > 1:
            scheduler.grow_for_run(batch, iterations)
            for request in batch.requests:
                request.processed += iterations
                if request.processed == request.num_prefill + request.num_decode:
                    request.completed_at = now
                    completed.append(request)
            after = iterations * batch.size
        else:
            for request, tokens in zip(batch.requests, batch.num_tokens, strict=True):
                before += request.processed
                request.on_iteration_end(now, tokens)
                after += request.processed
                if request.completed_at is not None:
                    completed.append(request)
            after -= before
        scheduler.resident_remaining_tokens -= after
        scheduler.on_batch_end(batch)
        self.num_running_batches -= 1
        stats = self.stats
        stats.busy_s += sum(count * seconds for count, seconds in batch.pieces)
        stats.busy_s += (self.num_stages - 1) * batch.stage_seconds[0]
        stats.num_iterations += iterations
        duration = now - batch.scheduled_at
        stats.batches.append(
            (
                batch.scheduled_at,
                duration,
                batch.size,
                sum(batch.num_tokens),
                batch.num_prefill_tokens,
                iterations,
            )
        )
        stats.flops += self._flops(batch)
        if self.run_in_flight is batch:
            self.run_in_flight = None
        return completed

    def _flops(self, batch: Batch) -> float:
        """Useful FLOPs of a finished batch, as Vidur's MFU counts them (weights + attention pairs)."""
        predictor = self.predictor
        n = batch.num_iterations
        tokens = sum(batch.num_tokens) * n
        if n > 1:
            # each request had processed - n + j cached tokens at iteration j (it has been updated)
            start_kv = sum(r.processed for r in batch.requests) - n * batch.size
            pairs = batch.size * n + n * start_kv + batch.size * n * (n - 1) // 2
        else:
            pairs = batch.attention_pairs
        return predictor.flops_per_token * tokens + predictor.attention_flops_per_pair * pairs

    # -- decode runs ----------------------------------------------------------------------------
    def iterations_done(self, batch: Batch, now: float) -> int:
        """Iterations of a run in flight that finished by `now`."""
        done = 0
        clock = batch.scheduled_at
        for count, seconds in batch.pieces:
            if clock + count * seconds <= now:
                done += count
                clock += count * seconds
                continue
            return done + max(0, int((now - clock) / seconds))
        return done

    def cut_run(self, batch: Batch, now: float) -> bool:
        """Shorten the run in flight to end at the first iteration boundary >= now; True if cut."""
        clock = batch.scheduled_at
        kept: list[tuple[int, float]] = []
        for count, seconds in batch.pieces:
            end = clock + count * seconds
            if end < now:
                kept.append((count, seconds))
                clock = end
                continue
            needed = max(1, -int(-(now - clock) // seconds))
            while needed < count and clock + needed * seconds < now:
                needed += 1
            kept.append((needed, seconds))
            total = sum(c for c, _ in kept)
            if total == batch.num_iterations:
                return False
            batch.pieces = kept
            batch.num_iterations = total
            batch.end_time = clock + needed * seconds
            batch.version += 1
            return True
        return False

    # -- snapshot ---------------------------------------------------------------------------
    def view(self, now: float) -> InstanceView:
        scheduler = self.scheduler
        running_tokens = scheduler.resident_remaining_tokens
        run = self.run_in_flight
        if run is not None:
            running_tokens -= self.iterations_done(run, now) * run.size
        return InstanceView(
            instance_id=self.id,
            num_running=scheduler.num_resident,
            num_queued=len(scheduler.waiting),
            queued_tokens=scheduler.waiting_tokens,
            running_tokens=running_tokens,
            kv_usage=scheduler.num_allocated_blocks / scheduler.num_blocks,
        )
