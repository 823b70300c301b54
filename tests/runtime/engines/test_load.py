"""Engines' load reports: the built-in engine's queue as SGLang reports one, and the parsers of
SGLang's and vLLM's shapes."""

from __future__ import annotations

import asyncio

import pytest

from rollflow.runtime.engines.load import parse_sglang_get_load, parse_sglang_loads, parse_vllm_metrics
from rollflow.runtime.engines.sglang import BuiltinEngineClient
from tests.runtime.engines.helpers import PROMPT, collect, greedy, run
from tests.runtime.engines.processes import EngineProcess
from tests.runtime.processes import http


def test_the_builtin_engine_queues_past_max_running_requests_and_reports_it(tiny_model):
    engine = EngineProcess(tiny_model, "--max-running-requests", "2")

    async def go():
        client = BuiltinEngineClient(engine.url)
        try:
            streams = [asyncio.ensure_future(collect(client, f"r{i}", PROMPT, greedy(120))) for i in range(3)]
            counts, old_shape = set(), None
            while not all(stream.done() for stream in streams):
                load = await client.load()
                counts.add((load.num_running, load.num_queued))
                if load.num_queued and old_shape is None:
                    old_shape = parse_sglang_get_load(await client.get_json("/get_load"))
                await asyncio.sleep(0.01)
            return counts, old_shape, [stream.result() for stream in streams], await client.load()
        finally:
            await client.close()

    try:
        counts, old_shape, outputs, idle = run(go())
    finally:
        engine.stop()
    assert (2, 1) in counts  # two decoding, the third waiting its turn
    assert max(running for running, _ in counts) == 2
    assert old_shape.num_running + old_shape.num_queued == 3 and old_shape.kv_usage is None
    # the waiting request was served once a place freed: every request got its whole output
    assert [(len(o.token_ids), o.finish_reason) for o in outputs] == [(120, "length")] * 3
    assert (idle.num_running, idle.num_queued, idle.kv_usage) == (0, 0, 0.0)


def test_an_engine_reports_its_kv_in_use_while_it_decodes(engine):
    async def go():
        client = BuiltinEngineClient(engine.url)
        try:
            stream = asyncio.ensure_future(collect(client, "kv", PROMPT, greedy(200)))
            usage = 0.0
            while not stream.done() and usage == 0.0:
                usage = (await client.load()).kv_usage
                await asyncio.sleep(0.01)
            await stream
            return usage
        finally:
            await client.close()

    assert 0 < run(go()) < 1
    status, body = http("GET", engine.url + "/v1/loads")
    assert status == 200 and body["loads"][0]["max_total_num_tokens"] > 0


def test_sglang_loads_sum_ranks_and_take_kv_as_used_over_total_tokens():
    body = {
        "dp_rank_count": 2,
        "loads": [
            {"dp_rank": 0, "num_running_reqs": 3, "num_waiting_reqs": 1, "num_used_tokens": 300,
             "max_total_num_tokens": 1000, "token_usage": 0.3, "cache_hit_rate": 0.5},
            {"dp_rank": 1, "num_running_reqs": 2, "num_waiting_reqs": 4, "num_used_tokens": 100,
             "max_total_num_tokens": 1000, "token_usage": 0.1, "cache_hit_rate": 0.25},
        ],
    }  # fmt: skip
    load = parse_sglang_loads(body)
    assert (load.num_running, load.num_queued, load.kv_usage, load.prefix_hit_rate) == (5, 5, 0.2, 0.375)
    for rank in body["loads"]:
        del rank["cache_hit_rate"]
    assert parse_sglang_loads(body).prefix_hit_rate is None
    old = parse_sglang_get_load([{"dp_rank": 0, "num_reqs": 7, "num_waiting_reqs": 2, "num_tokens": 90}])
    assert (old.num_running, old.num_queued, old.kv_usage) == (5, 2, None)


VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 3.0
vllm:num_requests_running{engine="1",model_name="tiny"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 2.0
vllm:num_requests_waiting{engine="1",model_name="tiny"} 0.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny",reason="capacity"} 9.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="tiny"} 0.25
vllm:prompt_tokens_total{engine="0",model_name="tiny"} 1234.0
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 300.0
vllm:prefix_cache_queries_total{engine="1",model_name="tiny"} 100.0
vllm:prefix_cache_queries_created{engine="0",model_name="tiny"} 1.7e9
vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 96.0
vllm:prefix_cache_hits_total{engine="1",model_name="tiny"} 4.0
"""


def test_vllm_gauges_sum_over_engines_kv_use_is_their_mean_and_prefix_hits_their_share():
    load = parse_vllm_metrics(VLLM_METRICS)
    assert (load.num_running, load.num_queued, load.kv_usage) == (4, 2, 0.375)
    assert load.prefix_hit_rate == 0.25  # 100 cached of 400 prompt tokens looked up, both engines
    older = parse_vllm_metrics(
        "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\nvllm:gpu_cache_usage_perc 0.125\n"
    )
    assert (older.num_running, older.num_queued, older.kv_usage) == (1, 0, 0.125)
    assert older.prefix_hit_rate is None  # no prefix cache counters


@pytest.mark.parametrize(
    ("parse", "body", "problem"),
    [
        (parse_sglang_loads, {"loads": "none"}, "'loads' list"),
        (parse_sglang_loads, {"loads": [{"num_running_reqs": -1}]}, "num_running_reqs"),
        (parse_sglang_get_load, [{"num_reqs": "three"}], "num_reqs"),
        (parse_vllm_metrics, "vllm:other 1\n", "no vllm:num_requests_running"),
        (parse_vllm_metrics, 'vllm:num_requests_running{a="b"} many\n', "unreadable"),
    ],
)
def test_a_load_report_of_the_wrong_shape_is_an_error_naming_it(parse, body, problem):
    with pytest.raises(ValueError, match=problem):
        parse(body)
