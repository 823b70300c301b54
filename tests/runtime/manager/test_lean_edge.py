"""The manager's lean `/generate` path (lean.py) against a live manager, over raw sockets: it
keeps connections alive, answers pipelined requests in order, hands a connection to aiohttp at its
first other request (which is then answered as before), honours `Connection: close`, and releases
the sample (its engine request aborted) when the client goes away mid-request."""

from __future__ import annotations

import json
import socket
from urllib.parse import urlsplit

from rollflow.runtime.manager.edge.lean import _framing
from tests.runtime.manager.helpers import wait_until
from tests.runtime.processes import http


def _request(method: str, path: str, body: dict | bytes | None = None, headers: str = "") -> bytes:
    data = body if isinstance(body, bytes) else (b"" if body is None else json.dumps(body).encode())
    head = f"{method} {path} HTTP/1.1\r\nHost: test\r\n{headers}Content-Length: {len(data)}\r\n\r\n"
    return head.encode() + data


def _read(reader) -> tuple[int, dict[str, str], bytes]:
    """One response: its status, its headers (lower-cased names) and its Content-Length body."""
    status = int(reader.readline().split()[1])
    headers = {}
    while (line := reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, reader.read(int(headers["content-length"]))


def _read_stream(reader) -> tuple[int, dict[str, str], list[dict]]:
    """One streamed response: its status, its headers and its events' JSON (chunked body)."""
    status = int(reader.readline().split()[1])
    headers = {}
    while (line := reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    assert headers["transfer-encoding"] == "chunked"
    body = b""
    while size := int(reader.readline().split(b";")[0], 16):
        body += reader.read(size)
        assert reader.read(2) == b"\r\n"
    assert reader.readline() == b"\r\n"  # no trailers
    events = [line[6:] for line in body.split(b"\n\n") if line]
    assert events[-1] == b"[DONE]"
    return status, headers, [json.loads(event) for event in events[:-1]]


def _connect(manager) -> tuple[socket.socket, object]:
    parts = urlsplit(manager.url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=60)
    return sock, sock.makefile("rb")


def _generate(prompt: list[int], max_new_tokens: int = 4, **extra) -> dict:
    sampling = {"max_new_tokens": max_new_tokens, "temperature": 0}
    return {"input_ids": prompt, "sampling_params": sampling, **extra}


def test_one_connection_serves_generate_then_other_routes_then_generate_again(processes):
    engine = processes.engine()
    manager = processes.manager(engines=[{"url": engine.url}])
    sock, reader = _connect(manager)
    with sock:
        # two pipelined /generate requests in one write: two answers, in order, on one connection
        pipelined = _request("POST", "/generate", _generate([1, 2, 3], rid="a"))
        sock.sendall(pipelined + _request("POST", "/generate", _generate([4, 5], rid="b")))
        for rid in ("a", "b"):
            status, headers, body = _read(reader)
            answer = json.loads(body)
            assert (status, headers["content-type"]) == (200, "application/json")
            assert answer["meta_info"]["id"] == rid and len(answer["output_ids"]) == 4
        # a malformed body is aiohttp's to refuse, in the one error shape; the connection carries on
        sock.sendall(_request("POST", "/generate", b'{"input_ids": [1,'))
        status, _, body = _read(reader)
        assert status == 400 and "malformed JSON" in json.loads(body)["error"]["message"]
        sock.sendall(_request("GET", "/health"))
        assert _read(reader)[0] == 200
        sock.sendall(_request("POST", "/generate", _generate([1, 2, 3], rid="c")))
        status, _, body = _read(reader)
        assert status == 200 and json.loads(body)["meta_info"]["id"] == "c"


def test_a_streamed_or_batched_generate_is_answered_as_before(processes):
    engine = processes.engine()
    manager = processes.manager(engines=[{"url": engine.url}])
    sock, reader = _connect(manager)
    with sock:
        sock.sendall(_request("POST", "/generate", _generate([1, 2, 3], rid="one")))
        single = json.loads(_read(reader)[2])
        sock.sendall(_request("POST", "/generate", _generate([[1, 2, 3], [4, 5]])))
        status, _, body = _read(reader)
        batch = json.loads(body)
        assert status == 200 and [len(a["output_ids"]) for a in batch] == [4, 4]
        assert batch[0]["output_ids"] == single["output_ids"]  # greedy: the same tokens either way
    status, events = http("POST", manager.url + "/generate", _generate([1, 2, 3], stream=True))
    assert status == 200 and "data: [DONE]" in events


def test_a_stream_is_served_on_the_lean_path_and_its_connection_goes_on(processes):
    """A streamed /generate is written event by event by the connection itself: chunked SSE with the
    whole output so far in each event, the last equal to the JSON answer of the same request, and
    the connection serving the next request (JSON, then a stream with `Connection: close`)."""
    engine = processes.engine()
    manager = processes.manager(engines=[{"url": engine.url}])
    sock, reader = _connect(manager)
    with sock:
        sock.sendall(
            _request("POST", "/generate", _generate([1, 2, 3], 12, stream=True, return_logprob=True))
        )
        status, headers, events = _read_stream(reader)
        assert (status, headers["content-type"]) == (200, "text/event-stream")
        assert "server" not in headers  # the lean path's head, not aiohttp's
        lengths = [len(event["output_ids"]) for event in events]
        assert lengths == sorted(lengths) and lengths[-1] == 12  # each event holds everything so far
        last = events[-1]
        assert last["meta_info"]["finish_reason"] == {"type": "length"}
        assert [entry[1] for entry in last["meta_info"]["output_token_logprobs"]] == last["output_ids"]
        sock.sendall(_request("POST", "/generate", _generate([1, 2, 3], 12, return_logprob=True)))
        status, _, body = _read(reader)
        answer = json.loads(body)
        assert status == 200 and answer["output_ids"] == last["output_ids"]  # greedy: the same tokens
        assert answer["meta_info"]["output_token_logprobs"] == last["meta_info"]["output_token_logprobs"]
        closing = _request("POST", "/generate", _generate([4, 5], 3, stream=True), "Connection: close\r\n")
        sock.sendall(closing)
        status, headers, events = _read_stream(reader)
        assert status == 200 and headers["connection"] == "close" and len(events[-1]["output_ids"]) == 3
        assert reader.read() == b""  # closed after the stream's end


def test_a_stream_refused_by_every_engine_is_a_4xx_not_a_stream(processes):
    engine = processes.engine()
    manager = processes.manager(engines=[{"url": engine.url}])
    sock, reader = _connect(manager)
    with sock:
        outside = _generate([1, 99_999], 4, stream=True)  # a token outside the vocabulary: the engine refuses
        sock.sendall(_request("POST", "/generate", outside))
        status, headers, body = _read(reader)
        assert status == 400 and headers["content-type"].startswith("application/json"), body
        assert "outside the vocabulary" in json.loads(body)["error"]["message"]
        sock.sendall(_request("GET", "/health"))
        assert _read(reader)[0] == 200


def test_a_body_shaped_like_one_served_before_is_still_checked_whole(processes):
    """The lean path remembers validated bodies by all but their prompt and rid: a later body of
    that shape with a bad prompt or rid is still refused, naming the field, and one with another
    prompt is answered for its own prompt and rid."""
    engine = processes.engine()
    manager = processes.manager(engines=[{"url": engine.url}])
    sock, reader = _connect(manager)
    with sock:
        for prompt, rid in (([1, 2, 3], "first"), ([4, 5], "second")):
            sock.sendall(_request("POST", "/generate", _generate(prompt, rid=rid)))
            status, _, body = _read(reader)
            answer = json.loads(body)
            assert status == 200 and answer["meta_info"]["id"] == rid
            assert answer["meta_info"]["prompt_tokens"] == len(prompt)
        for bad, field in (({"input_ids": [1, -2]}, "input_ids"), ({"rid": ""}, "rid")):
            sock.sendall(_request("POST", "/generate", _generate([1, 2, 3], rid="third") | bad))
            status, _, body = _read(reader)
            assert status == 400 and field in json.loads(body)["error"]["message"]


def test_each_head_is_framed_by_its_own_length_and_odd_ones_go_to_aiohttp():
    """Heads are checked once per shape but their Content-Length, which is read from each."""
    head = b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: %s\r\nContent-Type: application/json"
    assert _framing(head % b"12") == (12, True)
    assert _framing(head % b"345") == (345, True)
    assert _framing(head % b" 7 ") == (7, True)
    assert _framing(head % b"12" + b"\r\nConnection: close") == (12, False)
    assert _framing(head % b"12" + b"\r\nContent-Length: 12") is None  # two lengths
    assert _framing(head % b"12" + b"\r\nTransfer-Encoding: chunked") is None
    assert _framing(head % b"12" + b"\r\nnot a header line") is None
    for length in (b"-1", b"1\r2", b"0x10", b""):
        assert _framing(head % length) is None
    assert _framing(b"POST /generate HTTP/1.1\r\nHost: x") is None  # no length
    assert _framing(b"GET /generate HTTP/1.1\r\nContent-Length: 1") is None


def test_connection_close_is_honoured(processes):
    engine = processes.engine()
    manager = processes.manager(engines=[{"url": engine.url}])
    sock, reader = _connect(manager)
    with sock:
        sock.sendall(_request("POST", "/generate", _generate([1, 2, 3]), headers="Connection: close\r\n"))
        status, headers, _ = _read(reader)
        assert status == 200 and headers["connection"] == "close"
        assert reader.read() == b""  # the manager closed the connection


def test_a_client_that_goes_away_releases_its_sample_and_the_engine_request(processes):
    engine = processes.engine()
    manager = processes.manager(engines=[{"url": engine.url}])
    body = _generate([1, 2, 3], 2000)
    body["sampling_params"]["ignore_eos"] = True
    sock, _ = _connect(manager)
    sock.sendall(_request("POST", "/generate", body))

    def running() -> tuple[int, int]:
        on_engine = http("GET", engine.url + "/v1/loads")[1]["loads"][0]["num_running_reqs"]
        return http("GET", manager.url + "/v1/loads")[1]["num_running_reqs"], on_engine

    wait_until(lambda: running() == (1, 1), what="the long request to run on the engine")
    sock.close()
    wait_until(lambda: running() == (0, 0), what="the request to end on the manager and the engine")
