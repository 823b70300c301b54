"""The real sgl-router (the `sglang-router` package) in front of built-in engines: it forwards
`/generate` with the fields it adds (`model`, `log_metrics`, `return_hidden_states`, `background`,
`no_logs`, `return_bytes`, `return_entropy`, ...), which the engine accepts at their neutral values.
And engines started alike sample differently: each draws its own seed unless one is given.
"""

from __future__ import annotations

import sys
import time

import pytest

from tests.runtime.compat.clients import sse_payloads
from tests.runtime.processes import Process, free_port, http

pytest.importorskip("sglang_router")


@pytest.fixture(scope="module")
def router(cluster, tmp_path_factory):
    port = free_port()
    argv = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--worker-urls", *cluster.engine_urls, "--policy", "round_robin", "--log-level", "warn"]
    argv += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
    process = Process(argv, port, tmp_path_factory.mktemp("router") / "router.log", wait=False)
    deadline = time.monotonic() + 120
    while True:  # the router registers its workers in the background once it listens
        try:
            workers = http("GET", process.url + "/workers", timeout=2)[1]["workers"]
            if len(workers) == 2 and all(w["is_healthy"] for w in workers):
                break
        except (OSError, KeyError, TypeError):
            pass
        assert process.proc.poll() is None and time.monotonic() < deadline, process.log()
        time.sleep(0.2)
    yield process
    process.stop()


def test_generate_through_sgl_router_reaches_the_engines(router):
    body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 6, "ignore_eos": True}}
    for _ in range(2):  # round robin: both engines answer
        status, output = http("POST", router.url + "/generate", body | {"return_logprob": True})
        assert status == 200, output
        assert len(output["output_ids"]) == 6 and output["meta_info"]["finish_reason"]["type"] == "length"
        assert len(output["meta_info"]["output_token_logprobs"]) == 6


def test_streaming_through_sgl_router(router):
    body = {
        "input_ids": [5, 6, 7],
        "sampling_params": {"max_new_tokens": 5, "ignore_eos": True},
        "stream": True,
    }
    payloads = sse_payloads(router.url + "/generate", body)
    assert (
        len(payloads[-1]["output_ids"]) == 5
        and payloads[-1]["meta_info"]["finish_reason"]["type"] == "length"
    )


def test_two_engines_return_different_samples_for_the_same_prompt_at_temperature_1(cluster):
    body = {
        "input_ids": [9, 10, 11],
        "sampling_params": {"max_new_tokens": 24, "temperature": 1.0, "ignore_eos": True},
    }
    outputs = [http("POST", url + "/generate", body)[1]["output_ids"] for url in cluster.engine_urls]
    assert outputs[0] != outputs[1]
    seeded = body | {"sampling_params": body["sampling_params"] | {"sampling_seed": 1234}}
    same = [http("POST", url + "/generate", seeded)[1]["output_ids"] for url in cluster.engine_urls]
    assert same[0] == same[1]  # a given seed is honoured alike everywhere
