"""Multi-turn sessions on real engines: turns keep their engine (and its prefix cache), a session
whose engine dies between turns goes on elsewhere with the same greedy tokens, environment tokens
are marked, and bad turns get a 4xx that says why."""

from __future__ import annotations

import threading

from rollflow.runtime.manager.client import ManagerClient
from tests.runtime.manager.helpers import greedy_reference, wait_until, workers
from tests.runtime.processes import http

PROMPT = [3 + 7 * i % 50 for i in range(20)]  # more than one of the built-in cache's 16-token blocks
ENV_TOKENS = [[60 + turn, 61 + turn, 62 + turn] for turn in range(5)]  # the tool's answers
SAMPLING = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}


def _run_turns(client: ManagerClient, session_id: str, turns: range, on_turn=lambda turn, answer: None):
    answers = []
    for turn in turns:
        answer = client.send_turn(session_id, PROMPT if turn == 0 else ENV_TOKENS[turn], **SAMPLING)
        answers.append(answer)
        on_turn(turn, answer)
    return answers


def _engine_urls(answer: dict) -> set[str]:
    return {span["engine_url"] for span in answer["meta_info"]["spans"]}


def test_five_turns_stay_on_one_engine_and_hit_its_cache(processes):
    engines = [processes.engine(), processes.engine()]
    manager = processes.manager(router="round_robin", engines=[{"url": e.url} for e in engines])
    client = ManagerClient(manager.url)
    session_id = client.open_session()
    answers = _run_turns(client, session_id, range(5))

    served = [_engine_urls(answer) for answer in answers]
    assert all(len(urls) == 1 for urls in served), served
    assert len(set.union(*served)) == 1, f"the turns moved between engines: {served}"  # not round robin
    assert answers[0]["meta_info"]["cached_tokens"] == 0
    assert all(answer["meta_info"]["cached_tokens"] > 0 for answer in answers[1:]), answers

    record = client.close_session(session_id)
    assert record["state"] == "closed"
    # the context is the prompt, then each turn's output after the environment's tokens
    expected = list(PROMPT)
    for turn, answer in enumerate(answers):
        expected += (ENV_TOKENS[turn] if turn else []) + answer["output_ids"]
    assert record["context_ids"] == expected
    roles = [(s["role"], s["end"] - s["start"]) for s in record["segments"]]
    assert roles == [("prompt", 20)] + [("output", 6), ("env", 3)] * 4 + [("output", 6)]
    # the loss mask: generated tokens only; the tool's tokens and the prompt are masked out
    mask = record["loss_mask"]
    for segment in record["segments"]:
        assert set(mask[segment["start"] : segment["end"]]) == {int(segment["role"] == "output")}
    assert all(lp == 0.0 for lp, m in zip(record["logprobs"], mask, strict=True) if not m)
    assert all(turn["weight_version"] == 0 for turn in record["turns"])


def test_a_session_whose_engine_dies_between_turns_continues_elsewhere_with_the_same_tokens(processes):
    engines = [processes.engine(), processes.engine()]
    manager = processes.manager(engines=[{"url": e.url} for e in engines], health_interval_s=0.5)
    client = ManagerClient(manager.url)
    reference = _run_turns(client, client.open_session(), range(5))
    reference_record = client.session(reference[0]["session_id"])

    session_id = client.open_session()
    by_url = {e.url: e for e in engines}
    first = _run_turns(client, session_id, range(3))
    (home,) = set.union(*(_engine_urls(answer) for answer in first))
    by_url[home].kill()  # kill -9 between turns 3 and 4
    rest = _run_turns(client, session_id, range(3, 5))

    (elsewhere,) = set.union(*(_engine_urls(answer) for answer in rest))
    assert elsewhere != home
    outputs = [answer["output_ids"] for answer in first + rest]
    assert outputs == [answer["output_ids"] for answer in reference]
    record = client.session(session_id)
    assert record["context_ids"] == reference_record["context_ids"]
    assert record["loss_mask"] == reference_record["loss_mask"]
    # every context token made once: the spans of the turns tile exactly the output segments
    span_ranges = [(span["start"], span["end"]) for turn in record["turns"] for span in turn["spans"]]
    outputs_at = [(s["start"], s["end"]) for s in record["segments"] if s["role"] == "output"]
    assert span_ranges == outputs_at


def test_bad_turns_get_a_clear_4xx(processes, tiny_model):
    engine = processes.engine()
    manager = processes.manager(engines=[{"url": engine.url}])
    client = ManagerClient(manager.url)

    status, answer = http("POST", manager.url + "/v1/sessions/nope/turns", {"input_ids": [1, 2]})
    assert status == 404 and "no session 'nope'" in answer["error"]["message"]

    closed = client.open_session()
    client.close_session(closed)
    status, answer = http("POST", f"{manager.url}/v1/sessions/{closed}/turns", {"input_ids": [1, 2]})
    assert status == 409 and "is closed" in answer["error"]["message"]
    status, answer = http("DELETE", f"{manager.url}/v1/sessions/{closed}")
    assert status == 409 and "closed already" in answer["error"]["message"]

    status, answer = http("POST", manager.url + "/v1/sessions", {"weight_version": -1})
    assert status == 400 and "weight_version" in answer["error"]["message"]

    pinned = client.open_session()
    free = client.open_session(allow_off_policy=True)
    for session_id in (pinned, free):
        client.send_turn(session_id, PROMPT, **SAMPLING)
    (worker,) = client.live_workers()
    client.update_weights(worker["id"], model_path=str(tiny_model), weight_version=1)

    status, answer = http("POST", f"{manager.url}/v1/sessions/{pinned}/turns", {"input_ids": [4]})
    assert status == 409, answer
    message = answer["error"]["message"]
    assert "holds weight version 0" in message and "[1]" in message and "allow_off_policy" in message
    # allowed off-policy, the session goes on, each turn's tokens naming the version that made them
    turn = client.send_turn(free, [4], **SAMPLING)
    assert turn["meta_info"]["weight_version"] == 1
    versions = [t["weight_version"] for t in client.session(free)["turns"]]
    assert versions == [0, 1]

    # a session closed while a turn runs: the turn's caller gets a 409, and the turn is not kept
    answers = []
    long_turn = {"input_ids": [5], "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}}
    caller = threading.Thread(
        target=lambda: answers.append(http("POST", f"{manager.url}/v1/sessions/{free}/turns", long_turn))
    )
    before = workers(manager)[engine.url]["tokens_generated"]
    caller.start()
    wait_until(lambda: workers(manager)[engine.url]["tokens_generated"] > before, what="the turn to stream")
    record = client.close_session(free)
    caller.join(timeout=60)
    ((status, answer),) = answers
    assert status == 409 and "closed during the turn" in answer["error"]["message"]
    assert len(record["turns"]) == 2


def test_generate_and_openai_answers_carry_the_engines_cached_tokens(processes, tiny_model):
    engine = processes.engine()
    manager = processes.manager(engines=[{"url": engine.url}], tokenizer=str(tiny_model))
    body = {"input_ids": PROMPT, "sampling_params": SAMPLING}
    first = http("POST", manager.url + "/generate", body)[1]["meta_info"]["cached_tokens"]
    again = http("POST", manager.url + "/generate", body)[1]["meta_info"]["cached_tokens"]
    assert (first, again) == (0, 16)  # the prompt's first 16-token block, cached by the first request
    status, answer = http(
        "POST", manager.url + "/v1/completions", {"model": "tiny", "prompt": PROMPT, "max_tokens": 2}
    )
    assert status == 200, answer
    assert answer["usage"]["prompt_tokens_details"] == {"cached_tokens": 16}


def test_sglang_session_shapes_drive_the_same_sessions(processes):
    engine = processes.engine()
    manager = processes.manager(engines=[{"url": engine.url}])
    client = ManagerClient(manager.url)
    reference = _run_turns(client, client.open_session(), range(2))

    status, session_id = http("POST", manager.url + "/open_session", {"capacity_of_str_len": 1000})
    assert status == 200 and isinstance(session_id, str)

    def generate(input_ids, **session_params):
        body = {"input_ids": input_ids, "sampling_params": SAMPLING, "session_params": session_params}
        return http("POST", manager.url + "/generate", body)

    status, first = generate(PROMPT, id=session_id)
    assert status == 200, first
    status, second = generate(ENV_TOKENS[1], id=session_id, rid=first["meta_info"]["id"])
    assert status == 200, second
    assert [first["output_ids"], second["output_ids"]] == [a["output_ids"] for a in reference]
    assert second["meta_info"]["cached_tokens"] > 0
    roles = [s["role"] for s in client.session(session_id)["segments"]]
    assert roles == ["prompt", "output", "env", "output"]
    # a turn sent again with its rid (a client's retry) is answered again, not run twice
    again = {
        "input_ids": ENV_TOKENS[1],
        "sampling_params": SAMPLING,
        "rid": second["meta_info"]["id"],
        "session_params": {"id": session_id, "rid": first["meta_info"]["id"]},
    }
    assert http("POST", manager.url + "/generate", again) == (200, second)
    assert len(client.session(session_id)["turns"]) == 2

    status, answer = generate([4], id=session_id, rid=first["meta_info"]["id"])  # an earlier turn
    assert status == 409 and "branching" in answer["error"]["message"]
    status, answer = generate([4], id=session_id, offset=3)
    assert status == 400 and "offset" in answer["error"]["message"]
    status, answer = generate([4], id="nope")
    assert status == 404
    assert http("POST", manager.url + "/close_session", {"session_id": session_id})[0] == 200
    status, answer = generate([4], id=session_id)
    assert status == 409 and "is closed" in answer["error"]["message"]


def test_an_engine_killed_mid_turn_hands_the_turn_on_with_its_tokens(processes):
    engines = [processes.engine(), processes.engine()]
    manager = processes.manager(engines=[{"url": e.url} for e in engines], health_interval_s=0.5)
    client = ManagerClient(manager.url)
    session_id = client.open_session()
    first = client.send_turn(session_id, PROMPT, **SAMPLING)
    (home,) = _engine_urls(first)
    context = PROMPT + first["output_ids"] + ENV_TOKENS[1]
    answers = []
    turn = threading.Thread(
        target=lambda: answers.append(
            client.send_turn(session_id, ENV_TOKENS[1], max_new_tokens=300, temperature=0, ignore_eos=True)
        )
    )
    turn.start()
    wait_until(lambda: workers(manager)[home]["tokens_generated"] >= 6 + 8, what="the turn to stream")
    by_url = {e.url: e for e in engines}
    by_url[home].kill()
    turn.join(timeout=300)
    (survivor,) = [e for e in engines if e.url != home]
    (second,) = answers
    spans = second["meta_info"]["spans"]
    assert [span["engine_url"] for span in spans] == [home, survivor.url]
    assert second["meta_info"]["resumes"] == 1
    assert second["output_ids"] == greedy_reference(survivor, context, 300)


def test_abort_request_ends_a_running_turn_with_its_partial_tokens(processes):
    """slime's abort (by rid, or abort_all to every worker) reaches a session's turn as any request:
    the turn ends with finish_reason abort and the tokens it had, and the session goes on."""
    engine = processes.engine()
    manager = processes.manager(engines=[{"url": engine.url}])
    for abort in ({"rid": "long-turn"}, {"abort_all": True}):
        _abort_a_long_turn(ManagerClient(manager.url), manager, engine.url, abort)


def _abort_a_long_turn(client: ManagerClient, manager, engine_url: str, abort: dict) -> None:
    session_id = client.open_session()
    client.send_turn(session_id, PROMPT, **SAMPLING)
    answers = []
    long_turn = {"max_new_tokens": 2000, "temperature": 0, "ignore_eos": True}
    turn = threading.Thread(
        target=lambda: answers.append(
            client.send_turn(session_id, ENV_TOKENS[1], rid="long-turn", **long_turn)
        )
    )
    before = workers(manager)[engine_url]["tokens_generated"]
    turn.start()
    wait_until(
        lambda: workers(manager)[engine_url]["tokens_generated"] >= before + 8, what="the turn's tokens"
    )
    status, answer = http("POST", manager.url + "/abort_request", abort)
    assert (status, answer["num_aborted"]) == (200, 1), answer
    turn.join(timeout=120)
    (aborted,) = answers
    assert aborted["meta_info"]["finish_reason"]["type"] == "abort", aborted["meta_info"]
    assert 8 <= len(aborted["output_ids"]) < long_turn["max_new_tokens"]
    # the partial output is the turn's, in the context; the next turn carries on from it
    assert client.session(session_id)["context_ids"][-len(aborted["output_ids"]) :] == aborted["output_ids"]
    after = client.send_turn(session_id, ENV_TOKENS[2], **SAMPLING)
    assert len(after["output_ids"]) == SAMPLING["max_new_tokens"]
    client.close_session(session_id)


def test_opening_past_max_open_sessions_is_a_429_until_one_is_closed(processes):
    manager = processes.manager(max_open_sessions=2)  # sessions open without an engine
    client = ManagerClient(manager.url)
    first, _ = client.open_session(), client.open_session()
    for path, body in (("/v1/sessions", {}), ("/open_session", {"capacity_of_str_len": 1024})):
        status, answer = http("POST", manager.url + path, body)
        assert status == 429, answer
        message = answer["error"]["message"]
        assert "2 sessions are open, max_open_sessions=2" in message and "DELETE /v1/sessions/" in message
    client.close_session(first)
    client.open_session()  # a closed session frees its place
