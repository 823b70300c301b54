"""The built-in engine's generation thread in-process: an error one request causes ends only it."""

from __future__ import annotations

import queue

from rollflow.runtime.engines.builtin.sampling import SamplingOptions
from rollflow.runtime.engines.builtin.worker import GenerationWorker, Sequence, TokenEvent
from tests.runtime.engines.helpers import PROMPT


def _finish(events: queue.SimpleQueue[TokenEvent]) -> TokenEvent:
    while True:
        event = events.get(timeout=60)
        if event.finish_reason is not None:
            return event


def test_a_request_that_raises_in_the_sampler_ends_alone_and_the_thread_serves_the_next(tiny_model):
    # A nan temperature passes no HTTP edge (the body model refuses it); here it reaches the sampler
    # directly, where torch.multinomial raises on nan probabilities, as 1e-38 once did.
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    worker = GenerationWorker(model, eos_token_ids=set(), weight_version=0, seed=0)
    worker.start()
    try:
        poison: queue.SimpleQueue[TokenEvent] = queue.SimpleQueue()
        good: queue.SimpleQueue[TokenEvent] = queue.SimpleQueue()
        worker.submit(
            Sequence("poison", list(PROMPT), SamplingOptions(4, temperature=float("nan")), poison.put)
        )
        worker.submit(Sequence("good", list(PROMPT), SamplingOptions(4, temperature=0.0), good.put))
        failed, served = _finish(poison), _finish(good)
        assert failed.finish_reason["type"] == "abort"
        assert "request failed in the engine" in failed.finish_reason["message"]
        assert served.finish_reason == {"type": "length", "length": 4}
        assert worker.is_alive() and worker.num_running == 0
    finally:
        worker.stop()
