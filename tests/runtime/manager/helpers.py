"""Small readers of the manager's API shared by the manager tests."""

from __future__ import annotations

import time

from tests.runtime.processes import http


def wait_until(condition, timeout: float = 60.0, interval: float = 0.02, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def workers(manager) -> dict[str, dict]:
    """Engine url -> its record on the manager."""
    return {w["url"]: w for w in http("GET", manager.url + "/workers")[1]["workers"]}


def metric(manager, name: str) -> float:
    """Sum of a Prometheus metric over its labels."""
    _, text = http("GET", manager.url + "/metrics")
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (line[len(name)] in " {"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def greedy_reference(engine, prompt: list[int], max_new_tokens: int) -> list[int]:
    """What one engine generates for `prompt` uninterrupted, at temperature 0."""
    status, body = http(
        "POST",
        engine.url + "/generate",
        {
            "input_ids": prompt,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True},
        },
    )
    assert status == 200, body
    return body["output_ids"]


def assert_spans_tile_the_output(sample: dict) -> None:
    """Spans cover [0, len(output)) in order with no gap and no overlap."""
    position = 0
    for span in sample["spans"]:
        assert span["start"] == position, sample["spans"]
        assert span["end"] > span["start"]
        position = span["end"]
    assert position == len(sample["output_ids"]) == len(sample["output_logprobs"])


def drain(batch, timeout_s: float = 240.0) -> list[dict]:
    """Every sample of a batch, failing (not hanging) if nothing finishes for `timeout_s`."""
    samples = []
    for micro_batch in batch.micro_batches(timeout_s=timeout_s):
        if not micro_batch:
            raise AssertionError(f"no group finished in {timeout_s}s; batch status: {batch.status()}")
        samples.extend(sample for group in micro_batch for sample in group)
    return samples
