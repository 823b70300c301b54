"""A request that fails inside the built-in engine's generation thread ends alone.

The HTTP edge refuses every input it knows the model cannot take; these requests go to the
generation thread directly, as one the edge let through by mistake would, with the real tiny model.
"""

from __future__ import annotations

import queue

from transformers import AutoModelForCausalLM

from rollflow.runtime.engines.builtin.worker import GenerationWorker, Sequence, TokenEvent
from rollflow.runtime.wire.base import SamplingParams


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
        options = SamplingParams(max_new_tokens=6, temperature=0.0)
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
