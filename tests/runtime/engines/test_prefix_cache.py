"""The built-in engine's prefix cache on a real tiny model: reused KV gives the logits of a full
prefill, lookups find the longest cached block prefix, eviction is least recently used."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from rollflow.runtime.engines.builtin.prefix_cache import PrefixCache
from tests.runtime.engines.processes import EngineProcess
from tests.runtime.processes import http

BLOCK = 4


def _prefill(model, token_ids, kv=None):
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([token_ids]), past_key_values=kv, use_cache=True)
    return out.logits[0, -1], out.past_key_values


def test_a_cached_prefix_gives_the_logits_of_a_full_prefill(tiny_model):
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    cache = PrefixCache(max_tokens=1000, block_size=BLOCK)
    first = list(range(10, 24))  # 14 tokens: 3 whole blocks are kept
    cache.insert(first, _prefill(model, first)[1])
    second = [*first[:10], 300, 301, 302, 303]
    reused, kv = cache.lookup(second)
    assert reused == 8  # the two whole blocks the prompts share
    logits, _ = _prefill(model, second[reused:], kv)
    full, _ = _prefill(model, second)
    # equal up to float32 rounding (attention over the prefix is summed in another order)
    assert torch.allclose(logits, full, atol=1e-4) and logits.argmax() == full.argmax()
    # the same prompt again: everything but its last token comes from the cache
    reused, kv = cache.lookup([*first[:12], 5])
    assert reused == 12
    assert cache.lookup([99] * 14) == (0, None)
    # a prompt that is all cached blocks: every token but the last comes from the cache
    assert cache.lookup(first[:12])[0] == 11


def test_the_least_recently_used_prefix_is_evicted_first(tiny_model):
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    cache = PrefixCache(max_tokens=16, block_size=BLOCK)
    prompts = {name: [start + i for i in range(9)] for name, start in (("a", 10), ("b", 50), ("c", 90))}
    cache.insert(prompts["a"], _prefill(model, prompts["a"])[1])  # 8 tokens kept
    cache.insert(prompts["b"], _prefill(model, prompts["b"])[1])  # 16: full
    assert cache.lookup(prompts["a"])[0] == 8  # a is now the most recently used
    cache.insert(prompts["c"], _prefill(model, prompts["c"])[1])  # evicts b, not a
    assert [cache.lookup(prompts[name])[0] for name in "abc"] == [8, 0, 8]
    assert cache.num_tokens == 16
    cache.clear()
    assert cache.lookup(prompts["a"]) == (0, None) and cache.num_tokens == 0


def test_the_engine_reuses_a_shared_prefix_with_the_outputs_of_no_cache(tiny_model):
    """A GRPO-like group (one prompt four times) and prompts sharing a system prefix, greedy, on an
    engine with the prefix cache and one without: the same tokens, fewer prompt tokens computed,
    and `meta_info.cached_tokens` saying how many came from the cache."""
    system = list(range(20, 52))  # 32 tokens every prompt starts with
    prompts = [[*system, 7, 8, 9]] * 4 + [[*system, 100 + i, 5] for i in range(3)]
    engines = {
        "cache": EngineProcess(tiny_model),
        "none": EngineProcess(tiny_model, "--prefix-cache-tokens", "0"),
    }
    try:
        answers, loads = {}, {}
        turns = {}  # an agent's two turns: the second resends the first's prompt and answer
        for name, engine in engines.items():
            answers[name] = [_generate(engine.url, prompt) for prompt in prompts]
            loads[name] = http("GET", engine.url + "/v1/loads")[1]["loads"][0]
            opening = [300 + i for i in range(20)]
            first = _generate(engine.url, opening, max_new_tokens=30)
            second = _generate(engine.url, [*opening, *first["output_ids"], 7, 8, 9])
            turns[name] = (first, second)
        # SGLang's /flush_cache empties the cache: the group's prompt is computed whole again
        assert http("POST", engines["cache"].url + "/flush_cache", {})[0] == 200
        after_flush = _generate(engines["cache"].url, prompts[0])
    finally:
        for engine in engines.values():
            engine.stop()
    assert [a["output_ids"] for a in answers["cache"]] == [a["output_ids"] for a in answers["none"]]
    cached = [a["meta_info"]["cached_tokens"] for a in answers["cache"]]
    assert cached == [0, 32, 32, 32, 32, 32, 32]  # whole 16-token blocks, the last token computed
    assert {a["meta_info"]["cached_tokens"] for a in answers["none"]} == {0}
    assert after_flush["meta_info"]["cached_tokens"] == 0
    # the answer's KV is kept too (as SGLang's radix cache keeps it): of the first turn's 20 + 30
    # tokens, the 49 whose KV was computed hold 3 whole blocks, where the prompt alone held 1
    assert [answer["output_ids"] for answer in turns["cache"]] == [a["output_ids"] for a in turns["none"]]
    assert turns["cache"][1]["meta_info"]["cached_tokens"] == 48
    assert after_flush["output_ids"] == answers["cache"][0]["output_ids"]
    total = sum(len(p) for p in prompts)
    assert loads["none"]["prefill_tokens_computed"] == total
    assert loads["cache"]["prefill_tokens_computed"] == total - sum(cached)
    assert loads["cache"]["cache_hit_rate"] == pytest.approx(sum(cached) / total, abs=1e-5)


def _generate(url: str, prompt: list[int], max_new_tokens: int = 12) -> dict:
    body = {
        "input_ids": prompt,
        "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True},
    }
    status, answer = http("POST", url + "/generate", body)
    assert status == 200, answer
    return answer
