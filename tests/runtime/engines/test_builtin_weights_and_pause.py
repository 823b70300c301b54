"""Loading weights and pausing change the engine's state, so these tests get an engine of their own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rollflow.runtime.engines.base import EngineRejectedError
from rollflow.runtime.engines.sglang import BuiltinEngineClient
from tests.runtime.engines.helpers import (
    PROMPT,
    collect,
    drain,
    greedy,
    paused_mid_stream,
    reference_greedy,
    run,
)
from tests.runtime.engines.processes import EngineProcess


@pytest.fixture(scope="module")
def other_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rollflow.runtime.engines.tiny_model import TinyModelSpec, write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("models") / "seed1", TinyModelSpec(seed=1))


@pytest.fixture(scope="module")
def own_engine(tiny_model: Path) -> Iterator[EngineProcess]:
    process = EngineProcess(tiny_model, "--weight-version", "3")
    yield process
    process.stop()


def test_weights_from_disk_then_pushed_tensors_change_outputs_and_versions(
    own_engine, tiny_model, other_model
):
    from safetensors.torch import load_file

    async def go():
        client = BuiltinEngineClient(own_engine.url)
        try:
            before = await collect(client, "v3", PROMPT, greedy(16))
            await client.update_weights_from_disk(str(other_model), 4)
            after_disk = await collect(client, "v4", PROMPT, greedy(16))
            await client.push_weights(load_file(tiny_model / "model.safetensors"), 5)
            after_push = await collect(client, "v5", PROMPT, greedy(16))
            return before, after_disk, after_push, await client.weight_version()
        finally:
            await client.close()

    before, after_disk, after_push, version = run(go())
    assert before.token_ids == reference_greedy(tiny_model, PROMPT, 16)[0]
    assert after_disk.token_ids == reference_greedy(other_model, PROMPT, 16)[0]
    assert after_push.token_ids == before.token_ids
    assert [c.chunks[0].weight_version for c in (before, after_disk, after_push)] == [3, 4, 5]
    assert version == 5


def test_a_weight_update_mid_stream_recomputes_the_cache_and_tags_later_tokens(
    own_engine, tiny_model, other_model
):
    """Tokens after the update are what the new weights produce from the sequence so far."""

    async def go():
        client = BuiltinEngineClient(own_engine.url)
        try:
            await client.update_weights_from_disk(str(tiny_model), 10)
            stream = client.generate("mid", PROMPT, greedy(30))
            first = await anext(stream)
            await client.pause()
            await client.update_weights_from_disk(str(other_model), 11)
            await client.resume()
            chunks = [first] + [c async for c in stream]
            return chunks
        finally:
            await client.close()

    chunks = run(go())
    tokens = [t for c in chunks for t in c.token_ids]
    versions = [c.weight_version for c in chunks for _ in c.token_ids]
    assert len(tokens) == 30 and chunks[-1].finish_reason == "length"
    num_old = versions.count(10)
    assert versions == [10] * num_old + [11] * (30 - num_old)
    assert tokens[:num_old] == reference_greedy(tiny_model, PROMPT, num_old)[0]
    assert tokens[num_old:] == reference_greedy(other_model, PROMPT + tokens[:num_old], 30 - num_old)[0]


def test_bad_weights_are_refused_whole_and_the_version_stays(own_engine, tiny_model, tmp_path):
    import torch

    async def go():
        client = BuiltinEngineClient(own_engine.url)
        try:
            version = await client.weight_version()
            errors = []
            for tensors in (
                {"model.norm.weight": torch.ones(7)},
                {"model.nope.weight": torch.ones(128)},
            ):
                with pytest.raises(EngineRejectedError) as info:
                    await client.push_weights(tensors, version + 1)
                errors.append(str(info.value))
            with pytest.raises(EngineRejectedError) as info:
                await client.update_weights_from_disk(str(tmp_path / "missing"), version + 1)
            errors.append(str(info.value))
            return version, await client.weight_version(), errors
        finally:
            await client.close()

    before, after, errors = run(go())
    assert before == after
    assert "'model.norm.weight' has shape [7]" in errors[0]
    assert "unknown tensor 'model.nope.weight'" in errors[1]
    assert "does not exist" in errors[2]


def test_pause_in_place_freezes_streams_and_resume_finishes_them_unchanged(own_engine, tiny_model):
    async def go():
        client = BuiltinEngineClient(own_engine.url)
        try:
            await client.update_weights_from_disk(str(tiny_model), 20)
            return await paused_mid_stream(client, 20, hold_s=0.5)
        finally:
            await client.close()

    streamed, ended_while_paused = run(go())
    assert not ended_while_paused
    assert streamed.token_ids == reference_greedy(tiny_model, PROMPT, 20)[0]


def test_pause_with_abort_ends_running_requests(own_engine):
    async def go():
        client = BuiltinEngineClient(own_engine.url)
        try:
            stream = client.generate("doomed", PROMPT, greedy(1500))
            first = await anext(stream)
            await client.post_json("/pause_generation", {"mode": "abort"})
            rest = await drain(stream)
            await client.resume()
            after = await collect(client, "after", PROMPT, greedy(3))
            return [first, *rest], after
        finally:
            await client.close()

    chunks, after = run(go())
    assert chunks[-1].finish_reason == "abort"
    assert len(after.token_ids) == 3
