"""An RL run end to end: steps back to back (the offload budget adapting between them), then outputs."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from rollflow.policy.offload import OffloadBalancer, StepReport
from rollflow.policy.oversample import Oversampler
from rollflow.policy.resources import DynamicScheduler, ResourceScheduler, StaticScheduler
from rollflow.sim.build import build_groups
from rollflow.sim.rl.accounting import summarize_run
from rollflow.sim.rl.config import RLSimConfig, SchedulingConfig
from rollflow.sim.rl.costs import StepCosts
from rollflow.sim.rl.manager import ManagerCapacity
from rollflow.sim.rl.partial import CarriedSample, trained_group_lengths
from rollflow.sim.rl.spot import SpotMarket
from rollflow.sim.rl.step import StepSimulator
from rollflow.sim.rl.trace import StepResult


def make_resource_scheduler(scheduling: SchedulingConfig) -> ResourceScheduler:
    if scheduling.kind == "static":
        return StaticScheduler()
    return DynamicScheduler(
        pre_process=scheduling.pre_process,
        pre_process_threshold=scheduling.pre_process_threshold,
        wait_before_last_iter=scheduling.wait_before_last_iter,
    )


def rollout_start(steps: list[StepResult], off_policy: int) -> float:
    """When the next step's rollout may start: after the previous rollout (its instances are busy
    until then) and once weights at most `off_policy` versions behind the next step are out, i.e.
    after step `len(steps) - 1 - off_policy` has synced (off_policy=0: after the previous step)."""
    if not steps:
        return 0.0
    needed = len(steps) - 1 - off_policy
    synced = steps[needed].end if needed >= 0 else 0.0
    return max(steps[-1].rollout_end, synced)


def lanes_busy_until(step: StepResult, num_gpus: int) -> list[float]:
    """Per reserved GPU, when the step's inference, training and reshards last use it (a dynamic
    actor grows onto rollout GPUs). The sync is left out: rollout keeps generating through it, as
    off-policy rollout on a static placement does."""
    busy = [0.0] * num_gpus
    for span in step.spans:
        if span.component in ("inference", "training", "reshard"):
            for gpu in range(span.gpu_start, min(span.gpu_start + span.num_gpus, num_gpus)):
                busy[gpu] = max(busy[gpu], span.end)
    return busy


def simulate_steps(
    config: RLSimConfig, on_step: Callable[[StepResult], None] | None = None
) -> list[StepResult]:
    costs = StepCosts.from_config(config)
    manager = ManagerCapacity.from_config(config.manager)
    scheduler = make_resource_scheduler(config.scheduling)
    balancer = market = None
    if config.spot.instances:
        balancer = OffloadBalancer(config.spot.offload.settings())
        market = SpotMarket(config.spot, config.seed)
    groups = build_groups(config.rollout_sim_config())  # operator grids, once per run
    steps: list[StepResult] = []
    carried: list[CarriedSample] = []
    oversampler = Oversampler(config.partial_rollout, config.workload.num_prompts)
    unseen: list[list[int]] = []  # trained groups' lengths the next choice does not see yet
    for index in range(config.steps):
        start = rollout_start(steps, config.off_policy)
        lanes_free_at = steps[-1].end if steps else start
        sync_ends = [s.end for s in steps]
        gpus_free_at = lanes_busy_until(steps[-1], config.num_gpus) if steps else []
        extra = oversampler.plan().num_extra
        step_config = config.model_copy(update={"partial_rollout": extra})  # this step's N, chosen
        simulator = StepSimulator(
            step_config,
            index,
            start,
            costs,
            scheduler,
            balancer,
            market,
            groups,
            lanes_free_at,
            sync_ends,
            carried,
            gpus_free_at,
            manager,
        )
        step = simulator.run()
        carried = simulator.carried_out
        # as live: off-policy, the next rollout is submitted before this step's groups are trained
        progress = simulator.progress
        unseen.append(trained_group_lengths(progress.requests, progress.trained_groups, progress.group_size))
        while len(unseen) > min(config.off_policy, 1):
            oversampler.observe(unseen.pop(0))
        if balancer is not None:
            balancer.update(StepReport(step.interval_s, step.bubble_s))  # the time it added
        steps.append(step)
        if on_step is not None:
            on_step(step)
    return steps


def run_rl(config: RLSimConfig, console: Console | None = None, print_tables: bool = True) -> dict:
    """Simulate `config`, write its output folder, print its summary; return the summary."""
    started = time.perf_counter()
    console = console or Console(stderr=True)
    if config.output.progress and sys.stderr.isatty():
        from rich.progress import Progress

        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("simulating steps", total=config.steps)
            steps = simulate_steps(config, on_step=lambda _: progress.advance(task))
    else:
        steps = simulate_steps(config)
    summary = summarize_run(config, steps, time.perf_counter() - started)
    from rollflow.sim.rl.report import print_run, write_run

    written = write_run(Path(config.output.dir), config, steps, summary)
    if print_tables:
        print_run(summary, Console())
    console.print(f"wrote {', '.join(str(p) for p in written)}")
    return summary
