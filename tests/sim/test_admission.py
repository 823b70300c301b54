"""`execution.admission_ms`: an iteration that admits new requests beside running decodes takes
that much longer per request admitted; prefill-only iterations and later iterations do not."""

from __future__ import annotations

import pytest

from rollflow.sim.request import SimRequest
from tests.factories import simulate_arrivals

ADMISSION_MS = 2.0


def _run(arrivals: list[float], admission_ms: float, fast_forward: bool = True) -> list[SimRequest]:
    """One replica, requests of 64 prompt and 40 output tokens at `arrivals` (seconds)."""
    return simulate_arrivals(
        arrivals,
        64,
        40,
        f"execution.admission_ms={admission_ms}",
        f"simulator.fast_forward={str(fast_forward).lower()}",
    )


@pytest.mark.parametrize(
    "fast_forward", [True, False]
)  # decode runs cut by the arrival, and single iterations
@pytest.mark.parametrize("newcomers", [1, 2])
def test_requests_joining_running_decodes_lengthen_that_iteration_alone(fast_forward, newcomers):
    [lone] = _run([0.0], 0.0, fast_forward)
    joins_at = lone.prefill_completed_at + 0.3 * (lone.completed_at - lone.prefill_completed_at)
    arrivals = [0.0] + [joins_at] * newcomers
    base, admitted = _run(arrivals, 0.0, fast_forward), _run(arrivals, ADMISSION_MS, fast_forward)
    extra = newcomers * ADMISSION_MS * 1e-3
    # the first request prefilled alone: nothing extra; it decodes through the admitting iteration
    assert admitted[0].prefill_completed_at == base[0].prefill_completed_at
    assert admitted[0].completed_at - base[0].completed_at == pytest.approx(extra, abs=1e-12)
    for new, old in zip(admitted[1:], base[1:], strict=True):
        assert new.prefill_completed_at - old.prefill_completed_at == pytest.approx(extra, abs=1e-12)
        # their own decode iterations after the admitting one keep their times
        assert new.completed_at - new.prefill_completed_at == pytest.approx(
            old.completed_at - old.prefill_completed_at, abs=1e-12
        )


def test_a_request_admitted_to_an_idle_replica_costs_nothing_more():
    base, admitted = _run([0.0, 30.0], 0.0), _run([0.0, 30.0], ADMISSION_MS)
    assert [r.completed_at for r in admitted] == [r.completed_at for r in base]
