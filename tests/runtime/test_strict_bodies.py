"""Request bodies are read with strict types: a number or a bool sent as a string is a 400 that
names the field, never coerced (an integral float such as 8.0 is an int, as SGLang takes it); the
weight server checks its upload's `rollflow.files` metadata with a 400, not a 500."""

from __future__ import annotations

import json

import numpy as np
from safetensors.numpy import save

from tests.runtime.processes import http
from tests.runtime.test_auth import _weight_server


def _generate(url: str, **fields) -> tuple[int, dict]:
    body = {
        "input_ids": [3, 4],
        "sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True},
    }
    for key, value in fields.items():
        if key in ("max_new_tokens", "temperature", "ignore_eos"):
            body["sampling_params"][key] = value
        else:
            body[key] = value
    return http("POST", url + "/generate", body)


def test_loose_types_are_refused_by_the_manager_and_the_engine_naming_the_field(module_processes):
    engine = module_processes.engine()
    manager = module_processes.manager(engines=[{"url": engine.url, "engine_type": "builtin"}])
    for server in (manager, engine):
        for field, value, named in (
            ("max_new_tokens", "8", "sampling_params.max_new_tokens"),
            ("max_new_tokens", 8.5, "sampling_params.max_new_tokens"),
            ("max_new_tokens", True, "sampling_params.max_new_tokens"),
            ("ignore_eos", "yes", "sampling_params.ignore_eos"),
            ("temperature", "0", "sampling_params.temperature"),
            ("stream", "yes", "stream"),
            ("return_logprob", 1, "return_logprob"),
            ("input_ids", [3, 4.0], "input_ids"),
        ):
            status, body = _generate(server.url, **{field: value})
            assert status == 400 and named in body["error"]["message"], (server.url, field, value, body)
        status, body = _generate(server.url, max_new_tokens=8.0, temperature=0)  # SGLang runs 8.0 as 8
        assert status == 200 and len(body["output_ids"]) == 8, body
    status, body = http("POST", manager.url + "/v1/sessions", {"allow_off_policy": "true"})
    assert status == 400 and "allow_off_policy" in body["error"]["message"], body
    status, body = http("POST", manager.url + "/v1/completions", {"prompt": [3, 4], "max_tokens": "4"})
    assert status == 400 and "max_tokens" in str(body), body


def _upload(files_metadata: str) -> bytes:
    return save({"w": np.zeros(2, dtype=np.float32)}, metadata={"rollflow.files": files_metadata})


def test_the_weight_server_answers_400_for_bad_files_metadata(tmp_path):
    proc, url = _weight_server(tmp_path, "--insecure-open-publish")
    try:
        for metadata, said in (
            ("[1, 2]", "must be a JSON object of file name -> text, not a JSON list"),
            ("not json", "is not JSON"),
            ('{"config.json": 5}', "'config.json' holds a JSON int, not text"),
            ('{"../x": "{}"}', "needs a plain file name"),
        ):
            status, body = http("PUT", url + "/v1/versions/1", _upload(metadata))
            assert status == 400 and said in body["error"]["message"], (metadata, body)
        status, body = http("PUT", url + "/v1/versions/1", _upload(json.dumps({"config.json": "{}"})))
        assert status == 200, body
    finally:
        proc.kill()
        proc.wait()
