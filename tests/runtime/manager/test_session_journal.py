"""Sessions survive the manager's SIGKILL on its journal: their contexts come back, the next turn
continues them with the tokens of an undisturbed run, a turn cut off mid-way finishes from its
journaled tokens and is answered once to its caller sending it again, a closed session stays closed."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from rollflow.runtime.manager.client import ManagerClient, ManagerError, ManagerUnreachable
from tests.runtime.conftest import ProcessFactory
from tests.runtime.manager.helpers import (
    CountingProxy,
    greedy_reference,
    journaled_config,
    manager_on_journal,
    metric,
    settled,
    wait_until,
    workers,
)
from tests.runtime.processes import Process, http, start_manager

PROMPT = [3 + 7 * i % 50 for i in range(20)]
ENV_TOKENS = [[60 + turn, 61 + turn, 62 + turn] for turn in range(3)]
SAMPLING = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
LONG_TURN = 240  # long enough to be cut off mid-way however fast the engine
MAX_UNFLUSHED = 24


def _journaled_manager(
    processes: ProcessFactory, tmp_path: Path, engine_url: str
) -> tuple[dict, Process, ManagerClient]:
    """(its config, a manager journaling to `tmp_path`, a client that waits out its restarts); the
    manager, like each one `_restarted` starts, is stopped with the test's `processes`."""
    # nothing commits on its own: only the token bound, and what a session's caller is answered
    config = journaled_config([engine_url], tmp_path, MAX_UNFLUSHED, health_interval_s=0.5)
    manager = start_manager(tmp_path, config)
    processes.started.append(manager)
    return config, manager, ManagerClient(manager.url, reconnect_s=120)


def _turns(client: ManagerClient, session_id: str, turns: range) -> list[list[int]]:
    return [
        client.send_turn(session_id, PROMPT if turn == 0 else ENV_TOKENS[turn], **SAMPLING)["output_ids"]
        for turn in turns
    ]


def _restarted(processes: ProcessFactory, tmp_path: Path, manager: Process, config: dict) -> Process:
    """`manager`, gone (killed or stopped), started again on its journal and port."""
    restarted = manager_on_journal(tmp_path, config, manager.port)
    processes.started.append(restarted)
    return restarted


def _kill_and_restart(processes: ProcessFactory, tmp_path: Path, manager: Process, config: dict) -> Process:
    manager.kill()
    manager.stop()
    return _restarted(processes, tmp_path, manager, config)


def test_sessions_come_back_with_their_context_and_go_on_as_if_undisturbed(processes, tmp_path):
    engine = processes.engine()
    config, manager, client = _journaled_manager(processes, tmp_path, engine.url)
    undisturbed = client.open_session()
    reference = _turns(client, undisturbed, range(3))
    reference_record = client.session(undisturbed)

    session_id = client.open_session()
    before = _turns(client, session_id, range(2))
    record_before = client.session(session_id)
    closed = client.open_session()
    _turns(client, closed, range(1))
    client.close_session(closed)
    empty = client.open_session(session_id="empty.1")  # opened, no turn yet
    manager = _kill_and_restart(processes, tmp_path, manager, config)
    assert client.session(session_id) == record_before  # the whole context, spans and all
    after = _turns(client, session_id, range(2, 3))  # the same client, across the restart
    assert before + after == reference
    record = client.session(session_id)
    assert record["context_ids"] == reference_record["context_ids"]
    assert record["loss_mask"] == reference_record["loss_mask"]
    assert [s["role"] for s in record["segments"]] == [s["role"] for s in reference_record["segments"]]
    assert len(record["turns"]) == 3 and record["state"] == "open"

    # a closed session stays closed
    assert client.session(closed)["state"] == "closed"
    status, answer = http("POST", f"{manager.url}/v1/sessions/{closed}/turns", {"input_ids": [4]})
    assert status == 409 and "is closed" in answer["error"]["message"]
    with pytest.raises(ManagerError, match="closed already"):
        client.close_session(closed)
    # an open sent again (a client's retry) finds the session it made; one with turns is not reopened
    assert http("POST", manager.url + "/v1/sessions", {"session_id": empty})[0] == 200
    status, answer = http("POST", manager.url + "/v1/sessions", {"session_id": session_id})
    assert status == 409 and "exists already" in answer["error"]["message"]


def test_a_turn_cut_off_by_the_kill_finishes_from_its_journaled_tokens_and_is_answered_once(
    processes, tmp_path
):
    engine = processes.engine()
    proxy = CountingProxy(engine.url)
    config, manager, client = _journaled_manager(processes, tmp_path, proxy.url)
    try:
        session_id = client.open_session()
        (first,) = _turns(client, session_id, range(1))
        context = PROMPT + first + ENV_TOKENS[1]
        first_life = metric(manager, "rollflow_generated_tokens_total")
        answers = []
        caller = threading.Thread(  # its connection dies with the manager; it sends the turn again
            target=lambda: answers.append(
                client.send_turn(
                    session_id,
                    ENV_TOKENS[1],
                    rid="turn-1",
                    max_new_tokens=LONG_TURN,
                    temperature=0,
                    ignore_eos=True,
                )
            )
        )
        caller.start()
        wait_until(lambda: workers(manager)[proxy.url]["tokens_generated"] >= 60, what="the turn to stream")
        proxy.flowing.clear()  # nothing on its way to the manager as it dies
        first_life = settled(lambda: metric(manager, "rollflow_generated_tokens_total")) - first_life
        manager.kill()
        manager.stop()
        proxy.flowing.set()
        manager = _restarted(processes, tmp_path, manager, config)
        caller.join(timeout=300)
        assert not caller.is_alive(), "the turn's caller got no answer"
        (answer,) = answers
        second_life = metric(manager, "rollflow_generated_tokens_total")
    finally:
        proxy.stop()

    assert answer["output_ids"] == greedy_reference(engine, context, LONG_TURN)
    meta = answer["meta_info"]
    assert meta["resumes"] == 1
    kept_before = meta["spans"][0]["end"]
    assert [span["attempt"] for span in meta["spans"]] == [1, 2] and kept_before > 0
    lost = first_life - kept_before  # received by the dead manager, not journaled
    print(f"\nturn cut off at {int(first_life)} tokens: {kept_before} journaled and kept, {int(lost)} lost")
    assert 0 <= lost <= MAX_UNFLUSHED + 1
    assert first_life + second_life - lost == LONG_TURN  # nothing journaled generated twice
    # the turn the dead manager ran was aborted on its engine by the next one
    assert f"{session_id}.t1.1" in proxy.aborted, proxy.aborted

    record = client.session(session_id)
    assert [turn["rid"] for turn in record["turns"]] == [record["turns"][0]["rid"], "turn-1"]
    assert record["context_ids"] == context + answer["output_ids"]
    # sent once more: the same answer, not a third turn; the same rid with other tokens is refused
    again = client.send_turn(
        session_id, ENV_TOKENS[1], rid="turn-1", max_new_tokens=LONG_TURN, temperature=0, ignore_eos=True
    )
    assert again == answer and len(client.session(session_id)["turns"]) == 2
    status, refused = http(
        "POST", f"{manager.url}/v1/sessions/{session_id}/turns", {"input_ids": [9], "rid": "turn-1"}
    )
    assert status == 409 and "other input_ids" in refused["error"]["message"]


def test_a_turn_running_when_the_manager_is_stopped_resumes_after_its_restart(processes, tmp_path):
    engine = processes.engine()
    config, manager, client = _journaled_manager(processes, tmp_path, engine.url)
    session_id = client.open_session()
    (first,) = _turns(client, session_id, range(1))
    answers = []
    caller = threading.Thread(
        target=lambda: answers.append(
            client.send_turn(session_id, ENV_TOKENS[1], max_new_tokens=LONG_TURN, temperature=0)
        )
    )
    caller.start()
    wait_until(lambda: workers(manager)[engine.url]["tokens_generated"] >= 40, what="the turn to stream")
    manager.stop()  # SIGTERM: its handlers are cancelled, as a caller's going away would cancel them
    manager = _restarted(processes, tmp_path, manager, config)
    caller.join(timeout=300)
    (answer,) = answers
    # carried on from the tokens it had (its attempt ended with the manager), not started again
    spans = answer["meta_info"]["spans"]
    assert [span["attempt"] for span in spans] == [1, 2] and spans[0]["end"] >= 1, spans
    reference = greedy_reference(engine, PROMPT + first + ENV_TOKENS[1], LONG_TURN)
    assert answer["output_ids"] == reference
    assert len(client.session(session_id)["turns"]) == 2


def test_a_caller_gone_mid_turn_still_cancels_it_and_a_restart_does_not_bring_it_back(processes, tmp_path):
    engine = processes.engine()
    config, manager, client = _journaled_manager(processes, tmp_path, engine.url)
    session_id = client.open_session()
    _turns(client, session_id, range(1))
    impatient = ManagerClient(manager.url, timeout_s=1)
    with pytest.raises(ManagerUnreachable, match=r"answered nothing within 1s"):  # the caller hangs up
        impatient.send_turn(session_id, ENV_TOKENS[1], max_new_tokens=2000, ignore_eos=True)
    wait_until(lambda: workers(manager)[engine.url]["running"] == 0, what="the turn to be cancelled")
    client.open_session()  # answered once on disk, with what came before it
    manager = _kill_and_restart(processes, tmp_path, manager, config)
    assert len(client.session(session_id)["turns"]) == 1
    assert client.send_turn(session_id, ENV_TOKENS[1], **SAMPLING)["turn"] == 1  # not busy
