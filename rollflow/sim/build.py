"""Builders of a serving simulation: the model, the operator-time grids, replica schedulers.

`build_groups` does the expensive part (the operator grids and the predictor of each replica
group) once; a simulator, or every step of an RL run, then makes cheap replicas from the plans.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from rollflow.config import ConfigError
from rollflow.perf.grid_cache import cached_operator_times
from rollflow.perf.memory import default_num_blocks, max_resident_requests
from rollflow.perf.optimes import OperatorTimes
from rollflow.perf.predictor import ExecutionTimePredictor
from rollflow.perf.roofline import RooflineEfficiency, roofline_operator_times
from rollflow.perf.specs import MODELS, ModelSpec, ParallelLayout, validate_layout
from rollflow.perf.tables import CommOverheads, TablePaths, load_operator_times
from rollflow.sim.batching import OrcaScheduler, ReplicaScheduler, SarathiScheduler, VllmScheduler
from rollflow.sim.config import ReplicaGroup, SimConfig
from rollflow.sim.request import SimRequest


@dataclass(frozen=True)
class GroupPlan:
    """One replica group, built: what every replica of the group shares."""

    config: SimConfig  # the run's config with this group's cluster fields
    model: ModelSpec
    layout: ParallelLayout
    predictor: ExecutionTimePredictor
    operator_source: str
    peak_flops: float  # per GPU
    num_replicas: int

    def new_scheduler(self) -> ReplicaScheduler:
        return build_scheduler(self.config, self.model, self.layout)


def build_groups(config: SimConfig) -> list[GroupPlan]:
    """Each replica group's operator grids and predictor, built once."""
    model = resolve_model(config)
    return [_build_group(config, model, group) for group in config.cluster.replica_groups()]


def _build_group(config: SimConfig, model: ModelSpec, group: ReplicaGroup) -> GroupPlan:
    update = group.model_dump(exclude={"replicas"})
    group_config = config.model_copy(update={"cluster": config.cluster.model_copy(update=update)})
    layout = ParallelLayout(group.tensor_parallel, group.pipeline_stages)
    try:
        validate_layout(model, layout)
        build_scheduler(group_config, model, layout)  # its errors are config errors, raised here
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
    peak = config.cluster.gpu_spec(group.device).fp16_tflops * 1e12
    return GroupPlan(group_config, model, layout, predictor, times.source, peak, group.replicas)


def resolve_model(config: SimConfig) -> ModelSpec:
    cluster = config.cluster
    if cluster.model_shape is not None:
        return ModelSpec(name=cluster.model, **cluster.model_shape.model_dump())
    return MODELS[cluster.model]


def build_operator_times(config: SimConfig, model: ModelSpec, layout: ParallelLayout) -> OperatorTimes:
    """Operator times from the profile tables (`execution.kind: tables`) or the roofline model.

    A user's device (`cluster.devices`) with no compute table of its own takes the roofline, and
    the times' source says so: its peak numbers are all rollflow knows of it.
    """
    cluster, execution = config.cluster, config.execution
    gpu = cluster.gpu_spec(cluster.device)
    node = cluster.node_spec(cluster.network_device)
    max_tokens = max(config.max_tokens, config.scheduler.max_tokens_in_batch, config.scheduler.chunk_size)
    efficiency = RooflineEfficiency(compute=execution.compute_efficiency, memory=execution.memory_efficiency)
    note = ""
    if execution.kind == "tables":
        paths = TablePaths(
            execution.compute_table,
            execution.attention_table,
            execution.all_reduce_table,
            execution.send_recv_table,
        ).resolve(model.name, cluster.device, cluster.network_device)
        if cluster.device not in cluster.devices or Path(paths.compute).is_file():
            arguments = dict(
                paths=paths,
                model=model,
                layout=layout,
                node=node,
                block_size=config.scheduler.block_size,
                max_tokens=max_tokens,
                max_batch_size=execution.max_batch_size,
                kv_granularity=execution.kv_cache_granularity,
                overheads=CommOverheads(
                    execution.nccl_cpu_launch_overhead_ms, execution.nccl_cpu_skew_overhead_per_device_ms
                ),
                gpu=gpu,
                efficiency=efficiency,
            )
            files = (paths.compute, paths.attention, paths.all_reduce, paths.send_recv)
            return cached_operator_times(files, arguments, lambda: load_operator_times(**arguments))
        note = f" (user device {cluster.device} has no profile table {paths.compute})"
    times = roofline_operator_times(
        model,
        gpu,
        layout,
        node,
        max_tokens=max_tokens,
        max_batch_size=max(execution.max_batch_size, config.scheduler.batch_size_cap),
        kv_granularity=execution.kv_cache_granularity,
        efficiency=efficiency,
    )
    return replace(times, source=times.source + note) if note else times


def build_scheduler(config: SimConfig, model: ModelSpec, layout: ParallelLayout) -> ReplicaScheduler:
    """The replica's batch scheduler; decode runs also aggregate decoding requests (same results)."""
    sched, cluster = config.scheduler, config.cluster
    gpu = cluster.gpu_spec(cluster.device)
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
        prefix_caching=sched.prefix_caching,
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
