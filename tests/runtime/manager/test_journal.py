"""The manager killed with SIGKILL mid-batch and started again on its journal loses nothing: every
sample finishes with the tokens of an undisturbed run, engines come back, the trainer's step goes on."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from rollflow.policy.offload import OffloadBalancer, StepReport
from rollflow.runtime.manager.client import ManagerClient, ManagerUnreachable
from rollflow.runtime.manager.config import OffloadSection
from tests.runtime.manager.helpers import (
    CountingProxy,
    assert_finished_as_undisturbed,
    greedy_reference,
    journaled_config,
    manager_on_journal,
    metric,
    prompts,
    settled,
    wait_until,
    workers,
)
from tests.runtime.processes import Process, http, start_manager

PROMPTS = prompts(4)
STREAMED_PROMPTS = [[60 + i, 9, 4 * i] for i in range(2)]
MAX_NEW_TOKENS = 96
MAX_UNFLUSHED = 24


def _restart(
    tmp_path: Path, manager: Process, config: dict, proxies: list[CountingProxy]
) -> tuple[Process, int]:
    """kill -9 the manager and start it again, with the same config, on the same port; returns it and
    the tokens the dead one had received (its streams held first, so that none is on its way)."""
    for proxy in proxies:
        proxy.flowing.clear()
    received = settled(lambda: metric(manager, "rollflow_generated_tokens_total"))
    manager.kill()
    manager.stop()
    for proxy in proxies:
        proxy.flowing.set()
    return manager_on_journal(tmp_path, config, manager.port), int(received)


def _running_tokens(manager: Process) -> int:
    return sum(w["tokens_generated"] for w in workers(manager).values())


@pytest.mark.usefixtures("both_manager_process_modes")
def test_manager_killed_twice_mid_batch_finishes_every_sample_exactly(processes, tmp_path):
    engines = [processes.engine() for _ in range(2)]
    proxies = [CountingProxy(engine.url) for engine in engines]
    config = {
        "engines": [{"url": p.url, "engine_type": "builtin", "capacity": 4} for p in proxies],
        "journal": str(tmp_path / "manager.journal"),
        # commits come only from the bound (and from stream lines: ManagerClient keeps its hand-outs), so
        # it is tested
        "journal_flush_interval_ms": 60_000,
        "journal_max_unflushed_tokens": MAX_UNFLUSHED,
        "health_interval_s": 0.5,
    }
    manager = start_manager(tmp_path, config)
    client = ManagerClient(manager.url, reconnect_s=120)
    batch = client.submit(PROMPTS, n=2, max_new_tokens=MAX_NEW_TOKENS, temperature=0, ignore_eos=True)
    streamed_batch = client.submit(
        STREAMED_PROMPTS, n=2, max_new_tokens=MAX_NEW_TOKENS, temperature=0, ignore_eos=True
    )

    received: list[list[dict]] = []  # a trainer's loop: one group per micro-batch, as they come
    streamed: list[dict] = []  # a reader of the sample stream, line by line
    readers = [
        threading.Thread(
            target=lambda: received.extend(mb for mb in batch.micro_batches(min_groups=1, max_groups=1))
        ),
        threading.Thread(target=lambda: streamed.extend(streamed_batch.samples())),
    ]
    for reader in readers:
        reader.start()
    received_tokens = 0  # by the manager, over its three lives
    try:
        for kill in range(2):
            wait_until(lambda m=manager: _running_tokens(m) >= 40, what=f"tokens before kill {kill + 1}")
            manager, life_tokens = _restart(tmp_path, manager, config, proxies)
            received_tokens += life_tokens
        for reader in readers:
            reader.join(timeout=300)
            assert not reader.is_alive(), "a reader did not end"
        received_tokens += int(metric(manager, "rollflow_generated_tokens_total"))
    finally:
        manager.stop()
        for proxy in proxies:
            proxy.stop()

    groups = [group for micro_batch in received for group in micro_batch]
    assert sorted(group[0]["group_index"] for group in groups) == list(range(len(PROMPTS)))  # each once
    assert sorted(s["sample_id"] for s in streamed) == [
        f"{streamed_batch.batch_id}-{g}-{i}" for g in range(len(STREAMED_PROMPTS)) for i in range(2)
    ]  # every line once: the stream went on after the lines it had
    samples = [sample for group in groups for sample in group] + streamed
    assert len(samples) == (len(PROMPTS) + len(STREAMED_PROMPTS)) * 2
    assert_finished_as_undisturbed(samples, engines[0], MAX_NEW_TOKENS)
    assert all(sample["regenerated_tokens"] == 0 for sample in samples)
    assert any(sample["resumes"] > 0 for sample in samples), "no sample was running at a kill"
    # the requests the dead manager left running were aborted on their engines by the next one
    aborted = [rid for proxy in proxies for rid in proxy.aborted]
    ids = {sample["sample_id"] for sample in samples}
    assert aborted and all(rid.split(".")[0] in ids for rid in aborted), aborted
    kept = sum(len(sample["output_ids"]) for sample in samples)
    lost = received_tokens - kept  # received by a manager, not journaled before it was killed
    # per kill: the journal's bound, plus a chunk per stream that passed the check as it was reached
    bound = 2 * (MAX_UNFLUSHED + len(samples))
    generated = sum(proxy.relayed for proxy in proxies)
    print(
        f"\ntokens regenerated after 2 kills: {lost} received and lost (bound {bound}); "
        f"{generated - kept} in all, counting those on their way; {kept} kept"
    )
    assert 0 <= lost <= bound


def test_engines_deletions_and_a_torn_journal_survive_a_restart(processes, tmp_path):
    engine = processes.engine()
    config = {
        "journal": str(tmp_path / "manager.journal"),
        "journal_flush_interval_ms": 20,
        "offload": {"enabled": True},
    }
    manager = processes.manager(**config)
    client = ManagerClient(manager.url)
    joined = client.add_worker(engine.url, kind="spot", engine_type="builtin", capacity=3)
    deleted = client.submit([[1, 2, 3]], n=2, max_new_tokens=400, temperature=0, ignore_eos=True)
    deleted.cancel()
    wait_until(lambda: workers(manager)[engine.url]["running"] == 0, what="the deleted batch to stop")
    kept = client.submit([[4, 5, 6]], n=1, max_new_tokens=8, temperature=0, ignore_eos=True)
    wait_until(lambda: kept.status()["states"]["finished"] == 1, what="the kept batch to finish")
    wait_until(lambda: _wal(config).stat().st_size > 0, what="the journal's WAL")
    client.report_step(2.0, 0.5)  # the offload balancer adapts; journaled
    threading.Event().wait(0.3)  # the last commits are in
    client.report_step(3.0, 1.5)  # the last transaction: torn below, so it is lost
    threading.Event().wait(0.3)
    manager.kill()
    wal = _wal(config)
    wal.write_bytes(wal.read_bytes()[:-100])  # power lost mid-write: the last frame is cut short

    manager = manager_on_journal(tmp_path, config, manager.port)
    try:
        back = workers(manager)[engine.url]
        assert (back["state"], back["kind"], back["capacity"]) == ("healthy", "spot", 3)
        assert back["id"] > joined["id"]  # ids are never reused, across restarts too
        assert http("GET", f"{manager.url}/batches/{deleted.batch_id}")[0] == 404
        (group,) = next(kept.micro_batches())
        assert group[0]["output_ids"] == greedy_reference(engine, [4, 5, 6], 8)
        # the torn transaction, and only it, is gone: the balancer is as after the first report
        steps, last = client.last_step_report()
        assert (steps, last["step_time_s"], last["bubble_s"]) == (1, 2.0, 0.5)
        balancer = OffloadBalancer(OffloadSection(enabled=True).settings())
        balancer.update(StepReport(2.0, 0.5))
        assert client.report_step(2.0, 0.2) == pytest.approx(balancer.update(StepReport(2.0, 0.2)))
    finally:
        manager.stop()


def test_a_hand_out_not_yet_journaled_is_taken_from_the_client_and_not_handed_out_twice(processes, tmp_path):
    engine = processes.engine()
    # nothing commits on its own: only what a stream line or a hand-out without `received` waits for
    config = journaled_config([engine.url], tmp_path)
    manager = start_manager(tmp_path, config)
    client = ManagerClient(manager.url, reconnect_s=120)
    kept = client.submit([[4, 5, 6], [7, 8, 9]], n=2, max_new_tokens=6, temperature=0, ignore_eos=True)
    raw = client.submit([[1, 2, 3], [3, 2, 1]], n=2, max_new_tokens=6, temperature=0, ignore_eos=True)
    for batch in (kept, raw):
        assert len(list(batch.samples())) == 4  # every sample finished, and committed before the lines
    # a client that sends no `received` (curl): its micro-batch is journaled before it is answered
    status, answer = http(
        "POST", f"{raw.client.url}/batches/{raw.batch_id}/next", {"max_groups": 1, "micro_batch": 0}
    )
    assert status == 200, answer
    # the client keeps its hand-outs: micro-batch 0 is answered before it is journaled
    # (after the one above, whose commit would take it along)
    micro_batches = kept.micro_batches(min_groups=1, max_groups=1)
    (first,) = next(micro_batches)
    manager.kill()
    manager.stop()

    manager = manager_on_journal(tmp_path, config, manager.port)
    try:
        (second,) = next(micro_batches)  # micro-batch 1, from the restarted manager
        assert {first[0]["group_index"], second[0]["group_index"]} == {0, 1}  # each group once
        assert next(micro_batches, None) is None  # exhausted: nothing handed out twice
        assert "1 micro-batches the client holds were handed out before a restart" in manager.log()
        again = http(
            "POST", f"{manager.url}/batches/{raw.batch_id}/next", {"max_groups": 1, "micro_batch": 0}
        )
        assert again == (200, answer)  # journaled before it was answered: the same groups again
        status, conflict = http(
            "POST", f"{manager.url}/batches/{raw.batch_id}/next", {"micro_batch": 1, "received": [[5]]}
        )
        assert status == 409 and "does not match the micro-batches" in conflict["error"]["message"]
    finally:
        manager.stop()


def _wal(config: dict) -> Path:
    return Path(config["journal"] + "-wal")


def test_a_journal_of_another_config_is_refused_naming_it(processes, tmp_path):
    journal = str(tmp_path / "manager.journal")
    manager = processes.manager(journal=journal, router="least_outstanding")
    manager.stop()
    refused = manager_on_journal(
        tmp_path, {"journal": journal, "router": "round_robin"}, manager.port, wait=False
    )
    assert refused.proc.wait(timeout=60) == 2
    assert f"journal {journal} was written by a manager with another config (differs in: router)" in (
        refused.log()
    )


def test_repeated_calls_find_what_they_made_and_a_manager_gone_for_good_is_named(processes):
    manager = processes.manager()
    body = {"batch_id": "step1", "prompts": [[1, 2]], "n": 2}
    first, again = (http("POST", manager.url + "/batches", body) for _ in range(2))
    assert (first[0], again[0]) == (201, 200) and first[1] == again[1]
    status, answer = http("POST", manager.url + "/batches/step1/next", {"micro_batch": 1, "timeout_s": 0})
    assert status == 409 and "micro_batch 1 asked, but only 0 were handed out" in answer["error"]["message"]

    client = ManagerClient(manager.url, reconnect_s=1)
    assert client.workers() == []
    manager.kill()
    with pytest.raises(ManagerUnreachable, match=r"did not come back within 1s \(reconnect_s\)"):
        client.workers()
    with pytest.raises(ManagerUnreachable, match="cannot reach the manager"):  # never reached: at once
        ManagerClient(manager.url, reconnect_s=60).workers()
