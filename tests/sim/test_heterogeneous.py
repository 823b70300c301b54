"""Heterogeneous clusters: replica groups of different GPU types or tensor-parallel sizes."""

import pytest

from rollflow.config import ConfigError
from tests.factories import make_config, simulate, synthetic_workload

WORKLOAD = synthetic_workload(60, 4.0, kind="fixed", prefill_tokens=512, decode_tokens=128)


def _per_replica_e2e(result):
    e2e = {}
    for r in result.requests:
        e2e.setdefault(r.replica_id, []).append(r.completed_at - r.arrived_at)
    return {k: sum(v) / len(v) for k, v in sorted(e2e.items())}


def test_one_group_simulates_exactly_like_the_homogeneous_fields():
    homogeneous = simulate(
        make_config(cluster={"replicas": 3, "device": "h100", "router": "least_tokens"}, workload=WORKLOAD)
    )
    grouped = simulate(
        make_config(
            cluster={"groups": [{"replicas": 3, "device": "h100"}], "router": "least_tokens"},
            workload=WORKLOAD,
        )
    )
    assert [(r.replica_id, r.completed_at) for r in homogeneous.requests] == [
        (r.replica_id, r.completed_at) for r in grouped.requests
    ]


def test_groups_number_replicas_in_order_and_keep_their_own_speed():
    config = make_config(
        cluster={
            "groups": [
                {"replicas": 1, "device": "h100"},
                {"replicas": 2, "device": "a40"},
                {"replicas": 1, "device": "a100", "tensor_parallel": 2},
            ],
            "router": "round_robin",
        },
        workload=WORKLOAD,
    )
    assert config.cluster.num_replicas == 4
    result = simulate(config)
    e2e = _per_replica_e2e(result)
    assert len(result.replicas) == 4 and all(r.completed_at for r in result.requests)
    assert e2e[0] < e2e[1] and e2e[1] == pytest.approx(e2e[2], rel=0.3)  # h100 beats a40; the a40s agree
    assert e2e[3] < e2e[1]  # a100 with TP 2 beats a single a40
    assert result.peak_flops_by_replica[0] > result.peak_flops_by_replica[1]


def test_replicas_beside_groups_must_agree():
    with pytest.raises(ConfigError, match="disagrees with the groups"):
        make_config(cluster={"replicas": 3, "groups": [{"replicas": 2}]})
    make_config(cluster={"replicas": 2, "groups": [{"replicas": 2}]})


def test_sim_reports_measured_throughput_in_its_views():
    result = simulate(
        make_config(
            cluster={"groups": [{"replicas": 1, "device": "h100"}, {"replicas": 1, "device": "a40"}]},
            workload=WORKLOAD,
        )
    )
    fast, slow = (replica.view(result.simulated_time_s).tokens_per_s for replica in result.replicas)
    assert fast > slow > 0
