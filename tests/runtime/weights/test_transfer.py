"""Pulls over real HTTP on 127.0.0.1: full and delta, verified, resumable, and safe when the
server dies or serves corrupt data half-way."""

from __future__ import annotations

import asyncio
import os

import aiohttp
import pytest
import safetensors.torch

from rollflow.runtime.deadline import within
from rollflow.runtime.weights import (
    LoadedWeights,
    WeightIntegrityError,
    WeightPuller,
    WeightsError,
    WeightStore,
    WeightTransferError,
    save_weights,
)
from rollflow.runtime.weights.server import WeightServer
from tests.runtime.weights.factories import (
    assert_same_state,
    pull_through_a_killed_server,
    serving,
    tiny_llama,
    train_step,
)

SMALL_CHUNKS = 2048  # the tiny model spreads over ~30 chunks


def test_an_engine_pulls_the_latest_version_and_then_only_what_changed(tmp_path):
    store = WeightStore(tmp_path / "store", chunk_bytes=SMALL_CHUNKS, delta_block_bytes=64)
    first = tiny_llama(0)
    second = train_step(first, fraction=0.02, seed=1)
    store.publish(1, first, files={"config.json": '{"model_type": "llama"}'})

    async def scenario():
        async with serving(store) as server, WeightPuller(server.url, tmp_path / "cache") as puller:
            assert server.url.startswith("http://127.0.0.1:")
            full = await puller.pull()
            store.publish(2, second)
            delta = await puller.pull(codec="delta+zstd", base=full.weights)
            return full, delta

    full, delta = asyncio.run(scenario())
    assert full.weights.version == 1 and full.weights.files == {"config.json": '{"model_type": "llama"}'}
    assert_same_state(full.weights.state_dict, first)
    assert delta.weights.version == 2 and delta.manifest.base_version == 1
    assert_same_state(delta.weights.state_dict, second)
    assert delta.stats.fallback_reason is None and delta.stats.attempts == 1
    assert delta.stats.wire_nbytes < full.stats.wire_nbytes / 3
    assert not any((tmp_path / "cache").iterdir())  # nothing partial is left behind


def test_a_base_that_is_not_the_named_version_gets_a_full_payload(tmp_path):
    store = WeightStore(tmp_path / "store")
    first, second = tiny_llama(0), tiny_llama(1)
    store.publish(1, first)
    store.publish(2, second)
    stale = LoadedWeights(1, train_step(first, fraction=0.5, seed=9))  # claims 1, holds something else

    async def scenario():
        async with serving(store) as server, WeightPuller(server.url, tmp_path / "cache") as puller:
            return await puller.pull(codec="delta+zstd", base=stale)

    result = asyncio.run(scenario())
    assert result.manifest.base_version is None
    assert result.stats.fallback_reason == "the base weights did not match version 1"
    assert_same_state(result.weights.state_dict, second)


def test_a_pulled_version_saves_as_a_loadable_checkpoint_folder(tmp_path):
    store = WeightStore(tmp_path / "store")
    state = tiny_llama(0)
    store.publish(1, state, files={"config.json": "{}"})

    async def scenario():
        async with serving(store) as server, WeightPuller(server.url, tmp_path / "cache") as puller:
            return await puller.pull(codec="int8+zstd")

    result = asyncio.run(scenario())
    out = save_weights(result.weights, tmp_path / "engine")
    loaded = safetensors.torch.load_file(str(out / "model.safetensors"))
    assert sorted(loaded) == sorted(state) and (out / "config.json").read_text() == "{}"
    assert all(loaded[name].shape == state[name].shape for name in state)


def test_publishing_over_http_needs_the_token_and_wakes_waiting_engines(tmp_path):
    store = WeightStore(tmp_path / "store")
    store.publish(1, tiny_llama(0))

    async def scenario():
        async with serving(store, token="s3cret") as server:
            async with WeightPuller(server.url, tmp_path / "a", token="wrong") as intruder:
                with pytest.raises(WeightsError, match="401"):
                    await intruder.publish(2, tiny_llama(2))
            async with (
                WeightPuller(server.url, tmp_path / "b", token="s3cret") as trainer,
                WeightPuller(server.url, tmp_path / "c") as engine,
            ):
                waiting = asyncio.create_task(engine.versions(newer_than=1, wait_s=30))
                await asyncio.sleep(0.2)
                assert not waiting.done()
                await trainer.publish(2, tiny_llama(2), files={"config.json": "{}"})
                held = await within(waiting, 5)
                return held, await engine.pull()

    held, result = asyncio.run(scenario())
    assert held.latest == 2
    assert_same_state(result.weights.state_dict, tiny_llama(2))
    assert result.weights.files == {"config.json": "{}"}


def test_a_server_stopped_mid_transfer_and_restarted_lets_the_pull_finish(tmp_path):
    store = WeightStore(tmp_path / "store", chunk_bytes=SMALL_CHUNKS)
    state = tiny_llama(0)
    store.publish(1, state)

    async def scenario():
        server = WeightServer(store)
        await server.start()
        outage: list[asyncio.Task] = []

        async def restart():
            await server.stop()
            await asyncio.sleep(0.3)
            await server.start()  # same port

        def on_chunk(done: int, total: int) -> None:
            if done == 5 and not outage:
                outage.append(asyncio.get_running_loop().create_task(restart()))

        async with WeightPuller(
            server.url, tmp_path / "cache", parallel_chunks=1, retry_delay_s=0.2, on_chunk=on_chunk
        ) as puller:
            result = await puller.pull()
        await server.stop()
        return result

    result = asyncio.run(scenario())
    assert result.stats.attempts >= 2
    assert result.stats.chunks_reused == 5
    assert result.stats.chunks_downloaded == len(result.manifest.chunks)  # none fetched twice
    assert_same_state(result.weights.state_dict, state)


def test_a_killed_server_process_leaves_no_half_loaded_model_and_the_retry_resumes(tmp_path):
    store_dir = tmp_path / "store"
    state = tiny_llama(0)
    WeightStore(store_dir, chunk_bytes=SMALL_CHUNKS).publish(1, state)
    killed_after, result = pull_through_a_killed_server(store_dir, tmp_path / "cache")
    assert killed_after == [4]
    assert result.stats.chunks_reused == 4
    assert_same_state(result.weights.state_dict, state)


def test_a_server_serving_a_corrupt_chunk_never_yields_weights(tmp_path):
    store = WeightStore(tmp_path / "store", chunk_bytes=SMALL_CHUNKS)
    manifest = store.publish(1, tiny_llama(0))
    chunk = store.chunk_path(manifest.payload_id, 3)
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x01  # one flipped bit
    chunk.write_bytes(bytes(data))

    async def scenario():
        async with (
            serving(store) as server,
            WeightPuller(server.url, tmp_path / "cache", max_attempts=2, retry_delay_s=0) as puller,
        ):
            return await puller.pull()

    with pytest.raises(WeightIntegrityError, match="chunk 3 failed its checksum"):
        asyncio.run(scenario())


def test_a_corrupt_chunk_kept_from_an_earlier_pull_is_fetched_again(tmp_path):
    store = WeightStore(tmp_path / "store", chunk_bytes=SMALL_CHUNKS)
    state = tiny_llama(0)
    manifest = store.publish(1, state)
    cache = tmp_path / "cache" / manifest.payload_id
    cache.mkdir(parents=True)
    for index in range(3):  # what an interrupted pull left: two good chunks, one torn
        (cache / f"{index:06d}.chunk").write_bytes(store.chunk_path(manifest.payload_id, index).read_bytes())
    torn = cache / "000002.chunk"
    torn.write_bytes(torn.read_bytes()[:-1] + bytes([torn.read_bytes()[-1] ^ 0xFF]))

    async def scenario():
        async with serving(store) as server, WeightPuller(server.url, tmp_path / "cache") as puller:
            return await puller.pull()

    result = asyncio.run(scenario())
    assert result.stats.chunks_reused == 2
    assert_same_state(result.weights.state_dict, state)


def test_errors_from_the_server_are_clear(tmp_path):
    store = WeightStore(tmp_path / "store")
    store.publish(1, tiny_llama(0))

    async def scenario():
        async with serving(store) as server:
            async with WeightPuller(server.url, tmp_path / "cache") as puller:
                with pytest.raises(WeightsError, match="weight version 7 is not in the store"):
                    await puller.pull(version=7)
            async with aiohttp.ClientSession() as session:
                async with session.get(f"{server.url}/v1/manifest", params={"codec": "gzip"}) as resp:
                    assert (
                        resp.status == 400
                        and "unknown codec 'gzip'" in (await resp.json())["error"]["message"]
                    )
                async with session.get(f"{server.url}/v1/payloads/..%2F..%2Fetc/chunks/0") as resp:
                    assert resp.status == 404
                async with session.get(f"{server.url}/v1/versions", params={"wait_s": "-1"}) as resp:
                    assert resp.status == 400 and "wait_s" in await resp.text()
        async with WeightPuller(server.url, tmp_path / "cache", max_attempts=1) as puller:
            with pytest.raises(WeightTransferError, match="did not answer"):
                await puller.versions()

    asyncio.run(scenario())
    assert not os.listdir(tmp_path / "store" / "tmp")
