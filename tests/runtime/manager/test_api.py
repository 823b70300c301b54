"""The manager's HTTP API as clients use it: SGLang's /generate, batches, micro-batches, bad input."""

from __future__ import annotations

import json
import threading
import urllib.request

import pytest

from rollflow.runtime.manager.client import ManagerClient, ManagerError
from rollflow.runtime.manager.config import EngineEntry
from rollflow.runtime.wire.base import SamplingParams
from tests.runtime.manager.helpers import finished, greedy_reference, metric, run_manager, workers
from tests.runtime.processes import http


@pytest.fixture(scope="module")
def fleet(module_processes):
    engines = [module_processes.engine() for _ in range(2)]
    manager = module_processes.manager(max_new_tokens_limit=4096, engines=[{"url": e.url} for e in engines])
    return manager, engines


def test_generate_answers_in_sglang_shape_with_spans(fleet):
    manager, engines = fleet
    body = {
        "input_ids": [3, 14, 15],
        "sampling_params": {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True},
        "return_logprob": True,
        "rid": "my-request",
    }
    status, answer = http("POST", manager.url + "/generate", body)
    assert status == 200, answer
    meta = answer["meta_info"]
    assert answer["output_ids"] == greedy_reference(engines[0], [3, 14, 15], 12)
    assert meta["id"] == "my-request" and meta["finish_reason"] == {"type": "length"}
    assert meta["prompt_tokens"] == 3 and meta["completion_tokens"] == 12
    assert [entry[1] for entry in meta["output_token_logprobs"]] == answer["output_ids"]
    assert all(entry[0] <= 0 for entry in meta["output_token_logprobs"])
    assert meta["spans"] == [{**meta["spans"][0], "start": 0, "end": 12}]
    assert meta["spans"][0]["engine_url"] in {e.url for e in engines}


def test_generate_streams_server_sent_events_until_done(fleet):
    manager, _ = fleet
    body = {
        "input_ids": [7, 8],
        "sampling_params": {"max_new_tokens": 20, "temperature": 0, "ignore_eos": True},
        "stream": True,
    }
    request = urllib.request.Request(manager.url + "/generate", data=json.dumps(body).encode(), method="POST")
    events = []
    with urllib.request.urlopen(request, timeout=60) as response:
        for line in response:
            if line.startswith(b"data: "):
                events.append(line[6:].strip())
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    lengths = [len(chunk["output_ids"]) for chunk in chunks]
    assert lengths == sorted(lengths) and lengths[-1] == 20 and len(chunks) >= 2
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length"}


def test_micro_batches_hold_whole_groups_and_respect_the_lower_bound(fleet):
    manager, _ = fleet
    client = ManagerClient(manager.url)
    batch = client.submit(
        [[i + 2, 5] for i in range(5)], n=3, max_new_tokens=8, temperature=1.0, sampling_seed=1
    )
    sizes = []
    for groups in batch.micro_batches(min_groups=2, max_groups=2):
        sizes.append(len(groups))
        for group in groups:
            assert len(group) == 3 and len({s["group_index"] for s in group}) == 1
            assert all(s["state"] == "finished" and len(s["output_ids"]) <= 8 for s in group)
    assert sum(sizes) == 5 and sizes[:2] == [2, 2]
    with pytest.raises(ManagerError, match="unknown batch id"):
        batch.status()  # an exhausted batch is forgotten


def test_flush_returns_what_is_ready_without_waiting(fleet):
    manager, _ = fleet
    client = ManagerClient(manager.url)
    batch = client.submit([[4, 4]], n=2, max_new_tokens=4, temperature=0)
    assert batch.micro_batches(min_groups=1, timeout_s=60).__next__()
    other = client.submit([[5, 5]], n=1, max_new_tokens=2000, temperature=0, ignore_eos=True)
    assert other.flush() == []  # nothing finished yet: flush does not block
    other.cancel()


def test_samples_stream_in_submission_order(fleet):
    manager, _ = fleet
    client = ManagerClient(manager.url)
    batch = client.submit([[9], [8, 8, 8]], n=2, max_new_tokens=6, temperature=0)
    with urllib.request.urlopen(
        manager.url + f"/batches/{batch.batch_id}/samples?order=submission", timeout=60
    ) as r:
        samples = [json.loads(line) for line in r]
    assert [s["sample_id"] for s in samples] == [
        f"{batch.batch_id}-{g}-{i}" for g in range(2) for i in range(2)
    ]


UNREACHABLE = "http://127.0.0.1:1"
BAD_WEIGHT_SOURCES = [
    ({"model_path": "/x", "weights_url": UNREACHABLE}, "give exactly one of model_path and weights_url"),
    ({}, "exactly one of model_path and weights_url"),
    ({"weights_url": UNREACHABLE, "codec": "delta+gzip"}, "codec: unknown codec 'delta+gzip'"),
    ({"model_path": "/x", "codec": "zstd"}, "codec applies to weights_url only"),
    ({"weights_url": UNREACHABLE, "transport": "nccl"}, "transport: Input should be 'http' or 'mooncake'"),
    ({"model_path": "/x", "transport": "mooncake"}, "transport applies to weights_url only"),
]
"""Weight sources the manager refuses with a 400, and what it says; each is sent to engine 0's
/update_weights with weight_version 1, so only the source keys differ from one case to the next."""


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("/generate", b"{not json", 400, "malformed JSON"),
        ("/generate", {"input_ids": [1], "temprature": 0}, 400, "unknown key"),
        (
            "/generate",
            {"input_ids": [1], "sampling_params": {"max_new_tokens": -3}},
            400,
            "sampling_params.max_new_tokens",
        ),
        (
            "/generate",
            {"input_ids": [1], "sampling_params": {"max_new_tokens": 10**9}},
            400,
            "max_new_tokens_limit",
        ),
        ("/generate", {"input_ids": []}, 400, "input_ids is empty"),
        (
            "/generate",
            {"input_ids": [1], "sampling_params": {"sampling_seed": 2**70}},
            400,
            "sampling_params.sampling_seed",
        ),
        (
            "/generate",
            b'{"input_ids": [1], "sampling_params": {"temperature": Infinity}}',
            400,
            "sampling_params.temperature",
        ),
        (
            "/batches",
            {"prompts": [[1]], "sampling_params": {"sampling_seed": 2**64}},
            400,
            "sampling_params.sampling_seed",
        ),
        ("/generate", {"text": "hello"}, 400, "tokenizer"),
        ("/batches", {"prompts": [[1], []], "n": 2}, 400, "prompts[1] is empty"),
        ("/batches", {"prompts": [[1]], "n": 0}, 400, "n: "),
        ("/workers", {"url": "not a url"}, 400, "url"),
        ("/workers", {"url": UNREACHABLE}, 400, "unreachable"),
        ("/batches/nope/next", {}, 404, "unknown batch id 'nope'"),
        (
            "/workers/99/update_weights",
            {"model_path": "/x", "weight_version": 1},
            404,
            "unknown or failed engine id 99",
        ),
        *[
            ("/workers/0/update_weights", {**source, "weight_version": 1}, 400, message)
            for source, message in BAD_WEIGHT_SOURCES
        ],
        (
            "/workers/0/resume",
            {"model_path": "/x", "weight_version": 1, "transport": "mooncake"},
            400,
            "transport applies to weights_url only",
        ),
    ],
)
def test_bad_input_gets_a_4xx_that_names_the_problem(fleet, path, body, status, message):
    manager, _ = fleet
    got, answer = http("POST", manager.url + path, body)
    assert got == status, answer
    assert message in answer["error"]["message"]


def test_bad_requests_do_not_disturb_accepted_work(fleet):
    manager, _ = fleet
    client = ManagerClient(manager.url)
    batch = client.submit([[1, 2, 3]], n=4, max_new_tokens=50, temperature=0, ignore_eos=True)
    errors = []
    spammer = threading.Thread(
        target=lambda: errors.extend(http("POST", manager.url + "/generate", b"]")[0] for _ in range(30))
    )
    spammer.start()
    samples = [s for mb in batch.micro_batches() for g in mb for s in g]
    spammer.join()
    assert set(errors) == {400}
    assert len(samples) == 4 and all(len(s["output_ids"]) == 50 for s in samples)
    status, _ = http("DELETE", manager.url + "/workers/1234")
    assert status == 404


def test_metrics_expose_prometheus_counters(fleet):
    manager, _ = fleet
    ManagerClient(manager.url).generate([1, 2], max_new_tokens=5, temperature=0, ignore_eos=True)
    _, text = http("GET", manager.url + "/metrics")
    for name in (
        "rollflow_resumed_samples_total",
        "rollflow_regenerated_tokens_total",
        "rollflow_queue_depth",
        "rollflow_engine_tokens_per_s",
        "rollflow_engine_failures_total",
    ):
        assert name in text
    assert metric(manager, "rollflow_generated_tokens_total") >= 5


def test_a_failing_router_is_overruled_and_counted_not_fatal(fleet):
    _, engines = fleet

    class BrokenRouter:
        name = "broken"

        def pick(self, request, view):
            raise IndexError("policy bug")

    async def run(manager) -> tuple[list, float]:
        for engine in engines:
            await manager.fleet.add_engine(EngineEntry(url=engine.url))
        batch = manager.submit_batch([[6, 6]] * 3, 1, SamplingParams(max_new_tokens=2, temperature=0))
        await finished(batch)
        return batch.samples, manager.metrics.router_errors._value.get()

    samples, errors = run_manager(run, router=BrokenRouter())
    assert [s.state.name for s in samples] == ["FINISHED"] * 3
    assert errors == 3


def test_rejected_requests_are_counted_by_status(fleet):
    manager, _ = fleet
    before = metric(manager, "rollflow_requests_rejected_total")
    assert http("POST", manager.url + "/generate", b"nope")[0] == 400
    assert http("GET", manager.url + "/batches/missing")[0] == 404
    assert metric(manager, "rollflow_requests_rejected_total") == before + 2


def test_a_temperature_that_once_killed_every_engine_is_served_and_every_engine_stays_healthy(fleet):
    """temperature 1e-38 overflowed the engine's logits and killed its generation thread; the
    manager then resumed the sample on the next engine, which died the same way."""
    manager, engines = fleet
    body = {"input_ids": [3, 4], "sampling_params": {"max_new_tokens": 4, "temperature": 1e-38}}
    status, answer = http("POST", manager.url + "/generate", body)
    assert status == 200 and len(answer["output_ids"]) == 4, answer
    for engine in engines:
        assert http("GET", engine.url + "/health")[0] == 200
    assert all(worker["state"] == "healthy" for worker in workers(manager).values())
    body["sampling_params"]["temperature"] = 0
    assert http("POST", manager.url + "/generate", body)[0] == 200
