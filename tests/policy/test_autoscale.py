"""The autoscale decision: engines in proportion to rollout time over target, within bounds,
removing only idle engines the launcher owns, spot first."""

from __future__ import annotations

import pytest

from rollflow.policy.autoscale import AutoscaleSettings, EngineLoad, ScaleSnapshot, decide_scale


def _engines(*specs: tuple[str, int, bool]) -> tuple[EngineLoad, ...]:
    return tuple(
        EngineLoad(i, kind, running, removable) for i, (kind, running, removable) in enumerate(specs)
    )


SETTINGS = AutoscaleSettings(target_rollout_s=10.0, min_engines=1, max_engines=6)


def test_a_slow_step_adds_engines_in_proportion_up_to_the_maximum():
    two = _engines(("local", 3, False), ("spot", 2, True))
    assert decide_scale(ScaleSnapshot(15.0, two), SETTINGS).num_add == 1  # ceil(2 * 1.5) = 3
    assert decide_scale(ScaleSnapshot(100.0, two), SETTINGS).num_add == 4  # capped at 6
    plan = decide_scale(ScaleSnapshot(100.0, two), SETTINGS)
    assert plan.remove == () and "2 -> 6" in plan.reason


def test_a_step_near_the_target_changes_nothing():
    engines = _engines(("local", 0, True), ("spot", 0, True), ("spot", 0, True))
    for rollout_s in (10.0, 9.0, 5.5):  # ceil(3 * 0.55) = 2, but 0.55 > scale_down_below
        plan = decide_scale(ScaleSnapshot(rollout_s, engines), SETTINGS)
        assert (plan.num_add, plan.remove) == (0, ())


def test_a_fast_step_removes_only_idle_launcher_engines_spot_first_newest_first():
    engines = _engines(
        ("spot", 0, True),  # 0
        ("local", 0, True),  # 1
        ("spot", 4, True),  # 2 busy
        ("spot", 0, False),  # 3 not ours
        ("spot", 0, True),  # 4
        ("remote", 0, True),  # 5
    )
    plan = decide_scale(ScaleSnapshot(2.0, engines), SETTINGS)  # ceil(6 * 0.2) = 2: remove 4
    assert plan.num_add == 0
    assert plan.remove == (4, 0, 5, 1)


def test_never_below_the_minimum_and_starts_engines_up_to_it():
    settings = AutoscaleSettings(target_rollout_s=10.0, min_engines=2, max_engines=4)
    engines = _engines(("spot", 0, True), ("spot", 0, True), ("spot", 0, True))
    assert decide_scale(ScaleSnapshot(0.1, engines), settings).remove == (2,)
    assert decide_scale(ScaleSnapshot(0.1, ()), settings).num_add == 2


def test_nothing_idle_means_nothing_removed():
    engines = _engines(("spot", 1, True), ("spot", 2, True))
    plan = decide_scale(ScaleSnapshot(1.0, engines), SETTINGS)
    assert (plan.num_add, plan.remove) == (0, ())
    assert "none is idle" in plan.reason


@pytest.mark.parametrize(
    "kwargs",
    [
        {"target_rollout_s": 0.0},
        {"target_rollout_s": 1.0, "min_engines": 3, "max_engines": 2},
        {"target_rollout_s": 1.0, "scale_down_below": 0.0},
    ],
)
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        AutoscaleSettings(**kwargs)
