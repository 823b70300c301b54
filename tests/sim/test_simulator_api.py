"""ServingSimulator's public API, as other simulators compose it: submit, advance, add/retire, snapshot."""

from rollflow.policy.routing import RoundRobinRouter
from rollflow.sim.rl.rollout import resume
from rollflow.sim.simulator import ServingSimulator
from rollflow.sim.workload import build_requests
from tests.factories import make_config

SYNTHETIC = {"kind": "synthetic", "num_requests": 120, "intervals": {"kind": "poisson", "qps": 40}}


def _config(**cluster):
    return make_config(workload=SYNTHETIC, cluster={"replicas": 2, "router": "least_tokens", **cluster})


def test_submitting_each_arrival_by_hand_reproduces_run():
    config = _config()
    reference = ServingSimulator(config, build_requests(config.workload, config.seed)).run()
    requests = build_requests(config.workload, config.seed)
    sim = ServingSimulator(config)
    for request in sorted(requests, key=lambda r: r.arrived_at):
        sim.advance(until=request.arrived_at)
        assert sim.now == request.arrived_at
        sim.submit(request)
    sim.advance()
    assert [(r.replica_id, r.completed_at) for r in requests] == [
        (r.replica_id, r.completed_at) for r in reference.requests
    ]


def test_advance_stops_when_the_condition_holds():
    config = _config()
    sim = ServingSimulator(config, build_requests(config.workload, config.seed))
    sim.advance(stop=lambda: sum(r.completed_at is not None for r in sim.requests) >= 10)
    assert sum(r.completed_at is not None for r in sim.requests) == 10
    sim.advance()
    assert all(r.completed_at is not None for r in sim.requests)


def test_a_snapshot_is_frozen():
    config = _config()
    sim = ServingSimulator(config, build_requests(config.workload, config.seed))
    sim.advance(until=0.5)
    before = sim.snapshot()
    kept = tuple(before.instances)
    sim.advance(until=1.5)
    after = sim.snapshot()
    assert tuple(before.instances) == kept and before.now == 0.5
    assert after.now == 1.5 and after.instances != before.instances


def test_an_added_instance_takes_work_and_a_retired_one_hands_back_its_requests_with_their_blocks():
    config = _config(replicas=1, router="round_robin")
    requests = build_requests(config.workload, config.seed)
    sim = ServingSimulator(config, requests)
    sim.advance(until=1.0)
    added = sim.add_instance()
    assert added == 1 and [v.instance_id for v in sim.snapshot().instances] == [0, 1]
    sim.advance(until=2.0)
    assert any(r.replica_id == added for r in requests)
    handed_back = []

    def on_stopped(unfinished):
        handed_back.extend(unfinished)
        return ()

    sim.retire_instance(0, on_stopped)
    assert [v.instance_id for v in sim.snapshot().instances] == [1]  # no new work for it
    sim.advance(stop=lambda: sim.replicas[0].retired_at is not None)
    scheduler = sim.replicas[0].scheduler
    assert handed_back and all(r.completed_at is None for r in handed_back)
    assert scheduler.num_allocated_blocks == scheduler.num_resident == scheduler.waiting_tokens == 0
    assert scheduler.resident_remaining_tokens == 0 and not scheduler.waiting and not scheduler.running
    for request in handed_back:  # resumed elsewhere, from prompt + generated tokens
        resume(request, "migrate")
        sim.submit(request)
    sim.advance()
    assert all(r.completed_at is not None for r in requests)
    assert all(r.replica_id == 1 for r in handed_back)


class _FullViewRoundRobin(RoundRobinRouter):
    """Round robin without `reads_load = False`: the simulator hands it full snapshots."""

    reads_load = True

    def __init__(self) -> None:
        super().__init__()
        self.views = []

    def pick(self, request, view):
        self.views.append(view)
        return super().pick(request, view)


def test_a_router_that_reads_only_ids_routes_as_with_full_views_as_instances_come_and_go():
    config = _config(replicas=3, router="round_robin")
    runs = []
    for router in (RoundRobinRouter(), _FullViewRoundRobin()):
        requests = build_requests(config.workload, config.seed)
        sim = ServingSimulator(config, requests, router=router)
        sim.advance(until=0.8)
        sim.stop_accepting(1)  # the id-only views must drop it, as the snapshot does
        sim.advance(until=1.6)
        sim.add_instance()  # and take the new one
        sim.advance()
        runs.append(
            [(r.replica_id, r.scheduled_at, r.prefill_completed_at, r.completed_at) for r in requests]
        )
    assert runs[0] == runs[1]
    routed_after_stop = [r for r in requests if r.arrived_at + 1e-9 > 0.8 and r.arrived_at < 1.6]
    assert routed_after_stop and all(r.replica_id != 1 for r in routed_after_stop)
    assert any(r.replica_id == 3 for r in requests)
    assert any(i.num_running for v in router.views for i in v.instances)  # the reference got real loads
