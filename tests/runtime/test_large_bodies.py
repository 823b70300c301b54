"""Big bodies never hold the manager's event loop: while three 60 MB bodies arrive and are refused
(one prompt sure to exceed max_prompt_tokens, refused once its first 64 KiB are read) or parsed
(a batch, parsed in a child process), under a load of /generate calls, `/health` keeps answering.

The issue's goal, every answer within a second, is a speed, measured by
benchmarks/hostile_inputs.py (which exits non-zero when it is missed). On the loaded 2-core machine
these tests share, single answers took up to 3 s for reasons outside the server (the same run's
benchmark gave 0.55 s), so this test asserts what it can robustly: hundreds of polls, every one
answered, the slowest under 5 s on top of twice the slowest the same polling saw in the 5 s before
the bodies (the machine's own noise). The server before this change held `/health` for 7 to 14 s.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from urllib.parse import urlsplit

from tests.runtime.processes import http

HELD_S = 5.0  # well above the noise, well below the 7-14 s the unfixed server held /health
BODY_MB = 60


def _one_prompt_body() -> bytes:
    return b'{"input_ids": [' + b"12345," * (BODY_MB * (1 << 20) // 6) + b"1]}"


def _batch_body() -> bytes:
    """A batch of 100 prompts of 100,000 ids (each under max_prompt_tokens), the last of which
    holds a negative id: the whole body is parsed and validated, then refused with a 400."""
    row = b"[" + b"12345," * 99_999 + b"1]"
    return b'{"input_ids": [' + b",".join([row] * 99 + [row.replace(b"[", b"[-1,", 1)]) + b"]}"


def _post(url: str, body: bytes) -> tuple[int, bytes]:
    """(status, answer) of a raw POST /generate of `body` (the server may answer before it is sent)."""
    parts = urlsplit(url)
    head = f"POST /generate HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    with socket.create_connection((parts.hostname, parts.port), timeout=600) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # answered before it all went
            sock.sendall(head.encode())
            sock.sendall(body)  # not joined to the head: a copy of 60 MB would hold this process's GIL
        answer = b""
        while chunk := sock.recv(1 << 16):
            answer += chunk
    return int(answer.split(b" ", 2)[1]), answer.split(b"\r\n\r\n", 1)[-1]


def _send(url: str, body: bytes, answers: list[tuple[int, bytes]]) -> None:
    answers.append(_post(url, body))


class HealthPoller:
    """Polls `/health` from a thread until stopped; `slowest` is the longest answer."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.times: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            status, _ = http("GET", self.url + "/health", timeout=120)
            self.times.append(time.monotonic() - started if status == 200 else float("inf"))
            self._stop.wait(0.02)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return max(self.times)


def _load(url: str, stop: threading.Event, answers: list[int]) -> None:
    body = {
        "input_ids": [11, 12],
        "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True},
    }
    while not stop.is_set():
        answers.append(http("POST", url + "/generate", body, timeout=300)[0])


def test_health_keeps_answering_while_three_60_mb_bodies_arrive_under_load(processes):
    engine = processes.engine()
    manager = processes.manager(engines=[{"url": engine.url, "engine_type": "builtin"}])
    stop, load_answers = threading.Event(), []
    load = [threading.Thread(target=_load, args=(manager.url, stop, load_answers)) for _ in range(2)]
    for thread in load:
        thread.start()
    try:
        quiet = HealthPoller(manager.url)
        time.sleep(5)  # the noise: the same polling, same load, no big body
        noise = quiet.stop()
        for body, status_wanted, said in (
            (_one_prompt_body(), 413, b"max_prompt_tokens=131072"),
            (_batch_body(), 400, b"input_ids holds -1"),
        ):
            poller = HealthPoller(manager.url)
            answers: list[tuple[int, bytes]] = []
            senders = [threading.Thread(target=_send, args=(manager.url, body, answers)) for _ in range(3)]
            for sender in senders:
                sender.start()
            for sender in senders:
                sender.join()
            slowest = poller.stop()
            assert [status for status, _ in answers] == [status_wanted] * 3, answers
            assert all(said in answer for _, answer in answers), answers
            assert len(poller.times) >= 5, poller.times  # it polled while the bodies came
            assert slowest < HELD_S + 2 * noise, (slowest, noise, sorted(poller.times)[-5:])
    finally:
        stop.set()
        for thread in load:
            thread.join()
    assert load_answers and set(load_answers) == {200}, set(load_answers)
