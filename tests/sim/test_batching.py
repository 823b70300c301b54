import pytest

from rollflow.sim.batching import OrcaScheduler, SarathiScheduler, VllmScheduler
from rollflow.sim.request import SimRequest
from tests.factories import make_config, simulate, small_scheduler, synthetic_workload


def _finish(scheduler, batch, now=1.0):
    return scheduler.finish(batch, now)


def test_vllm_prefills_new_requests_whole_and_alone_then_decodes_together():
    scheduler = small_scheduler(VllmScheduler, max_tokens_in_batch=1000)
    a, b = SimRequest(0, 0.0, 300, 4), SimRequest(1, 0.0, 600, 4)
    scheduler.add_request(a)
    scheduler.add_request(b)
    first = scheduler.next_batch()
    assert [r.id for r in first.requests] == [0]  # 2 x 600 > max_tokens_in_batch
    assert first.num_tokens == [300]
    _finish(scheduler, first)
    second = scheduler.next_batch()
    assert second.num_tokens == [600]  # a waiting prefill goes before running decodes
    _finish(scheduler, second)
    third = scheduler.next_batch()
    assert [r.id for r in third.requests] == [0, 1] and third.num_tokens == [1, 1]


def test_sarathi_splits_a_long_prompt_into_chunks_beside_decodes():
    scheduler = small_scheduler(SarathiScheduler, chunk_size=256)
    decoding = SimRequest(0, 0.0, 100, 50)
    scheduler.add_request(decoding)
    _finish(scheduler, scheduler.next_batch())
    long_prompt = SimRequest(1, 0.1, 600, 5)
    scheduler.add_request(long_prompt)
    chunks = []
    while not long_prompt.prefill_done:
        batch = scheduler.next_batch()
        assert sum(batch.num_tokens) <= 256
        chunks.append(dict(zip((r.id for r in batch.requests), batch.num_tokens, strict=True))[1])
        _finish(scheduler, batch)
    assert chunks == [255, 255, 90]


def test_preemption_restarts_the_latest_arrival_by_recompute():
    # 3 requests of 31-token prompts fill 6 of 7 blocks; decoding needs more, so the latest restarts.
    scheduler = small_scheduler(VllmScheduler, num_blocks=7, max_tokens_in_batch=4096)
    requests = [SimRequest(i, float(i), 31, 40) for i in range(3)]
    for request in requests:
        scheduler.add_request(request)
    _finish(scheduler, scheduler.next_batch())
    for _ in range(3):
        batch = scheduler.next_batch()
        _finish(scheduler, batch)
    assert requests[2].num_restarts >= 1
    assert requests[2].num_prefill > 31  # what it had generated is re-prefilled
    assert requests[2].num_prefill + requests[2].num_decode == 71
    assert scheduler.num_allocated_blocks <= 7


def test_orca_reserves_full_length_blocks_and_never_preempts():
    scheduler = small_scheduler(OrcaScheduler, num_blocks=2 * 256, max_batch_size=8, max_tokens=4096)
    for i in range(3):
        scheduler.add_request(SimRequest(i, 0.0, 100, 10))
    batch = scheduler.next_batch()
    assert len(batch.requests) == 2  # the third does not fit a full 4096-token reservation
    assert scheduler.num_allocated_blocks == 2 * 256


@pytest.mark.parametrize("kind", ["vllm", "sarathi", "orca"])
def test_every_request_completes_with_all_its_tokens(kind):
    config = make_config(
        scheduler={"kind": kind, "num_blocks": 400},
        cluster={"replicas": 2},
        workload=synthetic_workload(120, 50, kind="uniform", min_tokens=300, prefill_to_decode_ratio=2.0),
    )
    result = simulate(config)
    for request in result.requests:
        assert request.completed_at is not None
        assert request.processed == request.prompt_tokens + request.output_tokens
        assert (
            request.arrived_at <= request.scheduled_at <= request.prefill_completed_at <= request.completed_at
        )
    for replica in result.replicas:
        assert replica.scheduler.num_allocated_blocks == 0 and replica.scheduler.num_resident == 0


def test_a_request_that_can_never_fit_is_refused_up_front():
    from rollflow.config import ConfigError

    config = make_config(
        scheduler={"kind": "sarathi", "num_blocks": 10},
        workload={
            "kind": "synthetic",
            "num_requests": 3,
            "lengths": {"kind": "fixed", "prefill_tokens": 150, "decode_tokens": 50},
        },
    )
    with pytest.raises(ConfigError, match=r"needs 200 tokens of KV cache but a replica holds 160"):
        simulate(config)
    vllm = make_config(
        scheduler={"kind": "vllm", "max_tokens_in_batch": 100},
        workload={
            "kind": "synthetic",
            "num_requests": 3,
            "lengths": {"kind": "fixed", "prefill_tokens": 150},
        },
    )
    with pytest.raises(ConfigError, match=r"150-token prompt, more than scheduler.max_tokens_in_batch=100"):
        simulate(vllm)
