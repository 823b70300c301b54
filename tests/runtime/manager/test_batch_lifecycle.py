"""Every consumer of a batch ends: deleting it ends its sample streams and waiting `/next` calls
with a message saying so, and concurrent streams of a finishing batch each get every sample."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request

import pytest

from tests.runtime.manager.helpers import wait_until, workers
from tests.runtime.processes import http


@pytest.fixture(scope="module")
def manager(module_processes):
    engine = module_processes.engine()
    return module_processes.manager(engines=[{"url": engine.url, "engine_type": "builtin", "capacity": 4}])


def _submit(manager, prompts: int, max_new_tokens: int) -> str:
    body = {
        "prompts": [[7 + i, 8] for i in range(prompts)],
        "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True},
    }
    status, answer = http("POST", manager.url + "/batches", body)
    assert status == 201, answer
    return answer["batch_id"]


def _in_thread(target) -> tuple[threading.Thread, dict]:
    result: dict = {}

    def run() -> None:
        result["value"] = target()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def _stream_lines(manager, batch_id: str, order: str = "completion") -> list[dict]:
    """The stream's lines; a stream refused at its start (410) as its one error line."""
    url = f"{manager.url}/batches/{batch_id}/samples?order={order}"
    try:
        with urllib.request.urlopen(url, timeout=120) as response:
            return [json.loads(line) for line in response if line.strip()]
    except urllib.error.HTTPError as exc:
        assert exc.code == 410, exc
        return [json.loads(exc.read())]


def test_deleting_a_batch_ends_its_streams_and_waiting_next_with_a_message(manager):
    batch_id = _submit(manager, prompts=6, max_new_tokens=1500)
    streams = [
        _in_thread(lambda o=o: _stream_lines(manager, batch_id, o)) for o in ("completion", "submission")
    ]
    waiting_next = _in_thread(
        lambda: http("POST", f"{manager.url}/batches/{batch_id}/next", {"min_groups": 6})
    )
    wait_until(lambda: next(iter(workers(manager).values()))["tokens_generated"] > 0, what="generation")

    status, body = http("DELETE", f"{manager.url}/batches/{batch_id}")
    assert status == 200, body

    for thread, _ in [*streams, waiting_next]:
        thread.join(60)
        assert not thread.is_alive(), "a consumer of the deleted batch still hangs"
    for _, result in streams:
        assert result["value"][-1] == {
            "error": {"message": f"batch {batch_id} was deleted (DELETE /batches/{batch_id})"}
        }
    status, answer = waiting_next[1]["value"]
    assert status == 410 and "was deleted" in answer["error"]["message"], answer
    assert http("GET", f"{manager.url}/batches/{batch_id}")[0] == 404
    assert next(iter(workers(manager).values()))["running"] == 0


def test_a_consumer_that_comes_after_the_delete_is_told_the_batch_was_deleted(manager):
    """A DELETE may reach the manager before the trainer's own /next or stream of the batch: they
    are answered as a waiting one is (410, with the message), not as an unknown batch; its status
    is gone (404), and the id submitted again names the new batch."""
    batch_id = _submit(manager, prompts=1, max_new_tokens=2)
    assert http("DELETE", f"{manager.url}/batches/{batch_id}")[0] == 200
    message = f"batch {batch_id} was deleted (DELETE /batches/{batch_id})"
    assert http("POST", f"{manager.url}/batches/{batch_id}/next", {"min_groups": 1}) == (
        410,
        {"error": {"message": message}},
    )
    assert _stream_lines(manager, batch_id) == [{"error": {"message": message}}]
    assert http("GET", f"{manager.url}/batches/{batch_id}")[0] == 404
    assert http("POST", f"{manager.url}/batches/never-made/next", {"min_groups": 1})[0] == 404

    body = {
        "prompts": [[9, 8]],
        "sampling_params": {"max_new_tokens": 2, "temperature": 0},
        "batch_id": batch_id,
    }
    assert http("POST", manager.url + "/batches", body)[0] == 201
    status, answer = http("POST", f"{manager.url}/batches/{batch_id}/next", {"min_groups": 1})
    assert status == 200 and answer["exhausted"] and len(answer["groups"]) == 1


def test_concurrent_streams_of_a_batch_each_get_every_sample(manager):
    batch_id = _submit(manager, prompts=12, max_new_tokens=3)
    streams = [_in_thread(lambda: _stream_lines(manager, batch_id)) for _ in range(4)]
    for thread, _ in streams:
        thread.join(120)
        assert not thread.is_alive(), "a stream missed a wake-up"
    for _, result in streams:
        lines = result["value"]
        assert sorted(s["group_index"] for s in lines) == list(range(12))
        assert all(s["state"] == "finished" for s in lines)


def test_a_stream_ends_when_the_last_sample_completes_while_a_line_is_being_written(monkeypatch):
    """The lost wake-up: the last sample completes while the stream writes the line before it.
    A wake-up taken before reading the batch sees that completion; one cleared after writing (the
    old code) missed it and the stream never ended. The write is held open to make the race sure."""
    from aiohttp import ClientSession, ClientTimeout, web
    from aiohttp.test_utils import TestServer

    from rollflow.runtime.manager.config import ManagerConfig
    from rollflow.runtime.manager.core.service import RolloutManager
    from rollflow.runtime.manager.edge.server import create_app
    from rollflow.runtime.wire.base import SamplingParams

    async def run() -> list[dict]:
        manager = RolloutManager(ManagerConfig())  # no engine: samples end only as the test ends them
        server = TestServer(create_app(manager), host="127.0.0.1")
        await server.start_server()
        try:
            batch = manager.submit_batch([[1], [2], [3]], 1, SamplingParams(max_new_tokens=4))
            first, second, last = batch.samples
            manager.abort_sample(first)
            manager.abort_sample(second)
            write = web.StreamResponse.write

            async def write_then_complete_the_last(response, data: bytes) -> None:
                await write(response, data)
                if second.sample_id.encode() in data:
                    manager.abort_sample(last)  # lands mid-write, after the batch was read
                    await asyncio.sleep(0)

            monkeypatch.setattr(web.StreamResponse, "write", write_then_complete_the_last)
            url = f"{server.make_url('/batches/' + batch.batch_id + '/samples')}"
            async with ClientSession(timeout=ClientTimeout(total=30)) as session, session.get(url) as resp:
                return [json.loads(line) for line in (await resp.read()).splitlines() if line.strip()]
        finally:
            await server.close()

    lines = asyncio.run(run())
    assert [line["group_index"] for line in lines] == [0, 1, 2]
    assert all(line["finish_reason"] == "abort" for line in lines)
