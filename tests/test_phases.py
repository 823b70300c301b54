"""PhaseTimer: one recorder of named phases, on a simulated clock or a live one."""

import pytest

from rollflow.phases import PhaseTimer


def test_phases_are_spans_on_the_timers_clock_and_total_per_name():
    clock = iter([10.0, 12.5, 13.0])
    timer = PhaseTimer(clock=lambda: next(clock))
    with timer.phase("training", gpu_start=0, num_gpus=4, label="mini-batch 0"):
        pass
    timer.start("sync", 0.5, num_gpus=8)
    timer.record("training", 20.0, 21.0)
    assert [(s.component, s.start, s.end, s.num_gpus) for s in timer.spans] == [
        ("training", 10.0, 12.5, 4),
        ("sync", 13.0, 13.5, 8),
        ("training", 20.0, 21.0, 0),
    ]
    assert timer.totals() == {"training": 3.5, "sync": 0.5}


def test_a_phase_that_raises_is_still_recorded_and_unknown_names_are_refused():
    clock = iter([1.0, 2.0])
    timer = PhaseTimer(clock=lambda: next(clock))
    with pytest.raises(RuntimeError), timer.phase("inference"):
        raise RuntimeError("boom")
    assert timer.totals() == {"inference": 1.0}
    with pytest.raises(ValueError, match="unknown phase 'trainig'"):
        timer.record("trainig", 0.0, 1.0)
