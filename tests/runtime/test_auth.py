"""Every protected route of the manager, the built-in engine and the weight server refuses a
missing, wrong or malformed (non-UTF-8) bearer token with a 401, and takes the right one."""

from __future__ import annotations

import socket
import subprocess
import time
from urllib.parse import urlsplit

import pytest

from rollflow.runtime.launch.process import rollflow_command
from tests.runtime.processes import ENV, REPO, free_port, http

TOKEN = "manager-secret"
API_KEY = "engine-secret"
WEIGHTS_TOKEN = "publish-secret"

# (method, path) of every route that needs the token; bodies are irrelevant: auth comes first
ENGINE_PROTECTED = [
    ("POST", "/generate"),
    ("POST", "/abort_request"),
    ("GET", "/health_generate"),
    ("GET", "/get_model_info"),
    ("GET", "/get_weight_version"),
    ("POST", "/update_weights_from_disk"),
    ("POST", "/update_weights_from_safetensors?weight_version=1"),
    ("POST", "/update_weights_from_server"),
    ("POST", "/pause_generation"),
    ("POST", "/continue_generation"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/chat/completions"),
    ("GET", "/v1/models"),
    ("GET", "/get_server_info"),
    ("POST", "/flush_cache"),
    ("GET", "/v1/loads"),
    ("GET", "/get_load"),
]
MANAGER_PROTECTED = [
    ("POST", "/workers"),
    ("DELETE", "/workers/0"),
    ("POST", "/workers/0/update_weights"),
    ("POST", "/batches"),
    ("GET", "/batches/abc"),
    ("POST", "/batches/abc/next"),
    ("POST", "/batches/abc/flush"),
    ("GET", "/batches/abc/samples"),
    ("DELETE", "/batches/abc"),
    ("POST", "/step_report"),
    ("POST", "/flush_cache"),
    ("POST", "/pause_generation"),
    ("POST", "/continue_generation"),
    ("POST", "/update_weights_from_disk"),
    ("POST", "/add_worker?url=http://127.0.0.1:1"),
    ("POST", "/remove_worker?url=http://127.0.0.1:1"),
]


def raw_status(url: str, method: str, path: str, authorization: bytes) -> int:
    """Status of a request whose Authorization header is the given bytes (urllib only sends text)."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        sock.sendall(
            f"{method} {path} HTTP/1.1\r\nHost: {parts.netloc}\r\n".encode()
            + b"Authorization: "
            + authorization
            + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
        status_line = sock.makefile("rb").readline()
    return int(status_line.split()[1])


def assert_refused(url: str, routes, good: str) -> None:
    for method, path in routes:
        assert http(method, url + path)[0] == 401, (method, path)
        assert http(method, url + path, token="wrong")[0] == 401, (method, path)
        assert raw_status(url, method, path, b"Bearer \xff\xfe\x80") == 401, (method, path)
        assert raw_status(url, method, path, b"Bearer " + good.encode()) != 401, (method, path)


@pytest.fixture(scope="module")
def engine(module_processes):
    return module_processes.engine(extra_args=("--api-key", API_KEY))


def test_the_engine_takes_its_api_key_on_every_route_but_health(engine):
    assert http("GET", engine.url + "/health")[0] == 200
    assert_refused(engine.url, ENGINE_PROTECTED, API_KEY)
    status, body = http("GET", engine.url + "/get_weight_version", token=API_KEY)
    assert status == 200 and body["weight_version"] == 0


def test_the_manager_takes_its_token_on_admin_and_trainer_routes_and_passes_the_engine_key(
    module_processes, engine
):
    manager = module_processes.manager(token=TOKEN)
    assert_refused(manager.url, MANAGER_PROTECTED, TOKEN)
    for path in (
        "/health",
        "/metrics",
        "/workers",
        "/weight_versions",
        "/step_report",
        "/v1/loads",
        "/list_workers",
    ):
        assert http("GET", manager.url + path)[0] == 200, path
    # aborting one's own request stays open; aborting everyone's needs the token
    assert http("POST", manager.url + "/abort_request", {"rid": "mine"})[0] == 200
    assert http("POST", manager.url + "/abort_request", {"abort_all": True})[0] == 401
    assert http("POST", manager.url + "/abort_request", {"abort_all": True}, token=TOKEN)[0] == 200

    worker = {"url": engine.url, "engine_type": "builtin"}
    status, body = http("POST", manager.url + "/workers", worker, token=TOKEN)
    assert status == 400 and "401" in body["error"]["message"], body  # the engine refused the manager
    status, body = http("POST", manager.url + "/workers", worker | {"api_key": API_KEY}, token=TOKEN)
    assert status == 201, body
    assert "api_key" not in body
    sampling = {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}
    status, body = http("POST", manager.url + "/generate", {"input_ids": [3, 4], "sampling_params": sampling})
    assert status == 200 and len(body["output_ids"]) == 4, body
    status, batch = http("POST", manager.url + "/batches", {"prompts": [[5, 6]], "sampling_params": sampling})
    assert status == 401
    status, batch = http(
        "POST", manager.url + "/batches", {"prompts": [[5, 6]], "sampling_params": sampling}, token=TOKEN
    )
    assert status == 201, batch
    status, answer = http("POST", f"{manager.url}/batches/{batch['batch_id']}/next", {}, token=TOKEN)
    assert status == 200 and answer["exhausted"], answer


def _weight_server(tmp_path, *extra: str, token: str | None = None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {k: v for k, v in ENV.items() if k != "ROLLFLOW_WEIGHTS_TOKEN"}
    if token:
        env["ROLLFLOW_WEIGHTS_TOKEN"] = token
    argv = rollflow_command(
        "weights",
        "serve",
        "--dir",
        str(tmp_path / f"store-{port}"),
    )
    log = open(tmp_path / f"weights-{port}.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen([*argv, "--port", str(port), *extra], cwd=REPO, env=env, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if http("GET", url + "/health", timeout=2)[0] == 200:
                return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"weight server did not start: {(tmp_path / f'weights-{port}.log').read_text()}")


def test_the_weight_server_publishes_only_with_its_token_or_when_opened_explicitly(tmp_path):
    servers = []
    try:
        closed, closed_url = _weight_server(tmp_path)
        servers.append(closed)
        status, body = http("PUT", closed_url + "/v1/versions/1", b"not safetensors")
        assert status == 403 and "--insecure-open-publish" in body["error"]["message"], body

        opened, opened_url = _weight_server(tmp_path, "--insecure-open-publish")
        servers.append(opened)
        status, body = http("PUT", opened_url + "/v1/versions/1", b"not safetensors")
        assert status == 400 and "not a safetensors file" in str(body), body  # past auth: the body is judged

        guarded, guarded_url = _weight_server(tmp_path, token=WEIGHTS_TOKEN)
        servers.append(guarded)
        assert_refused(guarded_url, [("PUT", "/v1/versions/1")], WEIGHTS_TOKEN)
        for path in ("/health", "/v1/versions"):
            assert http("GET", guarded_url + path)[0] == 200
    finally:
        for proc in servers:
            proc.kill()
            proc.wait()


def test_a_batch_sample_and_reading_or_closing_a_session_need_the_managers_token(module_processes, engine):
    manager = module_processes.manager(token=TOKEN)
    worker = {"url": engine.url, "engine_type": "builtin", "api_key": API_KEY}
    assert http("POST", manager.url + "/workers", worker, token=TOKEN)[0] == 201
    sampling = {"max_new_tokens": 64, "temperature": 0, "ignore_eos": True}
    batch = {"prompts": [[5, 6]], "sampling_params": sampling, "batch_id": "trainers"}
    assert http("POST", manager.url + "/batches", batch, token=TOKEN)[0] == 201
    # the batch's sample id is easy to guess; ending it is the trainer's business
    status, body = http("POST", manager.url + "/abort_request", {"rid": "trainers-0-0"})
    assert status == 401 and "batch's sample" in body["error"]["message"], body
    status, body = http("POST", manager.url + "/abort_request", {"rid": "trainers-0-0"}, token=TOKEN)
    assert status == 200 and body["success"], body

    status, opened = http("POST", manager.url + "/v1/sessions", {"session_id": "episode-1"})
    assert status == 201, opened  # opening and turns stay open, as /generate is
    for method, path, body in (
        ("GET", "/v1/sessions/episode-1", None),
        ("DELETE", "/v1/sessions/episode-1", None),
        ("POST", "/close_session", {"session_id": "episode-1"}),
    ):
        assert http(method, manager.url + path, body)[0] == 401, path
        assert http(method, manager.url + path, body, token="wrong")[0] == 401, path
    assert http("GET", manager.url + "/v1/sessions/episode-1", token=TOKEN)[0] == 200
    assert http("DELETE", manager.url + "/v1/sessions/episode-1", token=TOKEN)[0] == 200


def test_the_bearer_scheme_is_matched_whatever_its_case(module_processes, engine, tmp_path):
    manager = module_processes.manager(token=TOKEN)
    for scheme in (b"bearer ", b"BEARER ", b"BeArEr "):
        assert raw_status(manager.url, "GET", "/batches/abc", scheme + TOKEN.encode()) == 404
        assert raw_status(engine.url, "GET", "/get_weight_version", scheme + API_KEY.encode()) == 200
        assert raw_status(manager.url, "GET", "/batches/abc", scheme + b"wrong") == 401
    assert raw_status(manager.url, "GET", "/batches/abc", b"Basic " + TOKEN.encode()) == 401
    proc, url = _weight_server(tmp_path, token=WEIGHTS_TOKEN)
    try:
        assert (
            raw_status(url, "PUT", "/v1/versions/1", b"bearer " + WEIGHTS_TOKEN.encode()) == 400
        )  # past auth
    finally:
        proc.kill()
        proc.wait()
