"""`execution.request_overhead_ms`: a request reaches its replica that long after it arrives."""

from __future__ import annotations

import pytest

from rollflow.sim.metrics import request_table
from tests.factories import make_config, simulate, synthetic_workload


def latencies(overhead_ms: float, qps: float) -> dict:
    config = make_config(
        f"execution.request_overhead_ms={overhead_ms}",
        workload=synthetic_workload(
            6, qps, max_tokens=None, kind="fixed", prefill_tokens=512, decode_tokens=32
        ),
    )
    return request_table(simulate(config)).columns


@pytest.mark.parametrize("qps", [0.01, 1000.0])  # requests alone, and all queued at once
def test_ttft_and_e2e_grow_by_the_overhead_and_tpot_does_not(qps):
    base, late = latencies(0.0, qps), latencies(25.0, qps)
    assert list(late["arrived_at"]) == list(base["arrived_at"])  # latencies count from the arrival
    assert late["ttft"] == pytest.approx(base["ttft"] + 0.025, abs=1e-9)
    assert late["e2e"] == pytest.approx(base["e2e"] + 0.025, abs=1e-9)
    assert late["tpot"] == pytest.approx(base["tpot"], abs=1e-12)
