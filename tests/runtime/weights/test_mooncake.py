"""Pulls whose chunks travel over Mooncake's transfer engine (TCP on 127.0.0.1) from a real
`rollflow weights serve --mooncake tcp` process: full, delta and int8 give the published weights,
a server killed mid-transfer yields no weights and the retry resumes, and where Mooncake is not
served the pull says why and uses HTTP."""

from __future__ import annotations

import asyncio

import pytest

from rollflow.runtime.weights import WeightPuller, WeightStore
from rollflow.runtime.weights.mooncake import Unavailable, local_engine
from tests.runtime.weights.factories import (
    assert_same_state,
    pull_through_a_killed_server,
    start_server_process,
    tiny_llama,
    train_step,
)

SMALL_CHUNKS = 2048  # the tiny model spreads over ~30 chunks


@pytest.fixture(autouse=True, scope="module")
def mooncake_usable() -> None:
    """make installs Mooncake and its libraries; where it is missing, each test fails saying what."""
    engine = local_engine()
    if isinstance(engine, Unavailable):
        pytest.fail(f"Mooncake is not usable here: {engine.reason}", pytrace=False)


async def pull(url: str, cache, transport: str = "mooncake", **kwargs):
    """Pull the latest version (over `transport`), then the next as a delta against it if there is one."""
    async with WeightPuller(url, cache, transport=transport, max_attempts=2, retry_delay_s=0.1) as puller:
        return await puller.pull(**kwargs)


def test_full_delta_and_int8_payloads_travel_over_mooncake_exactly(tmp_path):
    store_dir = tmp_path / "store"
    store = WeightStore(store_dir, chunk_bytes=SMALL_CHUNKS, delta_block_bytes=64)
    first = tiny_llama(0)
    second = train_step(first, fraction=0.02, seed=1)
    store.publish(1, first)
    process, url = start_server_process(store_dir, "--mooncake", "tcp")
    try:
        full = asyncio.run(pull(url, tmp_path / "cache"))
        WeightStore(store_dir, chunk_bytes=SMALL_CHUNKS, delta_block_bytes=64).publish(2, second)
        delta = asyncio.run(pull(url, tmp_path / "cache", codec="delta+zstd", base=full.weights))
        int8 = asyncio.run(pull(url, tmp_path / "cache", codec="int8+zstd"))
    finally:
        process.kill()
        process.wait()
    assert (full.stats.transport, delta.stats.transport, int8.stats.transport) == ("mooncake",) * 3
    assert len(full.manifest.chunks) > 10 and full.stats.chunks_downloaded == len(full.manifest.chunks)
    assert_same_state(full.weights.state_dict, first)
    assert delta.manifest.base_version == 1 and delta.stats.fallback_reason is None
    assert_same_state(delta.weights.state_dict, second)
    assert delta.stats.wire_nbytes < full.stats.wire_nbytes / 3
    assert int8.manifest.codec == "int8+zstd" and int8.weights.version == 2
    assert int8.stats.wire_nbytes < full.stats.wire_nbytes


def test_a_server_killed_mid_mooncake_transfer_yields_no_weights_and_the_retry_resumes(tmp_path):
    store_dir = tmp_path / "store"
    state = tiny_llama(0)
    WeightStore(store_dir, chunk_bytes=SMALL_CHUNKS).publish(1, state)
    killed_after, result = pull_through_a_killed_server(
        store_dir, tmp_path / "cache", "--mooncake", "tcp", transport="mooncake"
    )
    assert killed_after == [4]
    assert result.stats.transport == "mooncake" and result.stats.chunks_reused == 4
    assert_same_state(result.weights.state_dict, state)


def test_a_server_without_mooncake_is_pulled_over_http_saying_why(tmp_path, caplog):
    store_dir = tmp_path / "store"
    state = tiny_llama(0)
    WeightStore(store_dir, chunk_bytes=SMALL_CHUNKS).publish(1, state)
    process, url = start_server_process(store_dir)
    try:
        result = asyncio.run(pull(url, tmp_path / "cache"))
    finally:
        process.kill()
        process.wait()
    assert result.stats.transport == "http"
    assert_same_state(result.weights.state_dict, state)
    [line] = [r.getMessage() for r in caplog.records if "mooncake" in r.getMessage()]
    assert line == (
        "weights over mooncake unavailable, pulling over http: this weight server serves no Mooncake "
        "transport: it was started without --mooncake"
    )
