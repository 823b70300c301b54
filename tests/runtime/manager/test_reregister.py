"""One engine, one record: urls are normalised, a removed engine's record is gone, and a failed
engine restarted on the same port registers again under its url."""

from __future__ import annotations

from rollflow.runtime.launch.servers import engine_command
from tests.runtime.manager.helpers import wait_until
from tests.runtime.processes import Process, http


def _engine_on(port: int, model, tmp_path, name: str) -> Process:
    return Process(engine_command(model, port), port, tmp_path / f"{name}.log")


def _records(manager) -> list[dict]:
    return http("GET", manager.url + "/workers?include_failed=true")[1]["workers"]


def _served(manager) -> bool:
    body = {
        "input_ids": [3, 4],
        "sampling_params": {"max_new_tokens": 3, "temperature": 0, "ignore_eos": True},
    }
    status, answer = http("POST", manager.url + "/generate", body)
    return status == 200 and answer["meta_info"]["finish_reason"] == {"type": "length"}


def test_a_restarted_engine_rejoins_under_its_url_and_urls_are_one_record(processes, tmp_path):
    engine = processes.engine()
    port = engine.port
    manager = processes.manager(health_interval_s=0.5)
    worker = {"url": engine.url, "engine_type": "builtin"}

    status, first = http("POST", manager.url + "/workers", worker)
    assert status == 201, first
    for spelling in (f"http://localhost:{port}", f"http://127.0.0.1:{port}/", f"http://LocalHost:{port}/"):
        status, body = http("POST", manager.url + "/workers", worker | {"url": spelling})
        assert status == 400 and "already registered" in body["error"]["message"], body
    assert len(_records(manager)) == 1

    engine.kill()
    wait_until(lambda: _records(manager)[0]["state"] == "failed", timeout=30, what="the engine to fail")
    status, body = http("POST", manager.url + "/workers", worker)
    assert status == 400 and "unreachable" in body["error"]["message"], body  # still down

    restarted = _engine_on(port, processes.model, tmp_path, "restarted")
    processes.started.append(restarted)
    status, rejoined = http("POST", manager.url + "/workers", worker | {"url": f"http://localhost:{port}/"})
    assert status == 201, rejoined
    assert rejoined["url"] == engine.url and rejoined["state"] == "healthy"
    assert [(r["id"], r["state"]) for r in _records(manager)] == [(rejoined["id"], "healthy")]
    assert _served(manager)

    status, removed = http("DELETE", manager.url + f"/workers/{rejoined['id']}")
    assert status == 200 and removed["state"] == "removed", removed
    assert _records(manager) == []
    assert http("DELETE", manager.url + f"/workers/{rejoined['id']}")[0] == 404
    status, again = http("POST", manager.url + "/workers", worker)
    assert status == 201, again
    assert [r["id"] for r in _records(manager)] == [again["id"]]
    assert _served(manager)


def test_deleting_a_failed_engine_removes_its_record(processes):
    engine = processes.engine()
    manager = processes.manager(
        health_interval_s=0.5, engines=[{"url": engine.url, "engine_type": "builtin"}]
    )
    engine.kill()
    wait_until(lambda: _records(manager)[0]["state"] == "failed", timeout=30, what="the engine to fail")
    status, body = http("DELETE", manager.url + f"/workers/{_records(manager)[0]['id']}")
    assert status == 200, body
    assert _records(manager) == []


def test_a_failed_engine_is_tried_again_after_its_breaker_pause_and_rejoins(processes):
    """The circuit breaker: a hung engine leaves the pool, is set aside, and once it answers again
    the health checker lets it back in (a new id, its weight version read afresh)."""
    engine = processes.engine()
    manager = processes.manager(health_interval_s=0.3, breaker_pause_s=1.0)
    status, first = http("POST", manager.url + "/workers", {"url": engine.url, "engine_type": "builtin"})
    assert status == 201, first

    engine.pause()  # SIGSTOP: its /health stops answering
    wait_until(lambda: _records(manager)[0]["state"] == "failed", timeout=30, what="the engine to fail")
    engine.resume()

    def rejoined() -> bool:
        records = _records(manager)
        return len(records) == 1 and records[0]["state"] == "healthy" and records[0]["id"] != first["id"]

    wait_until(rejoined, timeout=30, what="the engine to rejoin after the breaker's pause")
    assert _records(manager)[0]["url"] == first["url"]
    assert _served(manager)
