"""SkyRL's current client against the manager's vLLM-router API: `RemoteInferenceClient` (skyrl 0.3.0
from PyPI, run as it is by skyrl_client.py) with the manager as its `proxy_url`, over two built-in
engines. Its data plane: `/inference/v1/generate` per prompt with `X-Session-ID`, `/v1/completions`,
`/detokenize` (no local tokenizer), `/finish_session`; and a generate whose engine is killed
mid-batch finishing every sample with the greedy tokens of an undisturbed run."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.runtime.compat.skyrl_runs import answer, greedy, skyrl, skyrl_sampling
from tests.runtime.manager.helpers import metric
from tests.runtime.processes import http

PROMPTS = [[31, 32, 33], [34, 35], [36, 37, 38, 39], [40]]
SESSIONS = ["trajectory-a", "trajectory-a", "trajectory-b", "trajectory-c"]


@pytest.fixture(scope="module")
def cluster(module_processes, tiny_model, tmp_path_factory):
    engines = [module_processes.engine(), module_processes.engine()]
    request_log = tmp_path_factory.mktemp("skyrl") / "requests.jsonl"
    manager = module_processes.manager(
        engines=[{"url": engine.url, "engine_type": "builtin"} for engine in engines],
        tokenizer=str(tiny_model),
        request_log=str(request_log),
    )
    return manager, engines, request_log


def logged(request_log: Path, count: int) -> list[dict]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        lines = request_log.read_text().splitlines() if request_log.exists() else []
        if len(lines) >= count:
            return [json.loads(line) for line in lines]
        time.sleep(0.1)
    raise AssertionError(f"the request log holds {len(lines)} of {count} lines")


def test_generate_with_sessions_completion_detokenize_and_finish_session(cluster):
    manager, engines, request_log = cluster
    before = len(request_log.read_text().splitlines()) if request_log.exists() else 0
    batch = {
        "prompt_token_ids": PROMPTS,
        "sampling_params": skyrl_sampling(8, ignore_eos=True),
        "session_ids": SESSIONS,
    }
    completion = {
        "json": {
            "prompt": [41, 42, 43, 44, 45],
            "max_tokens": 4,
            "temperature": 0.0,
            "session_id": "trajectory-b",
        }
    }
    calls = [
        {"method": "generate", "args": [batch]},
        {"method": "completion", "args": [completion]},
        {"method": "detokenize", "args": [[[31, 32, 33]]]},
        *({"method": "finish_session", "args": [session]} for session in sorted(set(SESSIONS))),
    ]
    result = answer(skyrl(manager.url, [e.url for e in engines], calls))
    generated, completed, detokenized, *_ = result["results"]
    assert result["warnings"] == []  # finish_session answered 2xx for every session
    assert generated["stop_reasons"] == ["length"] * len(PROMPTS)
    for prompt, ids, logprobs in zip(
        PROMPTS, generated["response_ids"], generated["response_logprobs"], strict=True
    ):
        assert ids == greedy(engines[0].url, prompt, 8)
        assert len(logprobs) == len(ids) and all(lp <= 0.0 for lp in logprobs)
    # responses are the client's /detokenize calls: the manager's tokenizer decoding the same ids
    decoded = [
        http("POST", manager.url + "/detokenize", {"tokens": ids})[1]["prompt"]
        for ids in generated["response_ids"]
    ]
    assert generated["responses"] == decoded
    assert detokenized == [http("POST", manager.url + "/detokenize", {"tokens": [31, 32, 33]})[1]["prompt"]]
    assert completed["object"] == "text_completion" and completed["choices"][0]["finish_reason"] in (
        "length",
        "stop",
    )
    # a session's requests stay on one engine: a's two generates; b's generate and its completion
    # (each prompt has a length of its own, which names it in the request log)
    entries = logged(request_log, before + len(PROMPTS) + 1)[before:]
    engine_of = {}
    for entry in entries:
        (url,) = {span["engine_url"] for span in entry["spans"]}
        engine_of[entry["prompt_tokens"]] = url
    assert engine_of[3] == engine_of[2] and engine_of[4] == engine_of[5]


def test_finish_session_needs_a_session_and_tokenize_answers_vllms_shape(cluster):
    manager, _, _ = cluster
    status, body = http("POST", manager.url + "/finish_session")
    assert status == 400 and "session_id" in body["error"]["message"]
    status, body = http("POST", manager.url + "/finish_session?session_id=never-seen")
    assert (status, body) == (200, {"status": "ok", "session_id": "never-seen"})
    status, body = http("POST", manager.url + "/tokenize", {"prompt": "hello", "add_special_tokens": False})
    assert status == 200 and body["count"] == len(body["tokens"]) > 0 and body["token_strs"] is None
    status, body = http(
        "POST", manager.url + "/inference/v1/generate", {"token_ids": [], "sampling_params": {}}
    )
    assert status == 400 and "token_ids" in body["error"]["message"]
    status, body = http(
        "POST", manager.url + "/inference/v1/generate", {"token_ids": [1], "sampling_params": {"logprobs": 5}}
    )
    assert status == 400 and "logprobs" in body["error"]["message"]


def test_an_engine_killed_mid_batch_leaves_every_sample_with_its_greedy_tokens(cluster):
    manager, engines, _ = cluster
    max_tokens = 96
    prompts = [[50 + i, 60 + i, 70 + i] for i in range(8)]
    expected = [greedy(engines[1].url, prompt, max_tokens) for prompt in prompts]
    batch = {"prompt_token_ids": prompts, "sampling_params": skyrl_sampling(max_tokens, ignore_eos=True)}
    client = skyrl(manager.url, [e.url for e in engines], [{"method": "generate", "args": [batch]}])
    deadline = time.monotonic() + 120
    while True:  # kill engine 0 once it is streaming some of the batch
        loads = {
            w["worker"]: w["num_running_reqs"] for w in http("GET", manager.url + "/v1/loads")[1]["loads"]
        }
        if loads.get(engines[0].url, 0) > 0:
            break
        assert time.monotonic() < deadline and client.poll() is None, "the batch never reached engine 0"
        time.sleep(0.02)
    engines[0].kill()
    generated = answer(client)["results"][0]
    assert generated["response_ids"] == expected
    assert generated["stop_reasons"] == ["length"] * len(prompts)
    assert metric(manager, "rollflow_resumed_samples_total") > 0  # some went on elsewhere...
    assert metric(manager, "rollflow_regenerated_tokens_total") == 0  # ...from the tokens they had
