"""Bad bytes at the HTTP edge of the manager, the built-in engine and the weight server are a 4xx
with a message naming the problem; a big body sent during a load retires no engine."""

from __future__ import annotations

import json
import threading

import pytest

from benchmarks.hostile_inputs import post_raw
from tests.runtime.manager.helpers import metric, workers
from tests.runtime.processes import http
from tests.runtime.test_auth import _weight_server

BAD_BODIES = [
    (b"[" * 200_000, 400, "nested too deep"),
    (b'{"input_ids": ' + b"[" * 200_000 + b"]" * 200_000 + b"}", 400, "nested too deep"),
    (b'{"text": "\\ud800 lone"}', 400, "lone UTF-16 surrogate"),
    (b'{"text": "caf\xe9"}', 400, "not UTF-8"),
    (b"\xff\xfe{}", 400, "not UTF-8"),
    (b'{"input_ids": [1, 2', 400, "malformed JSON"),
    (b"[1, 2]", 400, "must be a JSON object"),
]


@pytest.fixture(scope="module")
def servers(module_processes):
    engines = [module_processes.engine() for _ in range(2)]
    manager = module_processes.manager(
        stall_timeout_s=1.0,
        max_body_mb=48,
        engines=[{"url": e.url, "engine_type": "builtin", "capacity": 4} for e in engines],
    )
    return manager, engines


@pytest.mark.parametrize(("raw", "status", "message"), BAD_BODIES)
def test_bad_bytes_are_a_4xx_naming_the_problem_on_the_manager_and_the_engine(servers, raw, status, message):
    manager, engines = servers
    for url in (manager.url, engines[0].url):
        got, body = http("POST", url + "/generate", raw)
        assert got == status, (url, body)
        assert message in body["error"]["message"], (url, body)
    assert {w["state"] for w in workers(manager).values()} == {"healthy"}


def test_bodies_above_the_limit_are_a_413(servers):
    manager, engines = servers
    big = b'{"input_ids": [' + b"1," * (25 << 20) + b"1]}"  # 50 MiB: above the manager's 48
    status, body = http("POST", manager.url + "/generate", big)
    assert status == 413 and "limit" in body["error"]["message"], body
    huge = b'{"input_ids": [' + b"1," * (33 << 20) + b"1]}"  # 66 MiB: above the engine's 64
    status, body = http("POST", engines[0].url + "/generate", huge)
    assert status == 413 and "limit" in body["error"]["message"], body


def test_a_big_body_during_a_load_retires_no_engine(servers):
    manager, _ = servers
    sampling = {"max_new_tokens": 48, "temperature": 0, "ignore_eos": True}
    status, batch = http(
        "POST",
        manager.url + "/batches",
        {"prompts": [[3 + i, 9] for i in range(8)], "n": 2, "sampling_params": sampling},
    )
    assert status == 201, batch
    answers = []

    def send_big() -> None:
        # 21 MB of valid JSON, too long a prompt: refused once its first 64 KiB are read (the server
        # answers before it is all sent, so it goes out on a raw socket that takes an early answer)
        body = json.dumps({"input_ids": [7] * 7_000_000}).encode()
        status, answer = post_raw(manager.url, body)
        answers.append((status, json.loads(answer)))

    senders = [threading.Thread(target=send_big) for _ in range(2)]
    for sender in senders:
        sender.start()
    status, answer = http("POST", f"{manager.url}/batches/{batch['batch_id']}/next", {"min_groups": 8})
    for sender in senders:
        sender.join(120)
    assert status == 200, answer
    samples = [s for group in answer["groups"] for s in group]
    assert len(samples) == 16 and all(s["state"] == "finished" for s in samples)
    assert len(answers) == 2, answers
    assert all(a[0] == 413 and "max_prompt_tokens" in a[1]["error"]["message"] for a in answers), answers
    assert {w["state"] for w in workers(manager).values()} == {"healthy"}
    assert metric(manager, "rollflow_engine_failures_total") == 0


def test_the_weight_server_refuses_versions_it_cannot_list_and_bad_uploads(tmp_path):
    proc, url = _weight_server(tmp_path, token="t0k")
    try:
        status, body = http("PUT", url + "/v1/versions/100000000", b"x", token="t0k")
        assert status == 400 and "outside 0..99999999" in body["error"]["message"], body
        status, body = http("PUT", url + "/v1/versions/abc", b"x", token="t0k")
        assert status == 400 and "integer" in body["error"]["message"], body
        status, body = http("PUT", url + "/v1/versions/1", b"\xff" * 64, token="t0k")
        assert status == 400 and "not a safetensors file" in str(body), body
        assert http("GET", url + "/v1/versions")[1]["versions"] == []
    finally:
        proc.kill()
        proc.wait()


def test_an_upload_above_the_weight_servers_limit_is_a_413_naming_its_option(tmp_path):
    proc, url = _weight_server(tmp_path, "--max-upload-gb", "0.000001", token="t0k")  # 1073 bytes
    try:
        status, body = http("PUT", url + "/v1/versions/1", b"x" * 2000, token="t0k")
        assert status == 413, body
        assert body["error"]["message"] == (
            "the upload is 2000 bytes or more, above this server's limit of 1073 bytes (--max-upload-gb)"
        )
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("stream", [False, True])
def test_a_prompt_token_outside_the_vocabulary_is_a_400_through_the_manager(servers, stream):
    """The engine refuses the request's own input; the manager answers with that 400 and the
    engine's message (not a 200 with an empty output), and no engine leaves the pool."""
    manager, _ = servers
    body = {"input_ids": [1, 99_999], "sampling_params": {"max_new_tokens": 4}, "stream": stream}
    status, answer = http("POST", manager.url + "/generate", body)
    assert status == 400 and "outside the vocabulary" in answer["error"]["message"], answer
    assert {w["state"] for w in workers(manager).values()} == {"healthy"}


def test_one_error_shape_and_one_health_path_on_every_server(servers, tmp_path):
    manager, engines = servers
    proc, weights_url = _weight_server(tmp_path)
    try:
        for url in (manager.url, engines[0].url, weights_url):
            assert http("GET", url + "/health")[0] == 200, url
        answers = [
            http("POST", manager.url + "/generate", {"input_ids": [1], "sampling_params": {"top_k": -5}}),
            http("POST", engines[0].url + "/generate", {"input_ids": [1], "sampling_params": {"top_k": -5}}),
            http("GET", weights_url + "/v1/manifest?version=77&codec=full"),
        ]
        for status, answer in answers:
            assert 400 <= status < 500 and set(answer) == {"error"} and set(answer["error"]) == {"message"}
    finally:
        proc.kill()
        proc.wait()
