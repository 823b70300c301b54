import itertools

import pytest

from tests.factories import make_config, simulate, synthetic_workload

WORKLOAD = synthetic_workload(
    200, 30, max_tokens=None, kind="uniform", min_tokens=256, prefill_to_decode_ratio=4.0
)


@pytest.mark.parametrize("kind", ["vllm", "sarathi", "orca"])
def test_pipeline_stages_keep_several_micro_batches_in_flight(kind):
    result = simulate(
        make_config(cluster={"pipeline_stages": 2}, scheduler={"kind": kind}, workload=WORKLOAD)
    )
    assert all(r.completed_at is not None for r in result.requests)
    batches = sorted(result.replicas[0].stats.batches)
    overlapping = sum(1 for a, b in itertools.pairwise(batches) if b[0] < a[0] + a[1])
    assert overlapping > len(batches) // 4  # the next micro-batch starts before the previous one ends


def test_tensor_parallelism_speeds_up_a_replica():
    slow = simulate(make_config(workload=WORKLOAD))
    fast = simulate(make_config(cluster={"tensor_parallel": 2}, workload=WORKLOAD))
    mean = lambda result: sum(r.completed_at - r.arrived_at for r in result.requests) / len(result.requests)  # noqa: E731
    assert mean(fast) < mean(slow)


def test_utilization_and_mfu_are_sane():
    result = simulate(make_config(workload=WORKLOAD, cluster={"replicas": 2}))
    for replica in result.replicas:
        assert 0 < replica.stats.busy_s <= result.simulated_time_s
        mfu = replica.stats.flops / (replica.stats.busy_s * result.peak_flops_per_gpu)
        assert 0.0 < mfu < 1.0
