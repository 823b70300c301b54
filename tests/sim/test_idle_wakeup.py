"""`execution.idle_wakeup_ms`: the first iteration after a replica idled waits for it to wake."""

from __future__ import annotations

import pytest

from rollflow.sim.request import SimRequest
from tests.factories import simulate_arrivals

WAKEUP_MS, RAMP_MS = 3.0, 50.0


def _run(arrivals: list[float], wakeup_ms: float) -> list[SimRequest]:
    """One replica, requests of 64 prompt and 4 output tokens at `arrivals` (seconds)."""
    return simulate_arrivals(
        arrivals, 64, 4, f"execution.idle_wakeup_ms={wakeup_ms}", f"execution.idle_wakeup_ramp_ms={RAMP_MS}"
    )


def test_a_request_to_an_idle_replica_waits_for_the_wake_up_and_its_decodes_do_not():
    # the second arrives long after the first finished, the third while the second decodes
    arrivals = [0.0, 10.0, 10.001]
    base, woken = _run(arrivals, 0.0), _run(arrivals, WAKEUP_MS)
    never_ran, long_idle, busy = (
        r.prefill_completed_at - b.prefill_completed_at for r, b in zip(woken, base, strict=True)
    )
    assert never_ran == pytest.approx(WAKEUP_MS * 1e-3, abs=1e-12)  # a replica that has run nothing is asleep
    assert long_idle == pytest.approx(WAKEUP_MS * 1e-3, abs=1e-12)
    # the third joins the second's running batch: it waits no wake-up of its own (its later
    # start is only the second's shifted iterations)
    assert busy == pytest.approx(long_idle, abs=1e-12)
    for r, b in zip(woken, base, strict=True):  # decode iterations keep their times
        assert r.completed_at - r.prefill_completed_at == pytest.approx(
            b.completed_at - b.prefill_completed_at, abs=1e-12
        )


def test_a_short_idle_costs_its_fraction_of_the_ramp():
    base = _run([0.0, 1.0], 0.0)
    first_end = base[0].completed_at
    idle_s = 0.01  # a fifth of the ramp
    base, woken = _run([0.0, first_end + idle_s], 0.0), _run([0.0, first_end + idle_s], WAKEUP_MS)
    # the first request's own wake-up moved its end; the second arrives `idle_s` after that end
    shift = woken[0].completed_at - base[0].completed_at
    assert shift == pytest.approx(WAKEUP_MS * 1e-3, abs=1e-12)
    idle_in_woken = (first_end + idle_s) - woken[0].completed_at
    expected = WAKEUP_MS * 1e-3 * idle_in_woken / (RAMP_MS * 1e-3)
    assert woken[1].prefill_completed_at - base[1].prefill_completed_at == pytest.approx(expected, abs=1e-9)
