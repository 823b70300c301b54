"""Engines die mid-stream, again and again: every sample completes with exactly the tokens an
uninterrupted greedy run produces, and no generated token is thrown away."""

from __future__ import annotations

import threading

import pytest

from rollflow.runtime.manager.client import ManagerClient
from tests.runtime.manager.helpers import (
    assert_finished_as_undisturbed,
    greedy_reference,
    metric,
    prompts,
    wait_streaming,
    workers,
)

PROMPTS = prompts(8)
MAX_NEW_TOKENS = 200


def _kill_when_busy(engine, manager, min_tokens: int = 8) -> None:
    """kill -9 the engine once it is streaming samples and has sent some tokens."""
    wait_streaming(manager, engine, min_tokens)
    engine.kill()


@pytest.mark.usefixtures("both_manager_process_modes")
def test_kill_9_engines_mid_stream_loses_and_regenerates_nothing(processes):
    engines = [processes.engine() for _ in range(3)]
    joiner = processes.engine()  # started now, registered mid-batch
    manager = processes.manager(
        router="least_outstanding",
        engines=[{"url": e.url, "capacity": 2} for e in engines],
        health_interval_s=0.5,
    )
    client = ManagerClient(manager.url)
    batch = client.submit(PROMPTS, n=2, max_new_tokens=MAX_NEW_TOKENS, temperature=0, ignore_eos=True)

    collected: list[list[dict]] = []
    reader = threading.Thread(target=lambda: collected.extend(g for mb in batch.micro_batches() for g in mb))
    reader.start()
    _kill_when_busy(engines[0], manager)
    client.add_worker(joiner.url, kind="spot", capacity=2)
    _kill_when_busy(joiner, manager)
    _kill_when_busy(engines[1], manager)
    reader.join(timeout=300)
    assert not reader.is_alive()

    survivor = engines[2]
    samples = [sample for group in collected for sample in group]
    assert len(samples) == len(PROMPTS) * 2
    assert_finished_as_undisturbed(samples, survivor, MAX_NEW_TOKENS)
    assert all(sample["regenerated_tokens"] == 0 for sample in samples)
    resumed = [s for s in samples if s["resumes"] > 0]
    assert resumed, "no sample was running on a killed engine"
    assert all(len({span["engine_url"] for span in s["spans"]}) >= 2 for s in resumed)
    assert {span["engine_url"] for s in samples for span in s["spans"]} >= {engines[0].url, joiner.url}
    assert metric(manager, "rollflow_regenerated_tokens_total") == 0
    assert metric(manager, "rollflow_resumed_samples_total") == sum(s["resumes"] for s in samples)
    states = {w["url"]: w["state"] for w in workers(manager).values()}
    assert states[engines[0].url] == states[joiner.url] == states[engines[1].url] == "failed"


def test_restart_mode_counts_the_tokens_it_throws_away(processes):
    engines = [processes.engine() for _ in range(2)]
    manager = processes.manager(resume="restart", engines=[{"url": e.url, "capacity": 8} for e in engines])
    client = ManagerClient(manager.url)
    batch = client.submit(PROMPTS[:4], n=1, max_new_tokens=MAX_NEW_TOKENS, temperature=0, ignore_eos=True)
    collected: list[list[dict]] = []
    reader = threading.Thread(target=lambda: collected.extend(g for mb in batch.micro_batches() for g in mb))
    reader.start()
    _kill_when_busy(engines[0], manager, min_tokens=20)
    reader.join(timeout=300)
    samples = [sample for group in collected for sample in group]
    regenerated = sum(s["regenerated_tokens"] for s in samples)
    assert regenerated >= 1
    assert metric(manager, "rollflow_regenerated_tokens_total") == regenerated
    for sample in samples:
        assert sample["output_ids"] == greedy_reference(engines[1], sample["prompt_ids"], MAX_NEW_TOKENS)
