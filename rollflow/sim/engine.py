"""The serving-cluster simulator: arrivals are routed by a policy, replicas batch and run them.

while events remain:
    arrival     -> snapshot the cluster, router picks a replica, enqueue (cut a decode run)
    stage end   -> pass the batch to the next stage, or apply it and free finished requests
    schedule    -> the replica forms its next batches and starts them
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from rollflow.config import ConfigError
from rollflow.perf.memory import default_num_blocks, max_resident_requests
from rollflow.perf.optimes import OperatorTimes
from rollflow.perf.predictor import ExecutionTimePredictor
from rollflow.perf.roofline import RooflineEfficiency, roofline_operator_times
from rollflow.perf.specs import GPUS, MODELS, NODES, ModelSpec, ParallelLayout, validate_layout
from rollflow.perf.tables import CommOverheads, TablePaths, load_operator_times
from rollflow.policy.routing import Router, make_router
from rollflow.policy.view import ClusterView, RouteRequest, SnapshotInstances
from rollflow.sim.batching import OrcaScheduler, ReplicaScheduler, SarathiScheduler, VllmScheduler
from rollflow.sim.config import ReplicaGroup, SimConfig
from rollflow.sim.events import EventQueue, Phase
from rollflow.sim.replica import Replica
from rollflow.sim.request import Batch, SimRequest


@dataclass
class SimResult:
    requests: list[SimRequest]
    replicas: list[Replica]
    simulated_time_s: float
    num_events: int
    operator_source: str
    peak_flops_per_gpu: float  # of the first replica's GPU
    peak_flops_by_replica: list[float]


def resolve_model(config: SimConfig) -> ModelSpec:
    cluster = config.cluster
    if cluster.model_shape is not None:
        return ModelSpec(name=cluster.model, **cluster.model_shape.model_dump())
    return MODELS[cluster.model]


def build_operator_times(config: SimConfig, model: ModelSpec, layout: ParallelLayout) -> OperatorTimes:
    cluster, execution = config.cluster, config.execution
    node = NODES[cluster.network_device]
    max_tokens = max(config.max_tokens, config.scheduler.max_tokens_in_batch, config.scheduler.chunk_size)
    if execution.kind == "tables":
        paths = TablePaths(
            execution.compute_table,
            execution.attention_table,
            execution.all_reduce_table,
            execution.send_recv_table,
        ).resolve(model.name, cluster.device, cluster.network_device)
        return load_operator_times(
            paths,
            model,
            layout,
            node,
            block_size=config.scheduler.block_size,
            max_tokens=max_tokens,
            max_batch_size=execution.max_batch_size,
            kv_granularity=execution.kv_cache_granularity,
            overheads=CommOverheads(
                execution.nccl_cpu_launch_overhead_ms, execution.nccl_cpu_skew_overhead_per_device_ms
            ),
            gpu=GPUS[cluster.device],
            efficiency=RooflineEfficiency(
                compute=execution.compute_efficiency, memory=execution.memory_efficiency
            ),
        )
    return roofline_operator_times(
        model,
        GPUS[cluster.device],
        layout,
        node,
        max_tokens=max_tokens,
        max_batch_size=max(execution.max_batch_size, config.scheduler.batch_size_cap),
        kv_granularity=execution.kv_cache_granularity,
        efficiency=RooflineEfficiency(
            compute=execution.compute_efficiency, memory=execution.memory_efficiency
        ),
    )


def build_scheduler(config: SimConfig, model: ModelSpec, layout: ParallelLayout) -> ReplicaScheduler:
    """The replica's batch scheduler; decode runs also aggregate decoding requests (same results)."""
    sched, cluster = config.scheduler, config.cluster
    gpu = GPUS[cluster.device]
    num_blocks = sched.num_blocks or default_num_blocks(
        model, layout, gpu, cluster.memory_margin_fraction, config.max_tokens, sched.block_size
    )
    common = dict(
        num_blocks=num_blocks,
        block_size=sched.block_size,
        batch_size_cap=sched.batch_size_cap,
        num_stages=layout.pipeline_stages,
        watermark_blocks_fraction=sched.watermark_blocks_fraction,
        aggregate_decodes=config.simulator.fast_forward,
    )
    if sched.kind == "vllm":
        return VllmScheduler(**common, max_tokens_in_batch=sched.max_tokens_in_batch)
    if sched.kind == "sarathi":
        return SarathiScheduler(**common, chunk_size=sched.chunk_size)
    max_batch = min(
        max_resident_requests(model, layout, gpu, cluster.memory_margin_fraction, config.max_tokens),
        sched.batch_size_cap,
    )
    return OrcaScheduler(**common, max_batch_size=max_batch, max_tokens=config.max_tokens)


def check_servable(requests: list[SimRequest], scheduler: ReplicaScheduler, config: SimConfig) -> None:
    """Refuse a workload with a request no replica could ever finish (it would wait or thrash forever)."""
    if not requests:
        return
    longest = max(requests, key=lambda r: r.prompt_tokens + r.output_tokens)
    capacity = (scheduler.num_blocks - scheduler.watermark_blocks) * scheduler.block_size
    total = longest.prompt_tokens + longest.output_tokens
    if total > capacity:
        raise ConfigError(
            f"config error: request {longest.id} needs {total} tokens of KV cache but a replica holds "
            f"{capacity} (scheduler.num_blocks={scheduler.num_blocks} x block_size={scheduler.block_size}, "
            f"less the watermark); raise scheduler.num_blocks or lower workload.max_tokens"
        )
    if config.scheduler.kind == "vllm":
        widest = max(requests, key=lambda r: r.prompt_tokens)
        if widest.prompt_tokens > config.scheduler.max_tokens_in_batch:
            raise ConfigError(
                f"config error: request {widest.id} has a {widest.prompt_tokens}-token prompt, more than "
                f"scheduler.max_tokens_in_batch={config.scheduler.max_tokens_in_batch}: vllm could never prefill it"
            )
    if config.scheduler.kind == "orca" and total > config.max_tokens:
        raise ConfigError(
            f"config error: request {longest.id} has {total} tokens, more than the {config.max_tokens} "
            "that orca reserves per request (workload.max_tokens)"
        )


class ServingSimulator:
    """Deterministic for a given config and request list."""

    def __init__(self, config: SimConfig, requests: list[SimRequest], router: Router | None = None) -> None:
        self.config = config
        model = resolve_model(config)
        self.replicas: list[Replica] = []
        self.peak_flops_by_replica: list[float] = []
        for group in config.cluster.replica_groups():
            self._add_group(config, model, group)
        self.operator_source = self._operator_source
        cluster = config.cluster
        self.router = router or make_router(cluster.router, seed=config.seed, path=cluster.router_path)
        self.requests = sorted(requests, key=lambda r: r.arrived_at)
        for replica in {r.predictor: r for r in self.replicas}.values():
            check_servable(self.requests, replica.scheduler, config)
        self.events = EventQueue()
        self.now = 0.0
        self.num_events = 0

    def run(self, on_progress: Callable[[int], None] | None = None) -> SimResult:
        events, requests = self.events, self.requests
        time_limit = self.config.simulator.time_limit_s or math.inf
        num_requests = len(requests)
        next_index = 0
        completed = 0
        report_every = max(1, num_requests // 200)
        while True:
            next_arrival = requests[next_index].arrived_at if next_index < num_requests else math.inf
            if events.next_time() < next_arrival:
                event = events.pop()
                if event.time > time_limit:
                    break
                self.now = event.time
                if event.phase is Phase.STAGE_END:
                    finished = self._on_stage_end(event.replica_id, event.stage, event.batch, event.version)
                    if finished and on_progress is not None:
                        completed += finished
                        if completed % report_every < finished:
                            on_progress(completed)
                else:
                    self._on_schedule(event.replica_id)
            elif next_index < num_requests:
                if next_arrival > time_limit:
                    break
                self.now = next_arrival
                self._on_arrival(requests[next_index])
                next_index += 1
            else:
                break
            self.num_events += 1
        if on_progress is not None:
            on_progress(sum(1 for r in requests if r.completed_at is not None))
        peaks = self.peak_flops_by_replica
        return SimResult(
            requests, self.replicas, self.now, self.num_events, self.operator_source, peaks[0], peaks
        )

    def _add_group(self, config: SimConfig, model: ModelSpec, group: ReplicaGroup) -> None:
        """Build one group's replicas; each group has its own layout, timings and KV capacity."""
        update = group.model_dump(exclude={"replicas"})
        group_config = config.model_copy(update={"cluster": config.cluster.model_copy(update=update)})
        layout = ParallelLayout(group.tensor_parallel, group.pipeline_stages)
        try:
            validate_layout(model, layout)
            schedulers = [build_scheduler(group_config, model, layout) for _ in range(group.replicas)]
        except ValueError as exc:
            raise ConfigError(f"config error: cluster: {exc}") from None
        times = build_operator_times(group_config, model, layout)
        execution = config.execution
        predictor = ExecutionTimePredictor(
            times,
            model,
            layout,
            execution.attention_decode_overhead_fraction,
            execution.attention_prefill_overhead_fraction,
            max_batch_size=config.scheduler.batch_size_cap,
        )
        self._operator_source = times.source
        for scheduler in schedulers:
            self.replicas.append(
                Replica(len(self.replicas), scheduler, predictor, config.simulator.fast_forward)
            )
            self.peak_flops_by_replica.append(GPUS[group.device].fp16_tflops * 1e12)

    # -- handlers ---------------------------------------------------------------------------
    def _on_arrival(self, request: SimRequest) -> None:
        now = self.now
        replicas = self.replicas
        view = ClusterView(now, SnapshotInstances(len(replicas), lambda i: replicas[i].view(now)))
        target = self.router.pick(
            RouteRequest(request.id, request.prompt_tokens, request.output_tokens), view
        )
        replica = self.replicas[target]
        request.replica_id = target
        replica.scheduler.add_request(request)
        run = replica.run_in_flight
        if run is not None and replica.cut_run(run, now):
            self.events.push(run.end_time, Phase.STAGE_END, target, 0, run, run.version)
        self._request_schedule(replica)

    def _on_stage_end(self, replica_id: int, stage: int, batch: Batch, version: int) -> int:
        if version != batch.version:
            return 0  # superseded: the run was cut and has a newer end event
        replica = self.replicas[replica_id]
        replica.stage_busy[stage] = False
        finished = 0
        if stage + 1 < replica.num_stages:
            replica.stage_queues[stage + 1].append(batch)
            self._start_stage(replica, stage + 1)
        else:
            finished = len(replica.finish_batch(batch, self.now))
            if replica.num_stages == 1:
                # Every arrival and stage end at this time is already in (they sort earlier), and a
                # one-stage replica has no other batch in flight: schedule now, without an event.
                self._on_schedule(replica_id)
            else:
                self._request_schedule(replica)
        self._start_stage(replica, stage)
        return finished

    def _on_schedule(self, replica_id: int) -> None:
        replica = self.replicas[replica_id]
        replica.schedule_pending = False
        for batch in replica.form_batches(self.now):
            replica.stage_queues[0].append(batch)
        self._start_stage(replica, 0)

    # -- helpers ----------------------------------------------------------------------------
    def _request_schedule(self, replica: Replica) -> None:
        if not replica.schedule_pending and replica.num_running_batches < replica.num_stages:
            replica.schedule_pending = True
            self.events.push(self.now, Phase.SCHEDULE, replica.id)

    def _start_stage(self, replica: Replica, stage: int) -> None:
        queue = replica.stage_queues[stage]
        if replica.stage_busy[stage] or not queue:
            return
        batch = queue.popleft()
        replica.stage_busy[stage] = True
        end = self.now + replica.stage_time(batch, stage)
        if stage == replica.num_stages - 1:
            batch.end_time = end
            if batch.num_iterations > 1:
                replica.run_in_flight = batch
        self.events.push(end, Phase.STAGE_END, replica.id, stage, batch, batch.version)
