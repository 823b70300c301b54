"""Decode runs (many iterations per event) must give exactly what one event per iteration gives."""

import pytest

from tests.factories import CONV_TRACE, make_config, simulate, synthetic_workload


def _times(result):
    return [(r.scheduled_at, r.prefill_completed_at, r.completed_at, r.num_restarts) for r in result.requests]


@pytest.mark.parametrize("kind", ["vllm", "sarathi", "orca"])
@pytest.mark.parametrize("router", ["round_robin", "least_tokens"])
def test_fast_forward_matches_per_iteration_simulation(kind, router):
    if not CONV_TRACE.is_file():
        pytest.skip("needs ../shared/data/vidur")
    sections = dict(
        cluster={"replicas": 3, "router": router},
        scheduler={"kind": kind},
        workload={"kind": "trace", "file": str(CONV_TRACE), "num_requests": 600, "time_scale": 0.1},
    )
    fast = simulate(make_config("simulator.fast_forward=true", **sections))
    slow = simulate(make_config("simulator.fast_forward=false", **sections))
    assert sum(r.stats.num_iterations for r in fast.replicas) == sum(
        r.stats.num_iterations for r in slow.replicas
    )
    assert sum(len(r.stats.batches) for r in fast.replicas) < sum(len(r.stats.batches) for r in slow.replicas)
    for got, want in zip(_times(fast), _times(slow), strict=True):
        assert got[3] == want[3]
        assert got[:3] == pytest.approx(want[:3], abs=1e-9)


@pytest.mark.parametrize("kind", ["vllm", "sarathi"])
def test_fast_forward_is_exact_under_memory_pressure(kind):
    sections = dict(
        scheduler={"kind": kind, "num_blocks": 300},
        workload=synthetic_workload(150, 40, kind="uniform", min_tokens=400, prefill_to_decode_ratio=1.0),
    )
    fast = simulate(make_config("simulator.fast_forward=true", **sections))
    slow = simulate(make_config("simulator.fast_forward=false", **sections))
    assert sum(r.num_restarts for r in slow.requests) > 0, "the workload must force preemptions"
    for got, want in zip(_times(fast), _times(slow), strict=True):
        assert got[3] == want[3]
        assert got[:3] == pytest.approx(want[:3], abs=1e-9)
