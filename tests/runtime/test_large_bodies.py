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

import threading
import time

from benchmarks.hostile_inputs import batch_body, one_prompt_body, post_raw
from tests.runtime.processes import http

HELD_S = 5.0  # well above the noise, well below the 7-14 s the unfixed server held /health


def _send(url: str, body: bytes, answers: list[tuple[int, bytes]]) -> None:
    answers.append(post_raw(url, body))


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

    def wait_first_answer(self) -> None:
        """Block until one poll came back, so that the poller runs before what it is to watch."""
        while not self.times and self._thread.is_alive():
            time.sleep(0.01)

    def stop(self) -> float:
        """Stop after one more answer, so that the polls span all of what happened since the first."""
        answered = len(self.times)
        while len(self.times) == answered and self._thread.is_alive():
            time.sleep(0.01)
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
            (one_prompt_body(), 413, b"max_prompt_tokens=131072"),
            (batch_body(), 400, b"input_ids holds -1"),
        ):
            poller = HealthPoller(manager.url)
            poller.wait_first_answer()
            answers: list[tuple[int, bytes]] = []
            senders = [threading.Thread(target=_send, args=(manager.url, body, answers)) for _ in range(3)]
            for sender in senders:
                sender.start()
            for sender in senders:
                sender.join()
            slowest = poller.stop()
            assert [status for status, _ in answers] == [status_wanted] * 3, answers
            assert all(said in answer for _, answer in answers), answers
            assert slowest < HELD_S + 2 * noise, (slowest, noise, sorted(poller.times)[-5:])
    finally:
        stop.set()
        for thread in load:
            thread.join()
    assert load_answers and set(load_answers) == {200}, set(load_answers)
