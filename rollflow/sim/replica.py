"""One model replica: a batch scheduler feeding a pipeline of stages, timed by the predictor.

Up to `num_stages` batches are in flight at once (pipeline parallelism); each stage runs one
batch at a time and queues the rest in order. With one stage, a batch that cannot change is
planned as a run of many iterations (see `ReplicaScheduler.plan_run`); an arrival routed to
the replica mid-run cuts the run at the first iteration boundary at or after the arrival,
which is where a per-iteration simulator would have admitted it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rollflow.perf.predictor import ExecutionTimePredictor
from rollflow.policy.view import InstanceKind, InstanceView
from rollflow.sim.batching import ReplicaScheduler
from rollflow.sim.request import IterationBatch, SimRequest

if TYPE_CHECKING:
    from rollflow.sim.events import Event

_new_tuple = tuple.__new__
THROUGHPUT_SMOOTHING = 0.2  # weight of the newest batch in `Replica.tokens_per_s`


@dataclass
class ReplicaStats:
    """Totals a replica accumulates; the metrics module turns them into percentages."""

    busy_s: float = 0.0  # summed over stages
    flops: float = 0.0
    num_iterations: int = 0
    decode_tokens: int = 0  # tokens sampled by decode iterations (a prefill's first token is not counted)
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
        kind: InstanceKind = "local",
        started_at: float = 0.0,
        idle_wakeup_s: float = 0.0,
        idle_wakeup_ramp_s: float = 0.05,
        admission_s: float = 0.0,
    ) -> None:
        """`idle_wakeup_s`: what the first batch after an idle of `idle_wakeup_ramp_s` or longer
        waits before it starts (a shorter idle, that fraction of it): execution.idle_wakeup_ms.
        `admission_s`: what an iteration with decodes takes longer per request it admits (its
        first scheduling): execution.admission_ms."""
        self.id = replica_id
        self.scheduler = scheduler
        self.predictor = predictor
        self.num_stages = predictor.num_stages
        self.fast_forward = fast_forward and self.num_stages == 1
        self.stage_busy = [False] * self.num_stages
        self.stage_queues: list[deque[IterationBatch]] = [deque() for _ in range(self.num_stages)]
        self.num_running_batches = 0
        self.run_in_flight: IterationBatch | None = None
        self.schedule_pending = False
        self.stats = ReplicaStats()
        self.tokens_per_s = 0.0  # moving average over finished batches of tokens processed per second
        # membership in the cluster (the simulator's add/stop-accepting/retire calls set these)
        self.kind: InstanceKind = kind
        self.started_at = started_at
        self.accepting = True  # routers may send it new requests
        self.on_stopped: Callable[[list[SimRequest]], Sequence[Event]] | None = None  # retiring
        self.retired_at: float | None = None
        self.idle_wakeup_s = idle_wakeup_s
        self.idle_wakeup_ramp_s = idle_wakeup_ramp_s
        # when its last batch finished, leaving nothing running (none yet: asleep)
        self.idle_since = -math.inf
        self.admission_s = admission_s

    # -- forming batches --------------------------------------------------------------------
    def form_batches(self, now: float) -> list[IterationBatch]:
        batches = []
        scheduler = self.scheduler
        wakeup = 0.0
        if self.idle_wakeup_s and self.num_running_batches == 0:
            wakeup = self.idle_wakeup_s * min(1.0, (now - self.idle_since) / self.idle_wakeup_ramp_s)
        while self.num_running_batches < self.num_stages:
            batch = scheduler.next_batch()
            if batch is None:
                break
            self.num_running_batches += 1
            self._time_batch(batch)
            if wakeup:  # the batch's iterations start once the replica is awake
                batch.wakeup_s = wakeup
                batch.scheduled_at = now + wakeup
                wakeup = 0.0
            else:
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

    def _time_batch(self, batch: IterationBatch) -> None:
        predictor = self.predictor
        decode_size = batch.cohort_size
        kv_sum = batch.cohort_kv_sum
        prefills = []
        pairs = 0
        admitted = 0  # requests scheduled for the first time (form_batches sets scheduled_at after)
        if batch.requests:  # a cohort-only decode batch, the most common, has none
            for request, tokens in zip(batch.requests, batch.num_tokens, strict=True):
                if request.prefill_done:
                    decode_size += 1
                    kv_sum += request.processed
                else:
                    prefills.append((request.processed, tokens))
                    pairs += tokens * (tokens + request.processed)
                    if request.scheduled_at is None:
                        admitted += 1
        # the first iteration's extra time for admitting requests beside running decodes
        admission = self.admission_s * admitted if admitted and decode_size else 0.0
        batch.decode_size = decode_size
        batch.decode_kv_sum = kv_sum
        batch.attention_pairs = pairs
        if self.fast_forward and len(prefills) <= 1:  # a run carries at most one prefill
            iterations = self.scheduler.plan_run(batch)
            if iterations > 1:
                batch.num_iterations = iterations
                if prefills:
                    ((cached, chunk),) = prefills
                    batch.prefill_pair_growth = chunk * chunk
                    batch.pieces = predictor.chunk_run(decode_size, kv_sum, cached, chunk, iterations)
                else:
                    batch.pieces = predictor.decode_run(decode_size, kv_sum, iterations)
                if admission:
                    batch.pieces = _first_iteration_longer(batch.pieces, admission)
                batch.last_stage_s = _run_seconds(batch.pieces)
                return
        total = batch.tokens_per_iteration
        last = predictor.stage_seconds(total, decode_size, kv_sum, prefills, is_last_stage=True)
        middle = (
            predictor.stage_seconds(total, decode_size, kv_sum, prefills, is_last_stage=False)
            if self.num_stages > 1
            else last
        )
        if admission:
            last += admission
            middle += admission
        batch.stage_seconds = (middle, last)
        batch.pieces = [(1, last)]
        batch.last_stage_s = last

    # -- finishing batches --------------------------------------------------------------------
    def finish_batch(self, batch: IterationBatch, now: float) -> list[SimRequest]:
        """Apply a finished batch to its requests; return those that completed."""
        completed = self.scheduler.finish(batch, now)
        self.num_running_batches -= 1
        if not self.num_running_batches:
            self.idle_since = now
        iterations = batch.num_iterations
        stats = self.stats
        stats.busy_s += batch.last_stage_s
        if self.num_stages > 1:
            stats.busy_s += (self.num_stages - 1) * batch.stage_seconds[0]
        stats.num_iterations += iterations
        stats.decode_tokens += (batch.tokens_per_iteration - batch.num_prefill_tokens) * iterations
        stats.batches.append(
            (
                batch.scheduled_at,
                now - batch.scheduled_at,
                batch.size,
                batch.tokens_per_iteration,
                batch.num_prefill_tokens,
                iterations,
            )
        )
        stats.flops += self._flops(batch)
        elapsed = now - batch.scheduled_at
        if elapsed > 0:
            rate = batch.tokens_per_iteration * iterations / elapsed
            self.tokens_per_s += THROUGHPUT_SMOOTHING * (rate - self.tokens_per_s)
        if self.run_in_flight is batch:
            self.run_in_flight = None
        return completed

    def _flops(self, batch: IterationBatch) -> float:
        """Useful FLOPs of a finished batch, as Vidur's MFU counts them (weights + attention pairs).

        A decode token with P cached tokens attends to P + 1 keys; over a run of n iterations
        the decoders' KV sum grows by the batch size each iteration.
        """
        predictor = self.predictor
        n = batch.num_iterations
        size = batch.decode_size
        decode_pairs = size * n + n * batch.decode_kv_sum + size * n * (n - 1) // 2
        pairs = batch.attention_pairs * n + batch.prefill_pair_growth * n * (n - 1) // 2 + decode_pairs
        tokens = batch.tokens_per_iteration * n
        return predictor.flops_per_token * tokens + predictor.attention_flops_per_pair * pairs

    # -- decode runs ----------------------------------------------------------------------------
    def iterations_done(self, batch: IterationBatch, now: float) -> int:
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

    def cut_run(self, batch: IterationBatch, now: float) -> bool:
        """Shorten the run in flight to end at the first iteration boundary >= now; True if cut."""
        clock = batch.scheduled_at
        kept: list[tuple[int, float]] = []
        total = 0  # iterations kept
        for count, seconds in batch.pieces:
            end = clock + count * seconds
            if end < now:
                kept.append((count, seconds))
                total += count
                clock = end
                continue
            needed = max(1, -int(-(now - clock) // seconds))
            while needed < count and clock + needed * seconds < now:
                needed += 1
            kept.append((needed, seconds))
            total += needed
            if total == batch.num_iterations:
                return False
            batch.pieces = kept
            batch.last_stage_s = _run_seconds(kept)
            batch.num_iterations = total
            batch.end_time = clock + needed * seconds
            batch.version += 1
            return True
        return False

    # -- snapshot ---------------------------------------------------------------------------
    def view(self, now: float, request: SimRequest | None = None) -> InstanceView:
        """This replica as a policy sees it; with `request`, how much of its prompt is cached here."""
        scheduler = self.scheduler
        running_tokens = scheduler.resident_remaining_tokens
        run = self.run_in_flight
        if run is not None:
            running_tokens -= self.iterations_done(run, now) * run.tokens_per_iteration
        # Every field, in InstanceView's order, through tuple.__new__ (twice as fast as calling the
        # class): a view is built per replica per arrival.
        return _new_tuple(
            InstanceView,
            (
                self.id,
                scheduler.num_resident,
                len(scheduler.waiting),
                scheduler.waiting_tokens,
                running_tokens,
                scheduler.num_allocated_blocks / scheduler.num_blocks,
                self.tokens_per_s,
                self.kind,
                0,
                scheduler.cached_prefix_tokens(request) if request is not None else 0,
            ),
        )


def _first_iteration_longer(pieces: list[tuple[int, float]], extra: float) -> list[tuple[int, float]]:
    """A run's pieces with `extra` seconds added to its first iteration alone."""
    (count, seconds), rest = pieces[0], pieces[1:]
    head = [(1, seconds + extra)]
    if count > 1:
        head.append((count - 1, seconds))
    return head + rest


def _run_seconds(pieces: list[tuple[int, float]]) -> float:
    """Summed left to right in a loop, not with sum(), whose float rounding changed in Python 3.12:
    the compiled loop (rollflow/sim/_loop.c) adds them the same way on every version."""
    if len(pieces) == 1:  # most runs (the same float: a sum of one term adds it to 0)
        count, seconds = pieces[0]
        return count * seconds
    total = 0.0
    for count, seconds in pieces:
        total += count * seconds
    return total
