"""Cache-affine routers over hand-built views: affinity, the balance thresholds, stickiness, the ring."""

from rollflow.policy.routing import make_router
from rollflow.policy.view import ClusterView, InstanceView, RouteRequest

THRESHOLDS = {"balance_abs_threshold": 4, "balance_rel_threshold": 1.5, "cache_threshold": 0.3}


def _view(*instances):
    """(outstanding, cached tokens) per instance."""
    return ClusterView(
        0.0,
        tuple(
            InstanceView(i, running, 0, 0, running * 100, 0.0, cached_tokens=cached)
            for i, (running, cached) in enumerate(instances)
        ),
    )


def _request(key=0, prompt=1000, request_id=0):
    return RouteRequest(request_id, prompt, 100, prefix_key=key)


def test_prefix_affinity_follows_the_cache_unless_that_instance_is_overloaded():
    router = make_router("prefix_affinity", thresholds=THRESHOLDS)
    assert router.pick(_request(), _view((2, 0), (3, 800), (1, 100))) == 1  # most cached, not overloaded
    assert (
        router.pick(_request(), _view((2, 0), (9, 800), (1, 100))) == 2
    )  # 9 - 1 > 4 and 9 > 1.5: overloaded
    assert (
        router.pick(_request(), _view((2, 0), (3, 200), (1, 100))) == 2
    )  # 20% < cache_threshold: least loaded


def test_prefix_affinity_keeps_a_group_together_before_its_prefix_is_cached():
    router = make_router("prefix_affinity", thresholds=THRESHOLDS)
    cold = _view((1, 0), (0, 0), (2, 0))
    first = router.pick(_request(key=7), cold)
    assert first == 1
    busier = _view((1, 0), (3, 0), (2, 0))  # the group's first sample went there, still queued
    assert all(router.pick(_request(key=7, request_id=i), busier) == 1 for i in range(3))
    assert router.pick(_request(key=8), busier) == 0  # another group: least loaded


def test_equal_matches_go_to_the_least_loaded():
    router = make_router("prefix_affinity", thresholds=THRESHOLDS)
    shared_system_prompt = _view((3, 500), (1, 500), (2, 500))
    assert router.pick(_request(), shared_system_prompt) == 1


def test_session_sticks_until_its_instance_is_overloaded():
    router = make_router("session", thresholds=THRESHOLDS)
    assert router.pick(_request(key=3), _view((1, 0), (0, 0))) == 1
    assert router.pick(_request(key=3), _view((0, 0), (4, 0))) == 1  # 4 - 0 is not more than 4
    assert router.pick(_request(key=3), _view((0, 0), (5, 0))) == 0  # overloaded: moves, and stays
    assert router.pick(_request(key=3), _view((3, 0), (0, 0))) == 0


def test_an_ended_session_goes_to_the_least_loaded_again():
    router = make_router("session", thresholds=THRESHOLDS)
    assert router.pick(_request(key=3), _view((1, 0), (0, 0))) == 1
    assert router.pick(_request(key=3), _view((0, 0), (2, 0))) == 1  # sticky
    router.end(3)
    assert router.pick(_request(key=3), _view((0, 0), (2, 0))) == 0  # forgotten: least loaded


def test_consistent_hash_ignores_load_and_remaps_only_a_removed_instances_keys():
    router = make_router("consistent_hash")
    four = _view((0, 0), (0, 0), (0, 0), (0, 0))
    placed = {key: router.pick(_request(key=key), four) for key in range(1, 200)}
    assert len(set(placed.values())) == 4
    loaded = _view((50, 0), (0, 0), (0, 0), (0, 0))
    assert all(router.pick(_request(key=k), loaded) == i for k, i in placed.items())  # load ignored
    three = ClusterView(0.0, four.instances[:3])
    for key, instance in placed.items():
        moved = router.pick(_request(key=key), three)
        assert moved == instance or instance == 3
