"""The simulated prefix cache: hits, shared blocks, eviction order, preemption, and off by default."""

import pytest

from rollflow.errors import UserError
from rollflow.sim.batching import SarathiScheduler, VllmScheduler
from rollflow.sim.prefix_cache import PrefixCache, block_hashes
from rollflow.sim.request import SimRequest
from tests.factories import make_config, simulate, small_scheduler

SYSTEM = (0, 64)  # a 64-token shared prefix: four 16-token blocks


def _scheduler(cls=VllmScheduler, num_blocks=1000, prefix_caching=True, **kwargs):
    if cls is VllmScheduler:
        kwargs.setdefault("max_tokens_in_batch", 4096)
    else:
        kwargs.setdefault("chunk_size", 512)
    return small_scheduler(cls, num_blocks, prefix_caching=prefix_caching, **kwargs)


def _request(request_id, own_prompt, output=4, arrived_at=0.0, own_id=None):
    """System prompt + `own_prompt` tokens of its own content + its output."""
    own = 100 + request_id if own_id is None else own_id
    segments = (SYSTEM, (own, own_prompt), (1000 + request_id, output))
    return SimRequest(request_id, arrived_at, 64 + own_prompt, output, segments)


def test_block_hashes_chain_their_prefix_and_skip_the_partial_block():
    a = block_hashes(((0, 40), (1, 10)), 50, 16)
    assert len(a) == 3  # 48 of 50 tokens make full blocks
    assert block_hashes(((0, 40), (2, 10)), 50, 16)[:2] == a[:2]  # same first 32 tokens
    assert block_hashes(((0, 40), (2, 10)), 50, 16)[2] != a[2]
    assert block_hashes(((9, 16), (0, 40)), 56, 16)[1] != a[0]  # same tokens after another prefix


def test_a_later_request_skips_its_cached_prefix():
    scheduler = _scheduler()
    first, second = _request(0, 16), _request(1, 16)
    scheduler.add_request(first)
    batch = scheduler.next_batch()
    assert batch.num_tokens == [80]
    scheduler.finish(batch, 1.0)
    scheduler.add_request(second)
    batch = scheduler.next_batch()
    assert batch.requests == [second] and batch.num_tokens == [16]  # the 64 shared tokens were cached
    assert second.cached_tokens == 64 and batch.num_prefill_tokens == 16


def test_requests_admitted_together_share_blocks_counted_once():
    scheduler = _scheduler()
    first, second = _request(0, 16), _request(1, 16)
    scheduler.add_request(first)
    scheduler.add_request(second)
    batch = scheduler.next_batch()
    assert batch.num_tokens == [80, 16]  # the second hits the blocks the first registered
    assert first.blocks == second.blocks == 5
    assert scheduler.num_allocated_blocks == 6  # 4 shared + 1 + 1, not 10


def test_a_fully_cached_prompt_computes_only_its_last_token():
    scheduler = _scheduler()
    first = _request(0, 16)
    again = _request(1, 16, own_id=100)  # the same 80-token prompt, another answer
    scheduler.add_request(first)
    scheduler.finish(scheduler.next_batch(), 1.0)
    scheduler.add_request(again)
    batch = scheduler.next_batch()
    assert batch.requests == [again] and batch.num_tokens == [1]
    assert again.cached_tokens == 79


def test_finished_requests_leave_their_blocks_cached_and_evictable_in_lru_order():
    cache = PrefixCache()
    assert cache.acquire([1, 2, 3]) == 3
    assert cache.acquire([1, 4]) == 1  # 1 is already held: only 4 is new
    assert cache.release([1, 2, 3]) == 2  # 1 is still held by the second
    assert cache.release([1, 4]) == 2
    assert list(cache.evictable) == [3, 2, 4, 1]  # released tail first, oldest release first
    cache.evict_to(2)
    assert 3 not in cache and 2 not in cache and 4 in cache and 1 in cache
    assert cache.acquire([1]) == 1 and list(cache.evictable) == [4]  # a hit takes it off the LRU


def test_memory_pressure_evicts_the_least_recently_released_blocks():
    scheduler = _scheduler(num_blocks=12)
    old, new = _request(0, 16, output=1), _request(1, 16, output=1)  # 5 blocks each
    for request in (old, new):
        scheduler.add_request(request)
        batch = scheduler.next_batch()
        scheduler.finish(batch, 1.0)
    assert request.completed and scheduler.num_allocated_blocks == 0
    cache = scheduler.prefix_cache
    assert len(cache) == 6  # the shared four once, plus one own block each
    big = SimRequest(2, 2.0, 160, 1, ((7, 160), (8, 1)))  # 10 new blocks: 6 free + 4 evicted
    scheduler.add_request(big)
    scheduler.next_batch()
    assert scheduler.num_allocated_blocks == 10 and len(cache) - 10 == 2
    # each request released its blocks tail first, the shared root last: the two blocks left
    # are the root of the shared prefix, and the own blocks went first
    assert scheduler.cached_prefix_tokens(_request(3, 16, own_id=101)) == 32
    assert scheduler.cached_prefix_tokens(_request(4, 16, own_id=100)) == 32


def test_a_preempted_request_releases_its_blocks_which_stay_cached():
    scheduler = _scheduler(num_blocks=10)
    first, second = _request(0, 16, output=40), _request(1, 16, output=40, own_id=101)
    scheduler.add_request(first)
    scheduler.add_request(second)
    scheduler.finish(scheduler.next_batch(), 1.0)  # both prefilled: 4 shared + 1 + 1 blocks
    assert scheduler.num_allocated_blocks == 6
    now = 1.0
    while not scheduler.num_preemptions:
        now += 1.0
        scheduler.finish(scheduler.next_batch(), now)
    assert second.blocks == 0 and second.num_restarts == 1 and scheduler.waiting[0] is second
    assert scheduler.num_allocated_blocks == first.blocks  # its own blocks are free ...
    hashes = block_hashes(second.segments, second.num_prefill, 16)
    cache = scheduler.prefix_cache
    assert all(h in cache for h in hashes)  # ... and still cached, unreferenced but the shared ones
    assert [cache.ref_counts[h] for h in hashes[4:]] == [0] * (len(hashes) - 4)


def test_sarathi_chunks_only_the_uncached_part():
    scheduler = _scheduler(SarathiScheduler, chunk_size=32)
    first, second = _request(0, 48), _request(1, 48)
    scheduler.add_request(first)
    for _ in range(4):  # 112 tokens in 32-token chunks
        scheduler.finish(scheduler.next_batch(), 1.0)
    assert first.prefill_done
    scheduler.add_request(second)
    batch = scheduler.next_batch()
    assert batch.num_tokens == [1, 31]  # the first decodes; the second starts after its 64 cached
    assert second.processed == 64


def test_prefix_caching_is_off_by_default_and_then_changes_nothing():
    workload = {"num_requests": 6, "system_prompt_tokens": 256, "groups": {"size": 4}}
    off = make_config(workload=workload)
    assert off.scheduler.prefix_caching is False
    result = simulate(off)
    assert all(r.cached_tokens == 0 for r in result.requests)
    on = simulate(make_config("scheduler.prefix_caching=true", workload=workload))
    computed_off = sum(b[4] * b[5] for rep in result.replicas for b in rep.stats.batches)
    computed_on = sum(b[4] * b[5] for rep in on.replicas for b in rep.stats.batches)
    assert computed_off == sum(r.prompt_tokens for r in result.requests)
    assert computed_on < computed_off


def test_bad_prefix_configs_are_one_line_errors():
    with pytest.raises(UserError, match="prefix_caching"):
        make_config("scheduler.kind=orca", "scheduler.prefix_caching=true")
    with pytest.raises(UserError, match=r"groups or workload\.sessions"):
        make_config(workload={"groups": {"size": 2}, "sessions": {"turns": 2}})


def test_a_prefill_preempted_midway_leaves_only_its_computed_blocks_cached():
    scheduler = _scheduler(SarathiScheduler, num_blocks=15, chunk_size=8)
    decoder = SimRequest(0, 0.0, 16, 200, ((50, 16), (51, 200)))
    scheduler.add_request(decoder)
    for _ in range(2):  # its prompt in two chunks; decoding from here on, growing a block every 16
        scheduler.finish(scheduler.next_batch(), 1.0)
    long = SimRequest(1, 0.5, 192, 4, ((60, 192), (61, 4)))  # the other 12 blocks, 7 tokens a chunk
    scheduler.add_request(long)
    now, computed = 1.0, 0
    while True:
        computed = long.processed
        batch = scheduler.next_batch()
        if scheduler.num_preemptions:
            break
        now += 1.0
        scheduler.finish(batch, now)
    assert long.num_restarts == 1 and 16 < computed < 192  # the decoder took the last free block
    hashes = block_hashes(long.segments, 192, 16)
    # a restart re-prefills only what it had computed, so blocks past that were never computed
    assert [h in scheduler.prefix_cache for h in hashes] == [i < computed // 16 for i in range(12)]
