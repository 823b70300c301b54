"""`processes: N`: the engines' token streams read by N - 1 stream processes. Samples come out as
one process makes them, and a stream process or an engine killed mid-batch loses no sample."""

from __future__ import annotations

import json
import os
import signal
import urllib.request

from rollflow.runtime.manager.client import ManagerClient
from tests.runtime.manager.helpers import (
    assert_finished_as_undisturbed,
    drain,
    greedy_reference,
    metric,
    prompts,
    stream_processes,
    wait_until,
    workers,
)

PROMPTS = prompts(6)


def _streamed_generate(manager, prompt: list[int], max_new_tokens: int) -> list[dict]:
    body = {
        "input_ids": prompt,
        "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True},
        "stream": True,
        "return_logprob": True,
    }
    request = urllib.request.Request(manager.url + "/generate", json.dumps(body).encode(), method="POST")
    events = []
    with urllib.request.urlopen(request, timeout=120) as response:
        for line in response:
            if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                events.append(json.loads(line[6:]))
    return events


def test_samples_read_by_stream_processes_equal_one_engines_greedy_output(processes):
    engines = [processes.engine() for _ in range(2)]
    manager = processes.manager(processes=3, engines=[{"url": e.url, "capacity": 4} for e in engines])
    assert len(stream_processes(manager)) == 2
    assert metric(manager, "rollflow_stream_processes") == 2
    batch = ManagerClient(manager.url).submit(PROMPTS, n=2, max_new_tokens=48, temperature=0, ignore_eos=True)
    samples = drain(batch)
    assert len(samples) == len(PROMPTS) * 2
    assert_finished_as_undisturbed(samples, engines[0], 48)
    # a client's stream: events as the stream processes send them, the last one holding every token
    events = _streamed_generate(manager, PROMPTS[0], 40)
    assert events[-1]["output_ids"] == greedy_reference(engines[1], PROMPTS[0], 40)
    assert events[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert len(events[-1]["meta_info"]["output_token_logprobs"]) == 40


def test_a_stream_process_killed_mid_batch_loses_no_sample(processes):
    engines = [processes.engine() for _ in range(2)]
    manager = processes.manager(processes=2, engines=[{"url": e.url, "capacity": 8} for e in engines])
    (child,) = stream_processes(manager)
    batch = ManagerClient(manager.url).submit(
        PROMPTS, n=2, max_new_tokens=160, temperature=0, ignore_eos=True
    )
    wait_until(
        lambda: sum(w["tokens_generated"] for w in workers(manager).values()) >= 40, what="tokens streamed"
    )
    os.kill(child, signal.SIGKILL)
    samples = drain(batch)
    assert_finished_as_undisturbed(samples, engines[0], 160)
    assert metric(manager, 'rollflow_resumed_samples_total{reason="stream_process_lost"}') >= 1
    # the engines were not at fault: both still serve, and a new stream process took the old one's place
    assert all(w["state"] == "healthy" for w in workers(manager).values())
    replacement = wait_until(
        lambda: [p for p in stream_processes(manager) if p != child], what="a new process"
    )
    assert len(replacement) == 1


def test_an_engine_killed_mid_batch_resumes_its_samples_with_nothing_regenerated(processes):
    engines = [processes.engine() for _ in range(2)]
    manager = processes.manager(
        processes=2, health_interval_s=0.5, engines=[{"url": e.url, "capacity": 8} for e in engines]
    )
    batch = ManagerClient(manager.url).submit(
        PROMPTS, n=2, max_new_tokens=160, temperature=0, ignore_eos=True
    )
    wait_until(
        lambda: workers(manager)[engines[0].url]["tokens_generated"] >= 20, what="tokens from engine 0"
    )
    engines[0].kill()
    samples = drain(batch)
    assert_finished_as_undisturbed(samples, engines[1], 160)
    assert metric(manager, "rollflow_resumed_samples_total") >= 1
    assert metric(manager, "rollflow_regenerated_tokens_total") == 0
