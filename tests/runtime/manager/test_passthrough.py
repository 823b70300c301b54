"""SGLang's info and admin routes on the manager reach every engine, as sgl-router's do, and a
weight update through them is recorded per engine at once."""

from __future__ import annotations

import pytest

from tests.runtime.processes import http

TOKEN = "admin-token"


@pytest.fixture(scope="module")
def fleet(module_processes):
    engines = [module_processes.engine() for _ in range(2)]
    manager = module_processes.manager(token=TOKEN, engines=[{"url": e.url} for e in engines])
    return manager, engines


def _engine_info(engine) -> dict:
    status, info = http("GET", engine.url + "/get_server_info")
    assert status == 200, info
    return info


def test_info_routes_relay_the_first_engines_answer(fleet):
    manager, engines = fleet
    for path in ("/get_model_info", "/v1/models"):
        status, answer = http("GET", manager.url + path)
        assert status == 200, answer
        assert answer == http("GET", engines[0].url + path)[1]
    status, info = http("GET", manager.url + "/get_server_info")
    assert status == 200 and info["model_path"] == _engine_info(engines[0])["model_path"]


def test_health_generate_asks_every_engine(fleet):
    manager, engines = fleet
    status, answer = http("GET", manager.url + "/health_generate")
    assert status == 200, answer
    assert sorted(e["url"] for e in answer["engines"]) == sorted(e.url for e in engines)
    assert all(e["success"] for e in answer["engines"])


@pytest.mark.parametrize(
    "path", ["/flush_cache", "/pause_generation", "/continue_generation", "/update_weights_from_disk"]
)
def test_admin_routes_need_the_token(fleet, path):
    manager, _ = fleet
    status, answer = http("POST", manager.url + path, {})
    assert status == 401, answer
    status, answer = http("POST", manager.url + path, {}, token="wrong")
    assert status == 401, answer


def test_flush_cache_reaches_every_engine(fleet):
    manager, engines = fleet
    status, answer = http("POST", manager.url + "/flush_cache", token=TOKEN)
    assert status == 200 and answer["success"] is True, answer
    assert sorted(e["url"] for e in answer["engines"]) == sorted(e.url for e in engines)
    assert all(e["answer"]["success"] for e in answer["engines"])


def test_pause_and_continue_reach_every_engine(fleet):
    manager, engines = fleet
    status, answer = http("POST", manager.url + "/pause_generation", {"mode": "in_place"}, token=TOKEN)
    assert status == 200 and answer["success"], answer
    assert all(_engine_info(e)["internal_states"][0]["paused"] for e in engines)
    status, answer = http("POST", manager.url + "/continue_generation", token=TOKEN)
    assert status == 200 and answer["success"], answer
    assert not any(_engine_info(e)["internal_states"][0]["paused"] for e in engines)


def test_update_weights_from_disk_loads_on_every_engine_and_records_each_version(fleet, tiny_model):
    manager, engines = fleet
    body = {"model_path": str(tiny_model), "weight_version": "5"}  # SGLang's type: a string
    status, answer = http("POST", manager.url + "/update_weights_from_disk", body, token=TOKEN)
    assert status == 200 and answer["success"], answer
    assert {e.url: http("GET", e.url + "/get_weight_version")[1]["weight_version"] for e in engines} == {
        e.url: 5 for e in engines
    }
    assert set(http("GET", manager.url + "/weight_versions")[1].values()) == {5}
    status, generated = http(
        "POST",
        manager.url + "/generate",
        {"input_ids": [3, 4], "sampling_params": {"max_new_tokens": 3, "temperature": 0}},
    )
    assert status == 200 and generated["meta_info"]["weight_version"] == 5


def test_a_failed_admin_call_names_each_engine_and_changes_no_version(fleet, tmp_path):
    manager, engines = fleet
    before = http("GET", manager.url + "/weight_versions")[1]
    body = {"model_path": str(tmp_path / "missing"), "weight_version": 9}
    status, answer = http("POST", manager.url + "/update_weights_from_disk", body, token=TOKEN)
    assert status == 400 and answer["success"] is False, answer
    assert "failed on 2 of 2 engines" in answer["error"]["message"]
    assert all(e.url in answer["error"]["message"] for e in engines)
    assert "does not exist" in answer["error"]["message"]
    assert http("GET", manager.url + "/weight_versions")[1] == before


def test_an_admin_call_that_fails_on_one_engine_fails_and_names_it(processes):
    alive, dead = processes.engine(), processes.engine()
    # health checks far apart: the manager still counts the dead engine as live when the call comes
    manager = processes.manager(
        token=TOKEN, health_interval_s=60, engines=[{"url": alive.url}, {"url": dead.url}]
    )
    dead.kill()
    status, answer = http("POST", manager.url + "/flush_cache", token=TOKEN)
    assert status == 502 and answer["success"] is False, answer
    assert answer["error"]["message"].startswith("flush_cache failed on 1 of 2 engines: engine 1")
    assert dead.url in answer["error"]["message"] and "unreachable" in answer["error"]["message"]
    assert {e["url"]: e["success"] for e in answer["engines"]} == {alive.url: True, dead.url: False}
