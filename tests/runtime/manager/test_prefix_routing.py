"""Prefix-aware routing live: the simulator's `prefix_affinity` router keeps a GRPO group on the
engine that caches its prompt, and the built-in engines' prefix caches compute less for it."""

from __future__ import annotations

import asyncio

from rollflow.runtime.engines.base import SamplingParams
from rollflow.runtime.manager.config import EngineEntry, ManagerConfig
from rollflow.runtime.manager.prefixes import PrefixRecord, prefix_key
from rollflow.runtime.manager.service import RolloutManager
from tests.runtime.processes import http, start_engine


def _prefill_tokens(engines) -> int:
    return sum(http("GET", e.url + "/v1/loads")[1]["loads"][0]["prefill_tokens_computed"] for e in engines)


def _run_batch(engines, router: str, prompts: list[list[int]]) -> list[list[int]]:
    """Engine ids of each group's samples."""

    async def main():
        config = ManagerConfig(
            router=router,
            engines=[EngineEntry(url=e.url, engine_type="builtin", capacity=8) for e in engines],
        )
        manager = RolloutManager(config)
        await manager.start()
        try:
            batch = manager.submit_batch(prompts, 4, SamplingParams(max_new_tokens=4, temperature=0))
            while not batch.done:
                await batch.changed()
            assert all(sample.state.name == "FINISHED" for sample in batch.samples)
            return [[sample.spans[0].engine_id for sample in group] for group in batch.groups]
        finally:
            await manager.close()

    return asyncio.run(main())


def test_prefix_affinity_keeps_groups_on_one_engine_and_halves_the_prefill(tmp_path, tiny_model):
    engines = [start_engine(tiny_model, tmp_path, name=f"e{i}", wait=False) for i in range(3)]
    try:
        for engine in engines:
            engine.wait_ready()
        computed = {}
        placements = {}
        for offset, router in ((0, "round_robin"), (100, "prefix_affinity")):
            prompts = [[offset + 40 * g + i for i in range(40)] for g in range(3)]  # 40 tokens each
            before = _prefill_tokens(engines)
            placements[router] = _run_batch(engines, router, prompts)
            computed[router] = _prefill_tokens(engines) - before
    finally:
        for engine in engines:
            engine.stop()
    # round robin spreads every group's 4 samples over the 3 engines
    assert all(len(set(group)) > 1 for group in placements["round_robin"])
    # prefix affinity: each group on one engine, the three groups on three engines
    assert [len(set(group)) for group in placements["prefix_affinity"]] == [1, 1, 1]
    assert len({group[0] for group in placements["prefix_affinity"]}) == 3
    # per group, one full prefill of 40 tokens and three of the 8 past the cached 32: 3 x 64,
    # against 3 x 128 when each engine computes each prompt it gets at least once
    assert computed == {"round_robin": 384, "prefix_affinity": 192}


def test_the_managers_record_reads_the_common_prefix_and_forgets_the_oldest_keys():
    record = PrefixRecord(max_keys=2)
    record.sent(1, [5, 6, 7, 8])
    record.sent(2, [9, 9])
    assert record.cached_tokens(1, [5, 6, 0, 8]) == 2 and record.cached_tokens(3, [5, 6]) == 0
    record.sent(3, [1])  # a third key: the oldest (1) is forgotten
    assert record.cached_tokens(1, [5, 6, 7, 8]) == 0 and record.cached_tokens(2, [9, 9, 9]) == 2
    # a batch sample's key is its group; a single request's, its prompt's first 64 tokens
    assert prefix_key("b1", 0, [1]) == prefix_key("b1", 0, [2]) != prefix_key("b1", 1, [1])
    assert prefix_key(None, 0, [7] * 64 + [1]) == prefix_key(None, 0, [7] * 64 + [2]) > 0
