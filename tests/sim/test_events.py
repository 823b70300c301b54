import pytest

from rollflow.sim.events import EventQueue, Phase
from rollflow.sim.simulator import ServingSimulator
from rollflow.sim.workload import build_requests
from tests.factories import make_config, simulate


def _no_op(event):
    return ()


def test_same_time_events_pop_by_phase_then_push_order():
    queue = EventQueue()
    queue.push(queue.event(1.0, Phase.SCHEDULE, _no_op, 0))
    queue.push(queue.event(1.0, Phase.STAGE_END, _no_op, 1))
    queue.push(queue.event(1.0, Phase.STAGE_END, _no_op, 2))
    queue.push(queue.event(0.5, Phase.SCHEDULE, _no_op, 3))
    popped = [queue.pop() for _ in range(len(queue))]
    assert [(e.time, e.phase, e.target) for e in popped] == [
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


def test_every_phase_has_its_place_at_equal_times_and_seq_is_creation_order():
    queue = EventQueue()
    made = [queue.event(2.0, phase, _no_op) for phase in reversed(Phase)]
    later_same_phase = queue.event(2.0, Phase.MOVE, _no_op, target=1)
    for event in [later_same_phase, *made]:
        queue.push(event)
    popped = [queue.pop() for _ in range(len(queue))]
    assert [e.phase for e in popped] == [*Phase, Phase.MOVE]
    assert popped[-1] is later_same_phase  # same time and phase: the earlier-made event first
    serving = {Phase.ARRIVAL, Phase.STAGE_END, Phase.SCHEDULE}
    assert all(phase < step_phase for phase in serving for step_phase in set(Phase) - serving)


def test_events_are_frozen():
    event = EventQueue().event(1.0, Phase.SCHEDULE, _no_op)
    with pytest.raises(AttributeError):
        event.time = 2.0  # type: ignore[misc]


def test_a_step_event_at_a_batch_end_sees_the_batch_applied():
    """RL-step phases sort after the serving ones: a step acting at t sees every batch that ended at t."""
    config = make_config(workload={"kind": "synthetic", "num_requests": 1}, scheduler={"kind": "vllm"})
    requests = build_requests(config.workload, config.seed)
    done_at = simulate(config).requests[0].completed_at
    sim = ServingSimulator(config, requests)
    seen = []

    def on_step_event(event):
        seen.append((event.time, requests[0].completed_at))
        return (sim.events.event(event.time, Phase.REWARD, on_reward),)  # returned events are pushed

    def on_reward(event):
        seen.append(("reward", event.time))
        return ()

    sim.events.push(sim.events.event(done_at, Phase.ROLLOUT, on_step_event))
    sim.run()
    assert seen == [(done_at, done_at), ("reward", done_at)]
