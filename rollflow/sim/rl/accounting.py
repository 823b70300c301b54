"""What a finished step cost: GPU-seconds by component, utilization, money, and a run's summary."""

from __future__ import annotations

import resource

from rollflow.phases import PHASES, PhaseSpan
from rollflow.sim.rl.config import RLSimConfig
from rollflow.sim.rl.staleness import tokens_by_staleness
from rollflow.sim.rl.trace import StepResult, StepTrace

COMPONENTS = PHASES


def rollout_spans(trace: StepTrace) -> list[PhaseSpan]:
    """Each rollout instance's batches, merged into busy intervals on its GPUs."""
    spans = []
    for info in trace.instances:
        component = "rollout" if info.kind == "local" else "rollout_spot"
        current: list[float] | None = None
        for start, duration, *_ in sorted(info.batches):
            if current is not None and start <= current[1] + 1e-9:
                current[1] = max(current[1], start + duration)
                continue
            if current is not None:
                spans.append(PhaseSpan(component, info.gpu_start, info.num_gpus, current[0], current[1]))
            current = [start, start + duration]
        if current is not None:
            spans.append(PhaseSpan(component, info.gpu_start, info.num_gpus, current[0], current[1]))
    return spans


def summarize_step(trace: StepTrace) -> StepResult:
    """Costs, utilization and windows per component of one step's trace."""
    config = trace.config
    start, end = trace.start, trace.end
    spans = rollout_spans(trace) + trace.spans
    busy = dict.fromkeys(COMPONENTS, 0.0)
    windows: dict[str, tuple[float, float]] = {}
    for span in spans:
        busy[span.component] += span.num_gpus * (span.end - span.start)
        first, last = windows.get(span.component, (span.start, span.end))
        windows[span.component] = (min(first, span.start), max(last, span.end))
    actor_free = trace.actor_free_at if trace.actor_free_at is not None else start
    last_train = max((s.end for s in trace.spans if s.component == "training"), default=end)
    actor_work = sum(
        min(s.end, last_train) - max(s.start, actor_free)
        for s in trace.spans
        if s.gpu_start == 0 and s.component in ("inference", "training", "reshard") and s.end > actor_free
    )
    bubble = max(0.0, (last_train - actor_free) - actor_work)
    # Paid from the previous step's end: overlapping off-policy steps do not pay twice.
    paid_from = trace.paid_from
    reserved_gpu_s = config.num_gpus * (end - paid_from)
    spot_gpu_s = 0.0
    market = trace.spot_market
    if market is not None:
        tp = config.rollout.tensor_parallel
        spot_gpu_s = tp * sum(market.alive_seconds(s, paid_from, end) for s in range(market.num_slots))
    price = config.cost
    manager_cost = 0.0
    if trace.manager is not None:  # each relay process keeps a CPU core busy for the step
        manager_cost = trace.manager.processes * price.cpu_usd_per_core_hour * (end - paid_from) / 3600
    cost = (
        reserved_gpu_s * price.on_demand_usd_per_gpu_hour + spot_gpu_s * price.spot_usd_per_gpu_hour
    ) / 3600 + manager_cost
    requests = trace.requests
    by_staleness, stalest = tokens_by_staleness(
        requests, trace.index, trace.sync_ends, trace.earlier_versions
    )
    return StepResult(
        index=trace.index,
        start=start,
        end=end,
        paid_from=paid_from,
        rollout_end=trace.rollout_end,
        num_samples=len(requests),
        trained_tokens=sum(r.prompt_tokens + r.output_tokens for r in requests),
        generated_tokens=sum(r.output_tokens for r in requests),
        regenerated_tokens=trace.regenerated_tokens,
        reprefill_tokens=trace.reprefill_tokens,
        num_migrated=trace.num_migrated,
        num_preemptions=trace.num_preemptions,
        preempted_sequences=trace.preempted_sequences,
        bubble_s=min(bubble, end - start),
        reserved_gpu_s=reserved_gpu_s,
        spot_gpu_s=spot_gpu_s,
        busy_gpu_s=busy,
        windows=windows,
        cost_usd=cost,
        offload_budget_s=trace.offload_budget_s,
        spans=spans,
        instance_windows=[
            (info.gpu_start, info.num_gpus, info.kind, info.started_at, info.retired_at or end)
            for info in trace.instances
        ],
        minibatches=trace.minibatches,
        actor_sizes=trace.actor_sizes,
        tokens_by_staleness=by_staleness,
        max_sample_staleness=stalest,
        extra_groups=config.partial_rollout,
        carried_samples=trace.num_carried_out,
        tokens_carried=trace.num_tokens_carried_out,
        decode_tokens=sum(
            (tokens - prefill) * iterations
            for info in trace.instances
            for _, _, _, tokens, prefill, iterations in info.batches
        ),
        generated_end=trace.rollout_end - trace.manager_delay_s,
        manager=trace.manager,
        manager_delay_s=trace.manager_delay_s,
        manager_max_wait_s=trace.manager_max_wait_s,
        manager_cost_usd=manager_cost,
    )


def summarize_run(config: RLSimConfig, steps: list[StepResult], wall_s: float) -> dict:
    """summary.json: totals over the steps (ratios of sums), and each step's breakdown."""
    total_time = sum(s.interval_s for s in steps)  # the run's span: off-policy steps overlap
    tokens = sum(s.trained_tokens for s in steps)
    paid = sum(s.reserved_gpu_s + s.spot_gpu_s for s in steps)
    busy = sum(sum(s.busy_gpu_s.values()) for s in steps)
    cost = sum(s.cost_usd for s in steps)
    staleness: dict[int, int] = {}
    for step in steps:
        for key, count in step.tokens_by_staleness.items():
            staleness[key] = staleness.get(key, 0) + count
    return {
        "step_time_s": total_time / len(steps),
        "steady_state_step_time_s": _mean([s.interval_s for s in steps[1:]]),
        "throughput_tokens_per_s": tokens / total_time,
        "tokens_per_usd": _ratio(tokens, cost),
        "gpu_utilization": busy / paid,
        "spot_gpu_utilization": _ratio(
            sum(s.busy_gpu_s["rollout_spot"] for s in steps), sum(s.spot_gpu_s for s in steps)
        ),
        "idle_gpu_s_per_step": (paid - busy) / len(steps),
        "trainer_bubble_s_per_step": sum(s.bubble_s for s in steps) / len(steps),
        "cost_usd_per_step": cost / len(steps),
        "cost_usd_per_mtok": cost / tokens * 1e6,
        "regenerated_tokens": sum(s.regenerated_tokens for s in steps),
        "reprefill_tokens": sum(s.reprefill_tokens for s in steps),
        "migrated_sequences": sum(s.num_migrated for s in steps),
        "preemptions": sum(s.num_preemptions for s in steps),
        "preempted_sequences": sum(s.preempted_sequences for s in steps),
        "off_policy": config.off_policy,
        "partial_rollout": config.partial_rollout,
        "carried_samples": sum(s.carried_samples for s in steps),
        "tokens_carried": sum(s.tokens_carried for s in steps),
        "tokens_by_staleness": {str(k): v for k, v in sorted(staleness.items())},
        "max_sample_staleness": max(s.max_sample_staleness for s in steps),
        **manager_summary(config, steps),
        "num_steps": len(steps),
        "num_gpus": config.num_gpus,
        "samples_per_step": steps[0].num_samples,
        "wall_time_s": wall_s,
        "peak_memory_mib": peak_memory_mib(),
        "steps": [step_summary(s) for s in steps],
    }


def manager_summary(config: RLSimConfig, steps: list[StepResult]) -> dict:
    """The relay processes against the token rate the engines generated at: whether they held the
    rollout back (`manager_bound_s_per_step` > 0: the manager was the bottleneck), whether samples
    waited for them on the way (a wait mid-rollout delays rewards, inference and training, and the
    dynamic scheduler's moves, without delaying the rollout's end), what they cost."""
    capacity = steps[0].manager
    window = sum(s.generated_end - s.start for s in steps)
    delay = sum(s.manager_delay_s for s in steps) / len(steps)
    return {
        "manager_processes": config.manager.processes,
        "manager_cpu_us_per_token": capacity.cpu_us_per_token if capacity else None,
        "manager_cpu_us_source": capacity.source if capacity else None,
        "manager_tokens_per_s_capacity": capacity.tokens_per_s if capacity else None,
        "rollout_generated_tokens_per_s": _ratio(sum(s.decode_tokens for s in steps), window),
        "manager_bound_s_per_step": delay,
        "manager_bottleneck": delay > 0,
        "manager_max_sample_wait_s": max(s.manager_max_wait_s for s in steps),
        "manager_cost_usd_per_step": sum(s.manager_cost_usd for s in steps) / len(steps),
    }


def peak_memory_mib() -> float:
    """This process's peak resident memory so far, in MiB (what a simulation of this size needs)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def step_summary(step: StepResult) -> dict:
    return {
        "step": step.index,
        "start_s": step.start,
        "step_time_s": step.step_time_s,
        "interval_s": step.interval_s,
        "rollout_end_s": step.rollout_end - step.start,
        "components": {
            name: {
                "start_s": step.windows[name][0] - step.start,
                "end_s": step.windows[name][1] - step.start,
                "gpu_s": step.busy_gpu_s[name],
            }
            for name in COMPONENTS
            if name in step.windows
        },
        "trainer_bubble_s": step.bubble_s,
        "reserved_gpu_s": step.reserved_gpu_s,
        "spot_gpu_s": step.spot_gpu_s,
        "gpu_utilization": sum(step.busy_gpu_s.values()) / (step.reserved_gpu_s + step.spot_gpu_s),
        "spot_gpu_utilization": _ratio(step.busy_gpu_s["rollout_spot"], step.spot_gpu_s),
        "trained_tokens": step.trained_tokens,
        "generated_tokens": step.generated_tokens,
        "regenerated_tokens": step.regenerated_tokens,
        "reprefill_tokens": step.reprefill_tokens,
        "migrated_sequences": step.num_migrated,
        "preemptions": step.num_preemptions,
        "preempted_sequences": step.preempted_sequences,
        "cost_usd": step.cost_usd,
        "offload_budget_s": step.offload_budget_s,
        "actor_gpus_per_minibatch": step.actor_sizes,
        "tokens_by_staleness": {str(k): v for k, v in step.tokens_by_staleness.items()},
        "extra_groups": step.extra_groups,
        "carried_samples": step.carried_samples,
        "tokens_carried": step.tokens_carried,
        "decode_tokens": step.decode_tokens,
        "manager_bound_s": step.manager_delay_s,
        "manager_max_sample_wait_s": step.manager_max_wait_s,
    }


def _mean(values: list[float]) -> float | None:
    """The mean, or None (null in JSON) for no values, e.g. the steady state of a one-step run."""
    return sum(values) / len(values) if values else None


def _ratio(part: float, whole: float) -> float | None:
    """part / whole, or None (null in JSON) when there is no whole, e.g. no preemptible GPUs."""
    return part / whole if whole else None
