"""slime against the manager: it registers engines with sgl-router's worker API, generates with its
default body, streams, aborts every worker as its `abort()` does and unregisters at shutdown.

The bodies are those of slime's `sglang_rollout.generate` (sampling params from its rollout
arguments, `return_logprob`, `input_ids`) and of its router and server-control helpers.
"""

from __future__ import annotations

import pytest

from tests.runtime.compat.clients import abort_until_idle, in_threads, sse_payloads, wait_running
from tests.runtime.manager.helpers import metric
from tests.runtime.processes import http

PROMPT = [11, 12, 13, 14]


def slime_sampling_params(max_new_tokens: int, top_p: float = 1.0) -> dict:
    """`GenerateState.sampling_params` with slime's rollout defaults (no stop strings or ids)."""
    params = {
        "temperature": 1.0,
        "top_p": top_p,
        "top_k": -1,
        "max_new_tokens": max_new_tokens,
        "stop": None,
        "stop_token_ids": None,
        "skip_special_tokens": True,
        "no_stop_trim": True,
        "spaces_between_special_tokens": False,
    }
    if top_p != 1.0:
        params["custom_params"] = {"return_top_p_token_ids": True}
    return params


def slime_generate_body(max_new_tokens: int, **params) -> dict:
    return {
        "sampling_params": slime_sampling_params(max_new_tokens) | params,
        "return_logprob": True,
        "input_ids": PROMPT,
    }


@pytest.fixture(scope="module")
def manager(cluster):
    """Engines registered as slime registers them, and unregistered as its shutdown does."""
    for url in cluster.engine_urls:
        status, answer = http(
            "POST", cluster.manager.url + "/workers", {"url": url, "worker_type": "regular"}
        )
        assert status in (200, 201, 202), answer
    yield cluster.manager
    for url in cluster.engine_urls:  # slime's unregister_worker: look the id up, then DELETE it
        listing = http("GET", cluster.manager.url + "/workers")[1]
        for worker in listing["workers"]:
            if worker["url"] == url:
                status, answer = http("DELETE", f"{cluster.manager.url}/workers/{worker['id']}")
                assert status == 200, answer
    assert http("GET", cluster.manager.url + "/workers")[1]["workers"] == []


def test_registration_lists_the_workers_with_the_fields_slime_reads(manager, cluster):
    listing = http("GET", manager.url + "/workers")[1]
    assert sorted(w["url"] for w in listing["workers"]) == sorted(cluster.engine_urls)
    assert all(w["worker_type"] == "regular" and w["is_healthy"] for w in listing["workers"])
    assert listing["total"] == 2


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_the_default_generate_body_is_served_with_tokens_logprobs_and_text(manager, top_p):
    body = slime_generate_body(16) | {"sampling_params": slime_sampling_params(16, top_p)}
    status, output = http("POST", manager.url + "/generate", body)
    assert status == 200, output
    meta = output["meta_info"]
    tokens = [item[1] for item in meta["output_token_logprobs"]]
    assert tokens == output["output_ids"] and 0 < len(tokens) <= 16
    assert all(item[0] <= 0 for item in meta["output_token_logprobs"])
    assert meta["finish_reason"]["type"] in ("stop", "length")
    # the manager has no tokenizer: the text is the engines', so slime's reward input is not empty
    assert output["text"], output


def test_streaming_generate_ends_with_the_whole_output(manager):
    payloads = sse_payloads(
        manager.url + "/generate", slime_generate_body(12, ignore_eos=True) | {"stream": True}
    )
    last = payloads[-1]
    assert len(last["output_ids"]) == 12 and last["meta_info"]["finish_reason"]["type"] == "length"
    assert [len(p["output_ids"]) for p in payloads] == sorted(len(p["output_ids"]) for p in payloads)


def test_abort_of_every_worker_ends_samples_with_their_partial_tokens_not_resumed(manager):
    """slime's `abort()`: abort_all to every worker GET /workers lists, then poll /v1/loads until
    idle; the in-flight requests come back aborted with what they had, and nothing resumes."""
    resumed_before = metric(manager, "rollflow_resumed_samples_total")
    body = slime_generate_body(1500, ignore_eos=True)
    threads = in_threads([lambda: http("POST", manager.url + "/generate", body, timeout=120)] * 4)
    wait_running(manager.url, 4)

    urls = [worker["url"] for worker in http("GET", manager.url + "/workers")[1]["workers"]]
    for url in urls:
        abort_until_idle(url)

    for thread in threads:
        thread.join(60)
        status, output = thread.result
        assert status == 200, output
        meta = output["meta_info"]
        assert meta["finish_reason"]["type"] == "abort", meta["finish_reason"]
        assert 0 < len(output["output_ids"]) < 1500
        assert len(meta["output_token_logprobs"]) == len(output["output_ids"])
        assert meta["resumes"] == 0
    assert metric(manager, "rollflow_resumed_samples_total") == resumed_before
    assert http("GET", manager.url + "/v1/loads")[1]["num_running_reqs"] == 0
    assert all(w["is_healthy"] for w in http("GET", manager.url + "/workers")[1]["workers"])
