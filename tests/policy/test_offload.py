"""The offload balancer: the budget follows the trainer's bubble, within bounds."""

import pytest

from rollflow.policy.offload import OffloadBalancer, OffloadSettings, StepReport, remote_only
from rollflow.policy.view import ClusterView, InstanceView


def _instance(instance_id, kind):
    return InstanceView(instance_id, 1, 0, 0, 10, 0.1, kind=kind)


def test_a_starved_trainer_lengthens_the_local_budget_and_a_busy_one_shortens_it():
    balancer = OffloadBalancer(OffloadSettings(initial_budget_s=10, target_bubble_fraction=0.05))
    longer = balancer.update(StepReport(step_time_s=100, bubble_s=40))
    assert longer > 10
    shorter = OffloadBalancer(OffloadSettings(initial_budget_s=10)).update(StepReport(100, 0))
    assert shorter < 10


def test_the_budget_settles_when_the_bubble_is_on_target_and_stays_in_bounds():
    settings = OffloadSettings(
        initial_budget_s=10, min_budget_s=5, max_budget_s=12, target_bubble_fraction=0.1
    )
    balancer = OffloadBalancer(settings)
    assert balancer.update(StepReport(50, 5)) == pytest.approx(10)
    for _ in range(50):
        balancer.update(StepReport(50, 50))
    assert balancer.budget_s == 12
    for _ in range(50):
        balancer.update(StepReport(50, 0))
    assert balancer.budget_s == 5


def test_a_closed_loop_converges_where_bubble_meets_its_target():
    """Toy plant: remote capacity finishes the tail in (100 - budget) / 2 s; training takes 20 s."""
    balancer = OffloadBalancer(OffloadSettings(initial_budget_s=5, target_bubble_fraction=0.02, gain=1.0))
    for _ in range(60):
        budget = balancer.budget_s
        bubble = max(0.0, (100 - budget) / 2 - 20)
        report = StepReport(budget + 20 + bubble, bubble)
        balancer.update(report)
    assert report.bubble_fraction == pytest.approx(0.02, abs=0.002)
    assert 50 < balancer.budget_s < 60


def test_expiry_reads_time_from_its_arguments_and_targets_only_remote_instances():
    balancer = OffloadBalancer(OffloadSettings(initial_budget_s=3))
    assert not balancer.expired(now=102.9, step_started_at=100)
    assert balancer.expired(now=103.0, step_started_at=100)
    view = ClusterView(0.0, [_instance(0, "local"), _instance(1, "spot"), _instance(2, "remote")])
    assert [i.instance_id for i in balancer.offload_sources(view.instances)] == [0]
    assert [i.instance_id for i in remote_only(view).instances] == [1, 2]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_budget_s": 0}, "0 < min_budget_s"),
        ({"smoothing": 0}, "smoothing"),
        ({"target_bubble_fraction": 1.0}, "target_bubble_fraction"),
    ],
)
def test_bad_settings_name_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        OffloadSettings(**kwargs)


def test_a_report_with_more_bubble_than_step_is_rejected():
    with pytest.raises(ValueError, match="bubble_s"):
        StepReport(step_time_s=10, bubble_s=11)
