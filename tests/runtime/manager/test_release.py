"""Engines give their device back mid-batch and take it again: the released engine's samples finish
elsewhere from their tokens, its memory is freed, and it serves again (on the newest weights) once
resumed. An engine killed while releasing, or one that will not sleep, loses nothing."""

from __future__ import annotations

import threading

import pytest
import torch
from aiohttp import web
from safetensors.torch import load_file, save_file

from rollflow.runtime.manager.client import ManagerClient, ManagerError
from rollflow.runtime.manager.core.batches import sample_sampling
from rollflow.runtime.wire.base import SamplingParams
from tests.runtime.manager.helpers import (
    EngineProxy,
    assert_finished_as_undisturbed,
    greedy_reference,
    metric,
    prompts,
    wait_streaming,
    workers,
)
from tests.runtime.processes import http

PROMPTS = prompts(6)
MAX_NEW_TOKENS = 120


def _collect(batch) -> tuple[threading.Thread, list[dict]]:
    samples: list[dict] = []
    reader = threading.Thread(
        target=lambda: samples.extend(s for mb in batch.micro_batches() for g in mb for s in g)
    )
    reader.start()
    return reader, samples


def _engine_id(manager, engine) -> int:
    return workers(manager)[engine.url]["id"]


def _perturbed_copy(model_dir, out_dir):
    """The tiny model's weights plus noise, as a folder the engine loads from disk."""
    out_dir.mkdir()
    tensors = load_file(model_dir / "model.safetensors")
    generator = torch.Generator().manual_seed(0)
    noisy = {n: t + 0.05 * torch.randn(t.shape, generator=generator) for n, t in tensors.items()}
    save_file(noisy, out_dir / "model.safetensors")
    return out_dir


def test_released_engine_moves_its_samples_frees_memory_and_serves_again(processes, tmp_path):
    released, survivor = processes.engine(), processes.engine()
    manager = processes.manager(engines=[{"url": e.url, "capacity": 3} for e in (released, survivor)])
    client = ManagerClient(manager.url)
    batch = client.submit(PROMPTS, n=1, max_new_tokens=MAX_NEW_TOKENS, temperature=0, ignore_eos=True)
    reader, samples = _collect(batch)
    wait_streaming(manager, released)

    answer = client.release_worker(_engine_id(manager, released))
    assert answer["state"] == "released" and answer["move"]["samples_moved"] > 0, answer
    sleeping = http("GET", released.url + "/is_sleeping")[1]
    assert sleeping == {
        "is_sleeping": True,
        "released_tags": ["kv_cache", "weights"],
        "weights_bytes": 0,
        "cached_sequences": 0,
    }
    assert http("GET", released.url + "/health")[0] == 200  # up, without a model
    status, body = http("POST", released.url + "/generate", {"input_ids": [3], "sampling_params": {}})
    assert status == 503 and "resume_memory_occupation" in body["error"]["message"]

    reader.join(timeout=300)
    assert not reader.is_alive() and len(samples) == len(PROMPTS)
    moved = [s for s in samples if s["resumes"] > 0]
    assert len(moved) == answer["move"]["samples_moved"]
    assert_finished_as_undisturbed(samples, survivor, MAX_NEW_TOKENS)
    assert all(sample["regenerated_tokens"] == 0 for sample in samples)
    assert all([span["engine_url"] for span in s["spans"]] == [released.url, survivor.url] for s in moved)
    assert metric(manager, "rollflow_regenerated_tokens_total") == 0

    # resumed onto weights loaded meanwhile on the other engine: it rejoins on that version only
    perturbed = _perturbed_copy(processes.model, tmp_path / "v1")
    client.update_weights(_engine_id(manager, survivor), model_path=str(perturbed), weight_version=1)
    answer = client.resume_worker(_engine_id(manager, released), model_path=str(perturbed), weight_version=1)
    assert answer["state"] == "healthy" and answer["weight_version"] == 1, answer
    assert http("GET", released.url + "/is_sleeping")[1]["weights_bytes"] > 0
    prompt = PROMPTS[0]
    assert greedy_reference(released, prompt, 20) == greedy_reference(survivor, prompt, 20)

    # released again after a weight load: waking with no source restores exactly those weights
    client.release_worker(_engine_id(manager, released))
    answer = client.resume_worker(_engine_id(manager, released))
    assert answer["weight_version"] == 1
    assert greedy_reference(released, prompt, 20) == greedy_reference(survivor, prompt, 20)
    client.remove_worker(_engine_id(manager, survivor))
    again = client.submit(PROMPTS[:2], n=1, max_new_tokens=8, temperature=0, ignore_eos=True)
    reader, samples = _collect(again)
    reader.join(timeout=120)
    assert {span["engine_url"] for s in samples for span in s["spans"]} == {released.url}


class _DiesWhileReleasing(EngineProxy):
    """Relays an engine; on `/release_memory_occupation` the engine is killed before it answers."""

    def __init__(self, engine) -> None:
        super().__init__(engine.url)
        self.engine = engine

    async def handle(self, request: web.Request, body: bytes) -> web.StreamResponse:
        if request.path == "/release_memory_occupation":
            self.engine.kill()
        return await super().handle(request, body)


class _WillNotSleep(EngineProxy):
    async def handle(self, request: web.Request, body: bytes) -> web.StreamResponse:
        if request.path == "/release_memory_occupation":
            return web.json_response({"success": False, "message": "busy with something else"}, status=400)
        return await super().handle(request, body)


def test_engine_killed_while_releasing_loses_nothing_and_the_log_says_so(processes):
    dying, survivor = processes.engine(), processes.engine()
    proxy = _DiesWhileReleasing(dying)
    manager = processes.manager(engines=[{"url": u, "capacity": 3} for u in (proxy.url, survivor.url)])
    client = ManagerClient(manager.url)
    batch = client.submit(PROMPTS, n=1, max_new_tokens=MAX_NEW_TOKENS, temperature=0, ignore_eos=True)
    reader, samples = _collect(batch)
    wait_streaming(manager, proxy)
    with pytest.raises(ManagerError, match="failed while releasing") as refused:
        client.release_worker(_engine_id(manager, proxy))
    assert refused.value.status == 502
    reader.join(timeout=300)
    proxy.stop()
    assert len(samples) == len(PROMPTS)
    for sample in samples:
        assert sample["state"] == "finished" and sample["regenerated_tokens"] == 0, sample
        assert sample["output_ids"] == greedy_reference(survivor, sample["prompt_ids"], MAX_NEW_TOKENS)
    assert any(s["resumes"] for s in samples)
    assert workers(manager)[proxy.url]["state"] == "failed"
    assert "failed while releasing its memory" in manager.log()


def test_engine_that_will_not_sleep_stays_in_the_pool(processes):
    engine = processes.engine()
    proxy = _WillNotSleep(engine.url)
    manager = processes.manager(engines=[{"url": proxy.url, "capacity": 3}])
    client = ManagerClient(manager.url)
    with pytest.raises(ManagerError, match="busy with something else") as refused:
        client.release_worker(_engine_id(manager, proxy))
    assert refused.value.status == 409
    assert workers(manager)[proxy.url]["state"] == "healthy"
    status, body = http(
        "POST",
        manager.url + "/generate",
        {"input_ids": [3, 4], "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}},
    )
    assert status == 200 and len(body["output_ids"]) == 4, body
    assert "will not release its memory" in manager.log()
    proxy.stop()


def test_fan_out_routes_release_and_resume_every_engine_behind_the_token(processes):
    engines = [processes.engine() for _ in range(2)]
    manager = processes.manager(token="secret", engines=[{"url": e.url} for e in engines])
    assert http("POST", manager.url + "/release_memory_occupation", {})[0] == 401
    status, body = http("POST", manager.url + "/release_memory_occupation", {}, token="secret")
    assert status == 200 and body["success"] and len(body["moves"]) == 2, body
    assert {w["state"] for w in workers(manager).values()} == {"released"}
    assert all(http("GET", e.url + "/is_sleeping")[1]["is_sleeping"] for e in engines)
    status, body = http("POST", manager.url + "/resume_memory_occupation", {}, token="secret")
    assert status == 200 and body["success"] and len(body["moves"]) == 2, body
    assert {w["state"] for w in workers(manager).values()} == {"healthy"}
    status, body = http(
        "POST",
        manager.url + "/generate",
        {"input_ids": [3, 4], "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}},
    )
    assert status == 200 and len(body["output_ids"]) == 4, body


def test_seeded_sampled_samples_moved_by_a_release_draw_what_they_would_have(processes):
    """Each draw of a seeded request is keyed by (seed, position): a sample resumed elsewhere from its
    tokens continues exactly as it would have, so a release changes nothing about what is sampled."""
    released, survivor = processes.engine(), processes.engine()
    manager = processes.manager(engines=[{"url": e.url, "capacity": 3} for e in (released, survivor)])
    client = ManagerClient(manager.url)
    sampling = {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 1.0, "ignore_eos": True, "sampling_seed": 7}
    batch = client.submit(PROMPTS, n=2, **sampling)
    reader, samples = _collect(batch)
    wait_streaming(manager, released)
    client.release_worker(_engine_id(manager, released))
    reader.join(timeout=300)
    assert len(samples) == 2 * len(PROMPTS)
    moved = [s for s in samples if s["resumes"] > 0]
    assert moved
    for sample in samples:
        group, index = (int(part) for part in sample["sample_id"].rsplit("-", 2)[1:])
        seed = sample_sampling(SamplingParams(MAX_NEW_TOKENS, seed=7), group, index).seed
        status, alone = http(
            "POST",
            survivor.url + "/generate",
            {"input_ids": sample["prompt_ids"], "sampling_params": {**sampling, "sampling_seed": seed}},
        )
        assert status == 200 and sample["output_ids"] == alone["output_ids"], sample["sample_id"]
    groups = {}
    for sample in samples:
        groups.setdefault(sample["group_index"], []).append(sample["output_ids"])
    assert all(a != b for a, b in groups.values())  # the samples of a group differ
