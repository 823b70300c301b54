"""The built-in engine pulls new weights from a weight server itself: a delta against the version
it holds, verified before anything is loaded; a pull that fails leaves its weights alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollflow.runtime.engines.base import NotSupportedError
from rollflow.runtime.engines.sglang import BuiltinEngineClient, SGLangClient
from rollflow.runtime.engines.vllm import VLLMClient
from rollflow.runtime.weights import LoadedWeights, save_weights
from rollflow.runtime.weights.checkpoint import read_checkpoint
from tests.runtime.engines.helpers import PROMPT, collect, greedy, reference_greedy, run
from tests.runtime.engines.processes import EngineProcess
from tests.runtime.processes import free_port, http

# tensors a "training step" changes; the rest of the model stays bit-identical
CHANGED = ("model.layers.0.mlp.down_proj.weight", "model.layers.1.self_attn.o_proj.weight")


def _pull(engine: EngineProcess, url: str, version: int, **extra) -> tuple[int, dict]:
    return http(
        "POST", engine.url + "/update_weights_from_server", {"url": url, "weight_version": version, **extra}
    )


def test_engine_pulls_a_delta_and_then_generates_what_transformers_does_with_the_new_weights(
    tiny_model: Path, weight_server, tmp_path
):
    store, server = weight_server
    state, files = read_checkpoint(tiny_model)
    store.publish(1, state, files=files)
    stepped = {name: t * 1.7 if name in CHANGED else t for name, t in state.items()}
    engine = EngineProcess(tiny_model)
    try:
        status, first = _pull(engine, server.url, 1)
        assert status == 200, first
        assert first["weight_version"] == 1 and first["pull"]["base_version"] is None  # nothing to diff
        store.publish(2, stepped, files=files)
        status, second = _pull(engine, server.url, 2)
        assert status == 200, second
        output = run(_greedy_output(engine.url))
    finally:
        engine.stop()
    pull = second["pull"]
    assert pull["codec"] == "delta+zstd" and pull["base_version"] == 1 and pull["fallback_reason"] is None
    assert pull["wire_nbytes"] < first["pull"]["wire_nbytes"] / 2
    reference = save_weights(LoadedWeights(2, stepped, files), tmp_path / "v2")
    assert output == (reference_greedy(reference, PROMPT, 16)[0], 2)
    assert output[0] != reference_greedy(tiny_model, PROMPT, 16)[0]  # the change shows


async def _greedy_output(url: str) -> tuple[list[int], int | None]:
    client = BuiltinEngineClient(url)
    try:
        collected = await collect(client, "after-pull", PROMPT, greedy(16))
        return collected.token_ids, collected.chunks[-1].weight_version
    finally:
        await client.close()


def test_a_failed_pull_or_a_bad_body_leaves_the_engine_on_its_version(tiny_model: Path, weight_server):
    store, server = weight_server
    state, files = read_checkpoint(tiny_model)
    store.publish(1, state, files=files)
    engine = EngineProcess(tiny_model, "--weight-version", "5")
    try:
        missing = _pull(engine, server.url, 9)
        dead = _pull(engine, f"http://127.0.0.1:{free_port()}", 1)  # nobody listens: 5 attempts, ~8 s
        bad_codec = _pull(engine, server.url, 1, codec="delta+gzip")
        extra = _pull(engine, server.url, 1, token="x")
        version = http("GET", engine.url + "/get_weight_version")[1]["weight_version"]
    finally:
        engine.stop()
    assert missing[0] == 404 and "pulling weight version 9" in missing[1]["error"]["message"]
    assert dead[0] == 502 and "failed after 5 attempts" in dead[1]["error"]["message"]
    assert bad_codec[0] == 400 and bad_codec[1]["error"]["message"].startswith("codec:")
    assert extra[0] == 400 and "token: unknown field" in extra[1]["error"]["message"]
    assert version == 5


def test_sglang_and_vllm_clients_say_they_cannot_pull():
    async def go() -> list[str]:
        messages = []
        for client in (SGLangClient("http://127.0.0.1:1"), VLLMClient("http://127.0.0.1:1")):
            with pytest.raises(NotSupportedError) as info:
                await client.update_weights_from_server("http://127.0.0.1:2", 1, "delta+zstd")
            messages.append(str(info.value))
            await client.close()
        return messages

    messages = run(go())
    assert all("cannot pull from a rollflow weight server" in m for m in messages)
