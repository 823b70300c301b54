"""A request that fails inside the built-in engine's generation thread ends alone.

The HTTP edge refuses every input it knows the model cannot take; these requests go to the
generation thread directly, as one the edge let through by mistake would, with the real tiny model.
"""

from __future__ import annotations

import queue

import pytest
from transformers import AutoModelForCausalLM

from rollflow.runtime.engines.base import EngineRejectedError
from rollflow.runtime.engines.builtin.sampling import SamplingOptions
from rollflow.runtime.engines.builtin.worker import GenerationWorker, Sequence, TokenEvent
from rollflow.runtime.engines.sglang import parse_sglang_event


def _finish(events: queue.SimpleQueue[TokenEvent]) -> tuple[list[int], dict]:
    tokens = []
    while True:
        event = events.get(timeout=60)
        if event.token_id is not None:
            tokens.append(event.token_id)
        if event.finish_reason is not None:
            return tokens, event.finish_reason


def test_a_request_that_raises_in_the_model_fails_alone_and_the_thread_serves_the_next(tiny_model):
    model = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    worker = GenerationWorker(model, eos_token_ids=set(), weight_version=0, seed=0)
    worker.start()
    try:
        poison: queue.SimpleQueue[TokenEvent] = queue.SimpleQueue()
        healthy: queue.SimpleQueue[TokenEvent] = queue.SimpleQueue()
        options = SamplingOptions(max_new_tokens=6, temperature=0.0)
        out_of_vocab = model.config.vocab_size + 7  # the embedding lookup raises on it
        worker.submit(Sequence("poison", [1, out_of_vocab], options, poison.put))
        worker.submit(Sequence("healthy", [1, 2, 3], options, healthy.put))

        tokens, finish = _finish(poison)
        assert tokens == [] and finish["type"] == "abort" and finish["status_code"] == 400
        assert "request failed in the engine" in finish["message"]
        tokens, finish = _finish(healthy)
        assert len(tokens) == 6 and finish["type"] == "length"
        assert worker.is_alive() and worker.num_running == 0
    finally:
        worker.stop()


def test_an_abort_with_a_4xx_status_code_mid_stream_is_a_request_error_for_the_client():
    """SGLang's FINISH_ABORT carries the status_code; a 4xx means the request, not the engine, failed."""
    meta = {"completion_tokens": 0, "output_token_logprobs": []}
    refused = {"type": "abort", "message": "bad input", "status_code": 400}
    with pytest.raises(EngineRejectedError, match="bad input"):
        parse_sglang_event({"meta_info": {**meta, "finish_reason": refused}}, 0)
    # a plain abort (the client's own, a drain) is still a finish, not an error
    chunk = parse_sglang_event({"meta_info": {**meta, "finish_reason": {"type": "abort"}}}, 0)
    assert chunk.finish_reason == "abort"
