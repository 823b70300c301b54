"""The live executor follows a real step on a real manager and engines: the policy's plans are applied
(an engine borrowed from the actor handed back under pre_process, engines released when rollout is
done, the last mini-batch held), every sample finishes with nothing regenerated, the simulator's
policy object returns the same plan for each live snapshot, and a move that fails is logged while
the step goes on."""

from __future__ import annotations

from rollflow.policy.resources import DynamicScheduler
from rollflow.runtime.dynamic.executor import DynamicExecutor, FixedActor, StepInputs
from rollflow.runtime.dynamic.snapshot import EngineSlot, LiveLayout
from rollflow.runtime.manager.client import ManagerClient
from rollflow.sim.rl.config import SchedulingConfig
from rollflow.sim.rl.runner import make_resource_scheduler
from tests.runtime.manager.helpers import metric, prompts, workers
from tests.runtime.processes import http

NUM_MINIBATCHES = 4
MINIBATCH = 4
PROMPTS = prompts(NUM_MINIBATCHES * MINIBATCH)


def test_executor_applies_the_policy_live_and_the_simulator_policy_agrees(processes):
    engines = [processes.engine() for _ in range(3)]  # device 0 (borrowed from the actor), 1, 2
    manager = processes.manager(engines=[{"url": e.url, "capacity": 4} for e in engines])
    client = ManagerClient(manager.url)
    ids = [workers(manager)[e.url]["id"] for e in engines]
    layout = LiveLayout(
        num_devices=3,
        actor_devices=1,
        actor_model_parallel=1,
        engines=(
            EngineSlot(ids[0], 0, 1, True),
            EngineSlot(ids[1], 1, 1, False),
            EngineSlot(ids[2], 2, 1, False),
        ),
        inference_range=None,
    )
    policy = DynamicScheduler(pre_process=True, wait_before_last_iter=True)
    executor = DynamicExecutor(policy, client, layout, FixedActor(1))

    batch = client.submit(PROMPTS, n=1, max_new_tokens=48, temperature=0, ignore_eos=True)
    executor.begin_step(StepInputs(1, batch.batch_id, len(PROMPTS), MINIBATCH, NUM_MINIBATCHES))
    samples = []
    arriving = batch.micro_batches(min_groups=MINIBATCH, max_groups=MINIBATCH, timeout_s=240)
    for index in range(NUM_MINIBATCHES):
        executor.before_minibatch(index)
        samples += [s for group in next(arriving) for s in group]
        executor.minibatch_end()
    record = executor.end_step()

    assert len(samples) == len(PROMPTS)
    assert all(s["state"] == "finished" and s["regenerated_tokens"] == 0 for s in samples)
    assert metric(manager, "rollflow_regenerated_tokens_total") == 0
    kinds = [m.kind for m in record.moves]
    assert "pre_process" in kinds, record.moves
    assert "wait_before_last_iter" in kinds, record.moves
    assert set(record.engines_released) == set(ids)  # the borrowed one, then the rest once rollout was done
    assert all(m.ok for m in record.moves if m.kind in ("pre_process", "release_engine", "resume_engine"))
    # an actor of one process cannot grow: the move is logged as failed and the step went on
    grows = [m for m in record.moves if m.kind in ("grow_actor", "wait_before_last_iter")]
    assert grows and not any(m.ok for m in grows)
    assert all("the step goes on with what it had" in m.detail for m in grows)
    assert record.actor_sizes == [1] * NUM_MINIBATCHES
    # step end: every engine woke and serves again
    assert {w["state"] for w in workers(manager).values()} == {"healthy"}
    assert not any(http("GET", e.url + "/is_sleeping")[1]["is_sleeping"] for e in engines)

    # rl-sim's own policy object for the same scheduling decides every live snapshot the same way
    simulated = make_resource_scheduler(
        SchedulingConfig(kind="dynamic", pre_process=True, wait_before_last_iter=True)
    )
    assert simulated == policy
    triggers = {snapshot.trigger for snapshot, _ in executor.decisions}
    assert {"step_start", "group_done", "rollout_done", "minibatch_end"} <= triggers
    for snapshot, plan in executor.decisions:
        assert simulated.decide(snapshot) == plan
