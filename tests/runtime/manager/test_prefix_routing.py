"""Prefix-aware routing live: the simulator's `prefix_affinity` router keeps a GRPO group on the
engine that caches its prompt, and the built-in engines' prefix caches compute less for it."""

from __future__ import annotations

import asyncio

from rollflow.runtime.engines.base import SamplingParams
from rollflow.runtime.manager.config import EngineEntry, ManagerConfig
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
