"""The routers' view live: what the engines hold, as the simulator's replicas report it."""

from __future__ import annotations

import asyncio

from rollflow.policy.learned import ObservationSpec, encode_features
from rollflow.policy.routing import LeastOutstandingRouter, LeastTokensRouter, RoundRobinRouter
from rollflow.policy.view import ClusterView, RouteRequest
from rollflow.runtime.engines.load import EngineLoad
from rollflow.runtime.manager.config import EngineEntry, ManagerConfig
from rollflow.runtime.manager.core.registry import EngineRecord, Registry
from rollflow.runtime.manager.core.samples import Sample
from rollflow.runtime.manager.core.view import instance_view, route_inputs
from rollflow.runtime.wire.base import SamplingParams
from rollflow.sim.request import SimRequest
from rollflow.sim.simulator import ServingSimulator
from rollflow.sim.workload import build_requests
from tests.factories import make_config
from tests.runtime.manager.helpers import finished, run_manager
from tests.runtime.processes import start_engine


def test_lor_spreads_a_burst_over_three_engines_before_any_load_report(processes):
    engines = [processes.engine() for _ in range(3)]
    config = ManagerConfig(
        router="lor",
        load_poll_interval_s=60,  # no report arrives during the burst: the manager's own counts spread it
        engines=[EngineEntry(url=e.url, engine_type="builtin", capacity=4) for e in engines],
    )

    async def burst(manager):
        batch = manager.submit_batch([[1, 2, 3]] * 9, 1, SamplingParams(max_new_tokens=4, temperature=0))
        await finished(batch)
        return [sample.spans[0].engine_id for sample in batch.samples]

    picks = run_manager(burst, config)
    simulated = make_config(
        "cluster.replicas=3",
        "cluster.router=lor",
        "cluster.dispatch=late_binding",
        "cluster.capacity=4",
        "workload.kind=synthetic",
        "workload.num_requests=9",
        "workload.intervals.kind=static",
    )
    requests = build_requests(simulated.workload, simulated.seed)
    ServingSimulator(simulated, requests).run()
    assert picks == [request.replica_id for request in sorted(requests, key=lambda r: r.id)]
    # Each routed sample waits (queued) on its engine until its first token, so `lor` takes the
    # engine with the fewest waiting, as in the simulator; it was 0,0,0,0,1,1,1,1,2 when every
    # engine reported nothing queued.
    assert picks == [0, 1, 2, 0, 1, 2, 0, 1, 2]


def test_the_view_counts_what_the_engine_queues_itself(tmp_path, tiny_model):
    """An engine that admits one request at a time: the manager lets it queue the other two, and
    its load report shows them waiting there, with its KV in use."""
    engine = start_engine(tiny_model, tmp_path, extra_args=("--max-running-requests", "1"))
    try:
        config = ManagerConfig(
            load_poll_interval_s=0.05,
            engines=[EngineEntry(url=engine.url, engine_type="builtin", capacity=8)],
        )

        async def three_long_samples(manager):
            params = SamplingParams(max_new_tokens=400, temperature=0, ignore_eos=True)
            batch = manager.submit_batch([[5, 6, 7, 8]] * 3, 1, params)
            record = manager.registry.live()[0]
            for _ in range(400):  # until a report taken after all three were sent
                await asyncio.sleep(0.05)
                if record.reported is not None and record.own_at_report == (1, 2):
                    break
            seen = (record.reported, instance_view(record))
            manager.forget_batch(batch.batch_id, deleted="test over")
            return seen

        report, view = run_manager(three_long_samples, config)
    finally:
        engine.stop()
    assert (report.num_running, report.num_queued) == (1, 2)
    assert 0 < report.kv_usage < 1
    assert (view.num_running, view.num_queued) == (1, 2)
    assert view.queued_tokens == 2 * (4 + 400)  # prompt + expected output of each waiting sample
    assert 0 < view.running_tokens < 400  # the running one has generated some of its 400
    assert view.kv_usage == report.kv_usage


def _record(engine_id: int = 0, registry: Registry | None = None) -> EngineRecord:
    return (registry or Registry()).add(
        url=f"http://127.0.0.1:{engine_id + 1}",
        kind="local",
        engine_type="builtin",
        capacity=8,
        client=None,
        weight_version=0,
    )


def test_requests_of_other_clients_and_the_managers_own_since_the_report_both_count():
    record = _record()
    record.reported, record.own_at_report = EngineLoad(num_running=3, num_queued=5, kv_usage=0.5), (0, 0)
    views = {"before": instance_view(record)}
    record.dispatched("s1", 10, 20)  # the manager sends one more: 10 input tokens, 20 to generate
    views["dispatched"] = instance_view(record)
    record.progressed("s1", 19)
    views["first token"] = instance_view(record)
    record.ended("s1")
    views["ended"] = instance_view(record)
    counts = {k: (v.num_running, v.num_queued, v.queued_tokens, v.running_tokens) for k, v in views.items()}
    assert counts == {
        "before": (3, 5, 0, 0),
        "dispatched": (3, 6, 30, 0),
        "first token": (4, 5, 0, 19),
        "ended": (3, 5, 0, 0),
    }
    assert {v.kv_usage for v in views.values()} == {0.5}


def test_an_engine_without_a_load_report_is_seen_through_the_managers_own_samples():
    record = _record()
    record.dispatched("a", 4, 100)
    record.dispatched("b", 4, 100)
    record.progressed("a", 90)
    view = instance_view(record)
    assert (view.num_running, view.num_queued, view.queued_tokens, view.running_tokens) == (1, 1, 104, 90)
    assert view.kv_usage == 2 / 8  # the manager's samples over the engine's capacity


def test_live_and_simulated_views_of_one_state_give_the_learned_router_the_same_features():
    """Two replicas in the simulator, some requests decoding and some waiting; the same requests as
    the manager would have sent them, and the engines' load reports of that moment: the learned
    router's eight load features are equal, instance by instance."""
    config = make_config(
        "cluster.replicas=2",
        "workload.kind=synthetic",
        "workload.num_requests=1",
        "simulator.fast_forward=false",
    )
    simulator = ServingSimulator(config, [])
    requests: dict[int, list[SimRequest]] = {}
    for replica, (decoding, waiting) in zip(
        simulator.replicas, [((100, 50), (30, 40)), ((70, 20), (500, 300))], strict=True
    ):
        scheduler = replica.scheduler
        running = [SimRequest(10 * replica.id + i, 0.0, decoding[0] + i, decoding[1] + i) for i in range(3)]
        for request in running:
            scheduler.add_request(request)
        for step in range(2 + 2 * replica.id):  # prefill, then decode steps
            scheduler.finish(scheduler.next_batch(), float(step))
        queued = [
            SimRequest(10 * replica.id + 5 + i, 9.0, waiting[0], waiting[1] + i)
            for i in range(1 + replica.id)
        ]
        for request in queued:
            scheduler.add_request(request)
        replica.tokens_per_s = 800.0 * (replica.id + 1)
        requests[replica.id] = running + queued
    now = 9.0
    simulated = ClusterView(now, [replica.view(now) for replica in simulator.replicas])

    live_records = []
    for replica in simulator.replicas:
        record = _record(replica.id)
        for request in requests[replica.id]:
            # what the manager passes: input tokens and max_new_tokens at dispatch; at each chunk,
            # the tokens left once the generated ones arrived
            record.dispatched(str(request.id), request.prompt_tokens, request.output_tokens)
            if request.blocks:
                generated = request.processed - request.prompt_tokens
                record.progressed(str(request.id), request.output_tokens - generated)
        scheduler = replica.scheduler
        record.reported = EngineLoad(
            num_running=scheduler.num_resident,
            num_queued=len(scheduler.waiting),
            kv_usage=scheduler.num_allocated_blocks / scheduler.num_blocks,
        )
        record.own_at_report = record.own_counts()
        record.tokens_per_s = replica.tokens_per_s
        live_records.append(record)
    live = ClusterView(now, [instance_view(record) for record in live_records])

    assert all(view.num_queued and view.num_running for view in simulated.instances)
    route = RouteRequest(99, 120, 60)
    spec = ObservationSpec(num_instances=2)
    assert encode_features(route, live, spec) == encode_features(route, simulated, spec)
    fields = ("num_running", "num_queued", "queued_tokens", "running_tokens", "kv_usage", "tokens_per_s")
    assert [[getattr(v, f) for f in fields] for v in live.instances] == [
        [getattr(v, f) for f in fields] for v in simulated.instances
    ]


def test_the_view_is_frozen_and_routers_that_read_only_ids_get_ids_only():
    registry = Registry()
    records = [_record(i, registry) for i in range(3)]
    for i, record in enumerate(records):
        for j in range(i):
            record.dispatched(f"{i}-{j}", 4, 100)
    records[2].progressed("2-0", 90)
    sample = Sample(seq=7, sample_id="s", prompt_ids=[1, 2, 3], sampling=SamplingParams(max_new_tokens=16))
    eager = [instance_view(r) for r in records]

    request, view = route_inputs(sample, records, now=5.0, reads_cache=False)
    assert (request.request_id, request.prompt_tokens, request.expected_output_tokens) == (7, 3, 16)
    assert list(view.instances) == eager
    records[0].dispatched("later", 4, 100)
    assert view.instances[0] == eager[0] != instance_view(records[0])  # frozen: later changes unseen

    # round robin reads ids and order only: it gets the engines' ids and kinds, loads at zero, and
    # picks what it picks on the whole views
    _, ids_only = route_inputs(sample, records, 5.0, reads_cache=False, reads_load=False)
    assert [(v.instance_id, v.kind, v.num_outstanding) for v in ids_only.instances] == [
        (0, "local", 0),
        (1, "local", 0),
        (2, "local", 0),
    ]
    assert RoundRobinRouter().pick(request, ids_only) == RoundRobinRouter().pick(request, view)
    for router in (LeastOutstandingRouter, LeastTokensRouter):
        assert getattr(router(), "reads_load", True)  # routers that read loads get the whole view
