"""cluster.dispatch: on_arrival (Vidur's global scheduler) or late_binding (the rollout manager's)."""

import pytest

from rollflow.config import ConfigError
from rollflow.policy.routing import make_router
from rollflow.sim.simulator import ServingSimulator
from rollflow.sim.workload import build_requests
from tests.factories import make_config, simulate

BURST = {"kind": "synthetic", "num_requests": 150, "intervals": {"kind": "poisson", "qps": 200}}


def _config(*overrides):
    return make_config(*overrides, workload=BURST, cluster={"replicas": 3, "router": "least_outstanding"})


def test_late_binding_with_room_for_everything_is_on_arrival_dispatch():
    on_arrival = simulate(_config())
    late = simulate(_config("cluster.dispatch=late_binding", "cluster.capacity=1000"))
    assert [(r.replica_id, r.completed_at) for r in late.requests] == [
        (r.replica_id, r.completed_at) for r in on_arrival.requests
    ]


class _Recording:
    """The configured router, recording what it was offered."""

    def __init__(self, inner):
        self.inner, self.name, self.picks = inner, inner.name, []

    def pick(self, request, view):
        self.picks.append((request.request_id, view))
        return self.inner.pick(request, view)


def test_late_binding_routes_in_arrival_order_to_replicas_with_a_free_slot():
    config = _config("cluster.dispatch=late_binding", "cluster.capacity=4")
    requests = build_requests(config.workload, config.seed)
    router = _Recording(make_router("least_outstanding"))
    result = ServingSimulator(config, requests, router=router).run()
    assert all(r.completed_at is not None for r in result.requests)
    ids = [request_id for request_id, _ in router.picks]
    arrival_order = [r.id for r in sorted(requests, key=lambda r: (r.arrived_at, r.id))]
    assert ids == arrival_order  # one cluster queue, first come first served
    for _, view in router.picks:
        assert view.instances and all(v.num_outstanding < 4 for v in view.instances)
    for replica in result.replicas:  # never more than its capacity at any batch formation
        assert max(waiting + resident for _, _, waiting, resident in replica.stats.kv_samples) <= 4
    waited = [r for r in result.requests if r.scheduled_at - r.arrived_at > 0]
    assert waited  # the burst did queue at the cluster


def test_late_binding_queues_at_the_cluster_not_at_replicas():
    on_arrival = simulate(_config())
    late = simulate(_config("cluster.dispatch=late_binding", "cluster.capacity=4"))
    deepest = lambda result: max(w for r in result.replicas for _, _, w, _ in r.stats.kv_samples)  # noqa: E731
    assert deepest(late) < deepest(on_arrival)


def test_an_unknown_dispatch_is_a_one_line_config_error():
    with pytest.raises(
        ConfigError, match=r"cluster\.dispatch: Input should be .on_arrival. or .late_binding."
    ):
        make_config(cluster={"dispatch": "eager"})
