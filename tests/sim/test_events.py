from rollflow.sim.events import EventQueue, Phase
from tests.factories import make_config, simulate


def test_same_time_events_pop_by_phase_then_push_order():
    queue = EventQueue()
    queue.push(1.0, Phase.SCHEDULE, replica_id=0)
    queue.push(1.0, Phase.STAGE_END, replica_id=1)
    queue.push(1.0, Phase.STAGE_END, replica_id=2)
    queue.push(0.5, Phase.SCHEDULE, replica_id=3)
    popped = [queue.pop() for _ in range(len(queue))]
    assert [(e.time, e.phase, e.replica_id) for e in popped] == [
        (0.5, Phase.SCHEDULE, 3),
        (1.0, Phase.STAGE_END, 1),
        (1.0, Phase.STAGE_END, 2),
        (1.0, Phase.SCHEDULE, 0),
    ]


def test_request_arriving_exactly_at_a_batch_end_joins_the_next_batch(tmp_path):
    # Find when the first request's prefill ends, then replay with a second request arriving at that instant.
    trace = tmp_path / "trace.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,300,5\n")
    workload = {"kind": "trace", "file": str(trace)}
    first = simulate(make_config(workload=workload, scheduler={"kind": "vllm"}))
    prefill_end = first.requests[0].prefill_completed_at
    trace.write_text(f"arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,300,5\n{prefill_end!r},200,5\n")
    result = simulate(make_config(workload=workload, scheduler={"kind": "vllm"}))
    second = result.requests[1]
    assert second.arrived_at == prefill_end
    assert second.scheduled_at == prefill_end  # seen by the decision taken at that very time


def test_runs_are_deterministic_for_a_seed():
    config = make_config(
        workload={"kind": "synthetic", "num_requests": 200, "intervals": {"kind": "poisson", "qps": 30}},
        cluster={"replicas": 2, "router": "random"},
    )
    a, b = simulate(config), simulate(config)
    assert [r.completed_at for r in a.requests] == [r.completed_at for r in b.requests]
