"""The resource policies' decisions, from hand-built snapshots."""

import pytest

from rollflow.policy.resources import (
    DynamicScheduler,
    ResourceSnapshot,
    RolloutInstanceState,
    StaticScheduler,
    valid_actor_sizes,
)


def snapshot(**changes) -> ResourceSnapshot:
    fields = dict(
        now=10.0,
        trigger="minibatch_end",
        num_gpus=16,
        actor_gpus=4,
        actor_model_parallel=1,
        minibatch_samples=512,
        num_minibatches=4,
        minibatches_done=1,
        rollout_instances=tuple(RolloutInstanceState(i, 4 + i, 1, 10, False) for i in range(8)),
        unfinished_fraction=0.2,
        samples_per_instance_per_minibatch=40.0,
        inference_range=(12, 4),
        inference_done=False,
    )
    return ResourceSnapshot(**(fields | changes))


def test_valid_actor_sizes_divide_the_minibatch_over_data_parallel_ranks():
    assert valid_actor_sizes(16, 1, 512) == [1, 2, 4, 8, 16]
    assert valid_actor_sizes(12, 2, 96) == [2, 4, 6, 8, 12]
    assert valid_actor_sizes(8, 1, 6) == [1, 2, 3, 6]


def test_static_keeps_every_gpu_until_rollout_is_done():
    plan = StaticScheduler().decide(snapshot())
    assert plan.release_instances == () and plan.actor_gpus == 4
    done = StaticScheduler().decide(snapshot(unfinished_fraction=0.0, inference_done=True))
    assert done.release_instances == tuple(range(8)) and done.release_inference and done.actor_gpus == 4


def test_dynamic_releases_the_instances_nearest_the_actor_and_grows_it_to_a_valid_size():
    # 80 unfinished sequences; at 40 per instance per mini-batch with 2 mini-batches before the
    # last, one instance would do, so up to 7 may go; the actor can use 4 of them (4 -> 8 GPUs).
    plan = DynamicScheduler().decide(snapshot())
    assert plan.release_instances == (0, 1, 2, 3)
    assert plan.actor_gpus == 8


def test_dynamic_keeps_instances_that_are_still_needed():
    slow = DynamicScheduler().decide(snapshot(samples_per_instance_per_minibatch=2.0))
    assert slow.release_instances == () and slow.actor_gpus == 4


def test_dynamic_moves_gpus_only_at_minibatch_boundaries():
    plan = DynamicScheduler().decide(snapshot(trigger="group_done"))
    assert plan.release_instances == () and plan.actor_gpus == 4


def test_actor_takes_inference_gpus_only_after_inference_is_done():
    instances = ()
    busy = DynamicScheduler().decide(snapshot(rollout_instances=instances, unfinished_fraction=0.0))
    assert not busy.release_inference and busy.actor_gpus == 8  # prefix ends where inference starts
    done = DynamicScheduler().decide(
        snapshot(rollout_instances=instances, unfinished_fraction=0.0, inference_done=True)
    )
    assert done.release_inference and done.actor_gpus == 16


def test_pre_process_hands_borrowed_gpus_back_under_the_threshold():
    borrowed = tuple(RolloutInstanceState(i, i, 1, 10, True) for i in range(4))
    own = tuple(RolloutInstanceState(4 + i, 4 + i, 1, 10, False) for i in range(8))
    policy = DynamicScheduler(pre_process=True, pre_process_threshold=0.5)
    early = policy.decide(
        snapshot(trigger="group_done", rollout_instances=borrowed + own, unfinished_fraction=0.8)
    )
    assert early.release_instances == ()
    late = policy.decide(
        snapshot(trigger="group_done", rollout_instances=borrowed + own, unfinished_fraction=0.4)
    )
    assert late.release_instances == (0, 1, 2, 3)


def test_wait_before_last_iter_gives_the_last_minibatch_every_gpu_once_all_else_is_done():
    done = dict(
        trigger="inference_done",
        rollout_instances=(),
        unfinished_fraction=0.0,
        inference_done=True,
        minibatches_done=3,
    )
    assert DynamicScheduler().decide(snapshot(**done)).actor_gpus == 4  # waits for its next boundary
    assert DynamicScheduler(wait_before_last_iter=True).decide(snapshot(**done)).actor_gpus == 16


def test_wait_before_last_iter_is_part_of_the_plan_and_the_snapshot_is_untouched():
    snap = snapshot()
    plan = DynamicScheduler(wait_before_last_iter=True).decide(snap)
    assert plan.hold_last_minibatch
    assert snap == snapshot()
    with pytest.raises(AttributeError):
        snap.actor_gpus = 16  # frozen
