import pytest

from rollflow.policy.routing import ROUTERS, make_router, register_router
from rollflow.policy.view import ClusterView, InstanceView, RouteRequest

REQUEST = RouteRequest(0, prompt_tokens=100, expected_output_tokens=50)


def _view(*loads):
    return ClusterView(
        now=0.0,
        instances=tuple(
            InstanceView(i, num_running=r, num_queued=q, queued_tokens=qt, running_tokens=rt, kv_usage=0.0)
            for i, (r, q, qt, rt) in enumerate(loads)
        ),
    )


def test_each_load_router_minimises_its_own_load():
    view = _view((10, 0, 0, 9000), (1, 2, 300, 100), (3, 1, 5000, 100))
    assert make_router("lor").pick(REQUEST, view) == 0  # fewest waiting
    assert make_router("least_outstanding").pick(REQUEST, view) == 1  # fewest waiting + running
    assert make_router("least_tokens").pick(REQUEST, view) == 1  # least token work


def test_round_robin_cycles_and_ties_go_to_the_lowest_id():
    view = _view((0, 0, 0, 0), (0, 0, 0, 0), (0, 0, 0, 0))
    router = make_router("round_robin")
    assert [router.pick(REQUEST, view) for _ in range(5)] == [0, 1, 2, 0, 1]
    assert make_router("least_tokens").pick(REQUEST, view) == 0


def test_random_is_seeded_and_policies_do_not_touch_the_view():
    view = _view((0, 0, 0, 0), (1, 1, 1, 1))
    picks = [make_router("random", seed=5).pick(REQUEST, view) for _ in range(3)]
    assert len(set(picks)) == 1
    with pytest.raises(AttributeError):
        view.instances[0].num_queued = 3


def test_registry_refuses_duplicates_and_unknown_names():
    with pytest.raises(ValueError, match="already registered"):
        register_router("lor", lambda seed: None)
    with pytest.raises(ValueError, match="choose one of: " + ", ".join(ROUTERS)):
        make_router("nope")
