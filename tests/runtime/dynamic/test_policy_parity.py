"""The simulator and the live executor ask one policy object, on equal snapshots, and get equal plans:
every snapshot `rollflow rl-sim` builds is rebuilt from the live state it stands for (what the
manager and the trainer report) by the executor's `build_snapshot`, field for field."""

from __future__ import annotations

from rollflow.policy.resources import ResourcePlan, ResourceSnapshot
from rollflow.runtime.dynamic.snapshot import EngineSlot, LiveLayout, LiveProgress, build_snapshot
from rollflow.sim.rl import runner
from tests.sim.rl.factories import DISAGGREGATED, rl_config


def _live_state(snapshot: ResourceSnapshot, num_samples: int) -> tuple[LiveLayout, LiveProgress]:
    """What the manager and trainer report in the state the snapshot describes."""
    instances = snapshot.rollout_instances
    layout = LiveLayout(
        num_devices=snapshot.num_gpus,
        actor_devices=snapshot.actor_gpus,
        actor_model_parallel=snapshot.actor_model_parallel,
        engines=tuple(EngineSlot(i.instance_id, i.gpu_start, i.num_gpus, i.borrowed) for i in instances),
        inference_range=snapshot.inference_range,
    )
    progress = LiveProgress(
        now=snapshot.now,
        engine_unfinished={i.instance_id: i.num_sequences for i in instances},
        num_samples=num_samples,
        num_unfinished=round(snapshot.unfinished_fraction * num_samples),
        finished_since_minibatch=round(snapshot.samples_per_instance_per_minibatch * max(1, len(instances))),
        minibatch_samples=snapshot.minibatch_samples,
        num_minibatches=snapshot.num_minibatches,
        minibatches_done=snapshot.minibatches_done,
        inference_done=snapshot.inference_done,
    )
    return layout, progress


def test_simulated_snapshots_rebuilt_from_live_state_get_equal_plans_from_one_policy(monkeypatch):
    config = rl_config(
        *DISAGGREGATED,
        "scheduling.kind=dynamic",
        "scheduling.pre_process=true",
        "scheduling.wait_before_last_iter=true",
        "placement.pipelining=true",
    )
    policy = runner.make_resource_scheduler(config.scheduling)
    decisions: list[tuple[ResourceSnapshot, ResourcePlan]] = []

    class Recording:
        name = policy.name

        def decide(self, snapshot: ResourceSnapshot) -> ResourcePlan:
            plan = policy.decide(snapshot)
            decisions.append((snapshot, plan))
            return plan

    monkeypatch.setattr(runner, "make_resource_scheduler", lambda scheduling: Recording())
    runner.simulate_steps(config)
    num_samples = config.workload.num_prompts * config.workload.samples_per_prompt

    triggers = {snapshot.trigger for snapshot, _ in decisions}
    assert triggers == {"step_start", "group_done", "rollout_done", "inference_done", "minibatch_end"}
    assert any(plan.release_instances for _, plan in decisions)
    assert any(s.trigger == "minibatch_end" and p.actor_gpus > s.actor_gpus for s, p in decisions)
    for snapshot, plan in decisions:
        layout, progress = _live_state(snapshot, num_samples)
        live = build_snapshot(snapshot.trigger, layout, progress)
        assert live == snapshot
        assert policy.decide(live) == plan
