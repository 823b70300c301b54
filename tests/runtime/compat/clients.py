"""What the RL frameworks' HTTP clients do, written from their documented request shapes: each
function sends exactly the body (or the sequence of calls) the named client sends to sgl-router or
an SGLang server, so the tests run them against the manager unchanged."""

from __future__ import annotations

import json
import threading
import time
import urllib.request

from tests.runtime.processes import http


def sse_payloads(url: str, body: dict, timeout: float = 120.0) -> list[dict]:
    """The JSON events of a streamed `/generate`, up to `data: [DONE]`."""
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    payloads = []
    with urllib.request.urlopen(request, timeout=timeout) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        for raw in response:
            line = raw.strip()
            if not line:
                continue
            assert line.startswith(b"data: "), line
            if line == b"data: [DONE]":
                return payloads
            payloads.append(json.loads(line[6:]))
    raise AssertionError("the stream ended without data: [DONE]")


def in_threads(calls) -> list[threading.Thread]:
    """Run each zero-argument call on a thread of its own; results land in `thread.result`."""
    threads = []
    for call in calls:

        def run(thread_call=call) -> None:
            threading.current_thread().result = thread_call()  # type: ignore[attr-defined]

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        threads.append(thread)
    return threads


def requests_in_load(load: dict) -> int:
    """Requests an SGLang `/v1/loads` answer still holds (running and waiting, over its ranks)."""
    return sum(rank.get("num_running_reqs", 0) + rank.get("num_waiting_reqs", 0) for rank in load["loads"])


def abort_until_idle(worker_url: str, timeout: float = 60.0) -> int:
    """slime's drain of one worker: `abort_all`, then poll `/v1/loads` until it holds nothing,
    aborting again between polls. Returns the number of abort rounds."""
    deadline = time.monotonic() + timeout
    rounds = 0
    while time.monotonic() < deadline:
        status, answer = http("POST", worker_url + "/abort_request", {"abort_all": True})
        assert status == 200, answer
        rounds += 1
        status, load = http("GET", worker_url + "/v1/loads?include=core,disagg,queues")
        assert status == 200, load
        if requests_in_load(load) == 0:
            return rounds
        time.sleep(0.2)
    raise AssertionError(f"{worker_url} still busy after {timeout}s of aborts")


def wait_running(manager_url: str, count: int, timeout: float = 60.0) -> None:
    """Until the manager holds `count` samples on its engines and each has made tokens: once they
    all run, every engine makes two tokens per sample more (the built-in engine takes its running
    requests in turn, one token each)."""
    deadline = time.monotonic() + timeout

    def engines() -> dict[str, dict]:
        return {w["url"]: w for w in http("GET", manager_url + "/workers")[1]["workers"]}

    while http("GET", manager_url + "/v1/loads")[1]["num_running_reqs"] != count:
        assert time.monotonic() < deadline, f"the manager never ran {count} samples at once"
        time.sleep(0.02)
    start = engines()
    while True:
        now = engines()
        if all(
            now[url]["tokens_generated"] - w["tokens_generated"] >= 2 * w["running"]
            for url, w in start.items()
        ):
            return
        assert time.monotonic() < deadline, "the running samples made no tokens"
        time.sleep(0.02)
