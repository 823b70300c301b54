"""Prefix-aware routing live: the simulator's `prefix_affinity` router keeps a GRPO group on the
engine that caches its prompt, and the built-in engines' prefix caches compute less for it."""

from __future__ import annotations

from rollflow.runtime.manager.config import EngineEntry, ManagerConfig
from rollflow.runtime.manager.core.prefixes import BLOCK_TOKENS, PrefixRecord, prefix_key
from rollflow.runtime.wire.base import SamplingParams
from rollflow.token_blocks import block_hashes
from tests.runtime.manager.helpers import finished, run_manager
from tests.runtime.processes import http


def _prefill_tokens(engines) -> int:
    return sum(http("GET", e.url + "/v1/loads")[1]["loads"][0]["prefill_tokens_computed"] for e in engines)


def _run_batch(engines, router: str, prompts: list[list[int]]) -> list[list[int]]:
    """Engine ids of each group's samples."""

    async def placed(manager):
        batch = manager.submit_batch(prompts, 4, SamplingParams(max_new_tokens=4, temperature=0))
        await finished(batch)
        assert all(sample.state.name == "FINISHED" for sample in batch.samples)
        return [[sample.spans[0].engine_id for sample in group] for group in batch.groups]

    config = ManagerConfig(
        router=router, engines=[EngineEntry(url=e.url, engine_type="builtin", capacity=8) for e in engines]
    )
    return run_manager(placed, config)


def test_prefix_affinity_keeps_groups_on_one_engine_and_halves_the_prefill(processes):
    engines = [processes.engine() for _ in range(3)]
    computed = {}
    placements = {}
    for offset, router in ((0, "round_robin"), (100, "prefix_affinity")):
        prompts = [[offset + 40 * g + i for i in range(40)] for g in range(3)]  # 40 tokens each
        before = _prefill_tokens(engines)
        placements[router] = _run_batch(engines, router, prompts)
        computed[router] = _prefill_tokens(engines) - before
    # round robin spreads every group's 4 samples over the 3 engines
    assert all(len(set(group)) > 1 for group in placements["round_robin"])
    # prefix affinity: each group on one engine, the three groups on three engines
    assert [len(set(group)) for group in placements["prefix_affinity"]] == [1, 1, 1]
    assert len({group[0] for group in placements["prefix_affinity"]}) == 3
    # per group, one full prefill of 40 tokens and three of the 8 past the cached 32: 3 x 64,
    # against 3 x 128 when each engine computes each prompt it gets at least once
    assert computed == {"round_robin": 384, "prefix_affinity": 192}


def test_the_managers_record_finds_leading_blocks_and_forgets_the_least_recently_sent():
    record = PrefixRecord(max_blocks=4)
    system = list(range(100, 132))  # two blocks shared by every prompt
    record.sent(system + list(range(16)) + [7])  # three whole blocks; the partial one is not kept
    assert record.cached_tokens(block_hashes(system + list(range(16)) + [9] * 20, BLOCK_TOKENS)) == 48
    assert (
        record.cached_tokens(block_hashes(system + [5] * 40, BLOCK_TOKENS)) == 32
    )  # the shared system prompt
    assert record.cached_tokens(block_hashes([1] * 48, BLOCK_TOKENS)) == 0
    # a turn's whole context (the prompt and the answer) is found by the next turn, which extends it
    turn = system + [3] * 16
    record.sent(turn + [4] * 16)
    assert record.cached_tokens(block_hashes(turn + [4] * 16 + [8] * 16, BLOCK_TOKENS)) == 64
    # past four blocks the least recently sent go: the first prompt's third block
    assert record.cached_tokens(block_hashes(system + list(range(16)), BLOCK_TOKENS)) == 32


def test_a_single_requests_key_is_its_whole_prompt_and_a_batch_samples_its_group():
    assert prefix_key("b1", 0, [1]) == prefix_key("b1", 0, [2]) != prefix_key("b1", 1, [1])
    shared = [7] * 256  # a long system prompt: requests that share only it are no group
    assert prefix_key(None, 0, [*shared, 1]) != prefix_key(None, 0, [*shared, 2])
    assert prefix_key(None, 0, [*shared, 1]) == prefix_key(None, 3, [*shared, 1]) > 0
