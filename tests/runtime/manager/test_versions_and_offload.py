"""Weight versions pin samples; local engines hand their leftovers to remote ones after a budget."""

from __future__ import annotations

import threading

from rollflow.runtime.manager.client import ManagerClient
from tests.runtime.manager.helpers import assert_spans_tile_the_output, drain, metric, wait_until, workers


def test_an_on_policy_sample_waits_for_an_engine_on_its_version(processes):
    old = processes.engine(weight_version=3)
    new = processes.engine(weight_version=4)
    manager = processes.manager(engines=[{"url": old.url}])
    client = ManagerClient(manager.url)
    assert client.weight_versions() == {0: 3}
    batch = client.submit([[2, 7, 1]], n=1, max_new_tokens=150, temperature=0, ignore_eos=True)
    wait_until(lambda: workers(manager)[old.url]["tokens_generated"] > 3, what="tokens on version 3")
    client.add_worker(new.url)
    old.kill()
    wait_until(lambda: workers(manager)[old.url]["state"] == "failed", what="the old engine to be dropped")
    assert batch.status()["states"]["waiting"] == 1  # version 4 is the only engine: not eligible
    replacement = processes.engine(weight_version=3)
    client.add_worker(replacement.url)
    (sample,) = drain(batch)
    assert {span["weight_version"] for span in sample["spans"]} == {3}
    assert {span["engine_url"] for span in sample["spans"]} == {old.url, replacement.url}
    assert client.weight_versions() == {1: 4, 2: 3}


def test_an_off_policy_sample_continues_on_newer_weights_and_says_so(processes):
    old = processes.engine(weight_version=0)
    new = processes.engine(weight_version=1)
    manager = processes.manager(engines=[{"url": old.url}])
    client = ManagerClient(manager.url)
    batch = client.submit(
        [[5, 5, 5]], n=1, max_new_tokens=150, temperature=0, ignore_eos=True, allow_off_policy=True
    )
    wait_until(lambda: workers(manager)[old.url]["tokens_generated"] > 3, what="tokens on version 0")
    client.add_worker(new.url)
    old.kill()
    (sample,) = drain(batch)
    assert [span["weight_version"] for span in sample["spans"]] == [0, 1]
    assert_spans_tile_the_output(sample)


def test_local_leftovers_move_to_a_spot_engine_when_the_budget_expires(processes):
    local = processes.engine()
    spot = processes.engine()
    manager = processes.manager(
        offload={"enabled": True, "initial_budget_s": 1.0, "min_budget_s": 0.5},
        engines=[{"url": local.url, "kind": "local"}, {"url": spot.url, "kind": "spot", "capacity": 1}],
        router="least_outstanding",
    )
    client = ManagerClient(manager.url)
    batch = client.submit(
        [[3 + i, 1] for i in range(4)], n=1, max_new_tokens=300, temperature=0, ignore_eos=True
    )
    samples = []
    reader = threading.Thread(target=lambda: samples.extend(drain(batch)))
    reader.start()
    reader.join(timeout=300)
    moved = [
        s for s in samples if [span["engine_url"] for span in s["spans"]][:1] == [local.url] and s["resumes"]
    ]
    assert moved, "no sample moved from the local engine"
    for sample in moved:
        assert sample["spans"][-1]["engine_url"] == spot.url
        assert_spans_tile_the_output(sample)
    assert metric(manager, "rollflow_resumed_samples_total") >= len(moved)
    longer = client.report_step(step_time_s=10.0, bubble_s=5.0)
    assert longer > 1.0
