"""When `ServingSimulator.run` hands its loop to C (`rollflow.sim._loop`), and the hand-over.

The compiled loop covers what most runs are: every replica one pipeline stage with the vllm or
sarathi scheduler and its decode cohort, no prefix cache, requests routed on arrival or by late
binding, no hook on completions, a simulator not yet advanced. It takes the same decisions as
the Python loop (the reference) and gives bit-identical per-request times and replica totals;
tests compare the two. Anything else, or `ROLLFLOW_PURE_PYTHON=1`, or an install without a C compiler, runs
the Python loop.

The router stays Python: the loop calls its `pick` once per routed request with the same frozen
snapshot the Python loop would build.

A simulator that composes a serving cluster and acts between its events (the RL step's rollout)
runs the same C code through `rollflow.sim.compiled_cluster` instead, one call per event it hears of.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import TYPE_CHECKING

from rollflow.native import extension
from rollflow.policy.view import ClusterView, InstanceView, RouteRequest
from rollflow.sim.batching import SarathiScheduler, VllmScheduler
from rollflow.sim.replica import THROUGHPUT_SMOOTHING, Replica

if TYPE_CHECKING:
    from rollflow.sim.simulator import ServingSimulator

SCHEDULERS = {SarathiScheduler: 0, VllmScheduler: 1}  # the policy codes of _loop.c


def covers(sim: ServingSimulator) -> bool:
    """Whether the compiled loop simulates `sim` exactly (and is built)."""
    if sim.on_complete is not None or sim.num_events or sim.cluster_queue:
        return False
    if len(sim.events.heap) != (1 if sim.requests else 0):  # only the first arrival is queued
        return False
    return (
        all(_covers_replica(replica) for replica in sim.replicas)
        and extension("rollflow.sim._loop") is not None
    )


def _covers_replica(replica: Replica) -> bool:
    scheduler = replica.scheduler
    return (
        replica.num_stages == 1
        and type(scheduler) in SCHEDULERS
        and scheduler.cohort is not None
        and scheduler.prefix_cache is None
        and replica.predictor.compiled
        and replica.accepting
        and replica.retired_at is None
        and replica.num_running_batches == 0
        and not scheduler.waiting
        and not scheduler.running
        and not len(scheduler.cohort)
        and scheduler.num_allocated_blocks == 0
    )


def run(sim: ServingSimulator, until: float, on_progress: Callable[[int], None] | None) -> None:
    """Simulate `sim` (which `covers`) up to `until` in C, then write the results back onto its
    requests and replicas as the Python loop leaves them."""
    loop = extension("rollflow.sim._loop")
    assert loop is not None
    requests = sim.requests
    now, num_events, totals, queued = loop.run(
        requests=requests,
        replicas=[replica_spec(replica) for replica in sim.replicas],
        pick=sim.router.pick,
        reads_load=sim._reads_load,
        id_views=sim._id_views(),
        types=(RouteRequest, InstanceView, ClusterView),
        overhead_s=sim._overhead_s,
        start=sim.now,
        until=until,
        on_progress=on_progress,
        progress_every=max(1, len(requests) // 200),
        late_binding=sim.late_binding,
        capacity=sim.capacity,
    )
    sim.now = now
    sim.num_events = num_events
    sim.events.heap.clear()  # the loop's own queue is gone: run() is a simulator's last call
    sim.cluster_queue.extend(queued)  # late binding: arrived by the time limit, never dispatched
    for replica, total in zip(sim.replicas, totals, strict=True):
        write_back(replica, total)
    if on_progress is not None:
        on_progress(sum(1 for r in requests if r.completed_at is not None))


def replica_spec(replica: Replica) -> SimpleNamespace:
    """What _loop.c reads of a replica, by attribute name."""
    scheduler = replica.scheduler
    predictor = replica.predictor
    return SimpleNamespace(
        timer=predictor.stage_seconds.__self__,  # the compiled StageTimer the predictor bound
        policy=SCHEDULERS[type(scheduler)],
        fast_forward=replica.fast_forward,
        num_blocks=scheduler.num_blocks,
        block_size=scheduler.block_size,
        batch_size_cap=scheduler.batch_size_cap,
        max_micro_batch_size=scheduler.max_micro_batch_size,
        watermark_blocks=scheduler.watermark_blocks,
        chunk_size=getattr(scheduler, "chunk_size", 0),
        max_tokens_in_batch=getattr(scheduler, "max_tokens_in_batch", 0),
        idle_wakeup_s=replica.idle_wakeup_s,
        idle_wakeup_ramp_s=replica.idle_wakeup_ramp_s,
        admission_s=replica.admission_s,
        smoothing=THROUGHPUT_SMOOTHING,
        flops_per_token=predictor.flops_per_token,
        attention_flops_per_pair=predictor.attention_flops_per_pair,
        kind=replica.kind,
    )


# What write_back copies from a replica's totals, by the name both sides use: onto its ReplicaStats,
# the replica itself and its scheduler.
_STATS_TOTALS = ("busy_s", "flops", "num_iterations", "decode_tokens", "batches", "kv_samples")
_REPLICA_TOTALS = ("tokens_per_s", "idle_since")
_SCHEDULER_TOTALS = (
    "num_preemptions",
    "num_allocated_blocks",
    "num_resident",
    "waiting_tokens",
    "resident_remaining_tokens",
)


def write_back(replica: Replica, total: dict) -> None:
    """Leave `replica` as the Python loop would have: `total` (a replica's totals from _loop.c) names
    each field as ReplicaStats, Replica and the scheduler do."""
    for target, names in (
        (replica.stats, _STATS_TOTALS),
        (replica, _REPLICA_TOTALS),
        (replica.scheduler, _SCHEDULER_TOTALS),
    ):
        for name in names:
            setattr(target, name, total[name])
