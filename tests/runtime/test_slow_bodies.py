"""Bodies that arrive too slowly are cut off by every server (rollflow.runtime.http.limits): one
sent a byte a second (never pausing for the read timeout) is closed once its average rate falls
below `min_body_bytes_per_s`, about `read_timeout_s` after its head; one sent fast enough but for
longer than `body_timeout_s` is closed then."""

from __future__ import annotations

import socket
import threading
import time
from urllib.parse import urlsplit

from tests.runtime.processes import http
from tests.runtime.test_auth import _weight_server

READ_TIMEOUT_S = 2.0
MIN_RATE = 1000.0  # bytes/s: a byte a second is far below it
TRICKLE_LIMITS = {"read_timeout_s": READ_TIMEOUT_S, "body_timeout_s": 60.0, "min_body_bytes_per_s": MIN_RATE}
TOTAL_LIMITS = {"read_timeout_s": READ_TIMEOUT_S, "body_timeout_s": 4.0, "min_body_bytes_per_s": MIN_RATE}
CLOSED_WELL_BEFORE_S = 30.0  # the trickle's deadline is ~2 s; the body timeout (60 s) would close it later
GIVE_UP_S = 90.0


def _flags(limits: dict) -> list[str]:
    """The CLI flags of the same limits (the engine's and the weight server's)."""
    return [part for key, value in limits.items() for part in (f"--{key.replace('_', '-')}", str(value))]


def _send_slowly(url: str, method: str, path: str, token: str | None, piece: bytes, every_s: float) -> float:
    """Seconds from the head until the server closed the connection, sending `piece` every
    `every_s` seconds of a body declared 10 MB long; inf when it was still open after GIVE_UP_S."""
    parts = urlsplit(url)
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    head = f"{method} {path} HTTP/1.1\r\nHost: {parts.netloc}\r\n{auth}Content-Length: 10000000\r\n\r\n"
    with socket.create_connection((parts.hostname, parts.port), timeout=every_s) as sock:
        sock.sendall(head.encode() + b'{"input_ids": [1')
        started = time.monotonic()
        while time.monotonic() - started < GIVE_UP_S:
            try:
                if not sock.recv(4096):  # EOF: closed without an answer
                    return time.monotonic() - started
                return time.monotonic() - started  # an answer (a 408) also ends it
            except TimeoutError:
                pass
            except ConnectionResetError:
                return time.monotonic() - started
            try:
                sock.sendall(piece)
            except (BrokenPipeError, ConnectionResetError):
                return time.monotonic() - started
    return float("inf")


def _close_times(
    targets: list[tuple[str, str, str, str | None]], piece: bytes, every_s: float
) -> list[float]:
    """`_send_slowly` on every target at once."""
    times: list[float] = [float("inf")] * len(targets)

    def one(index: int) -> None:
        times[index] = _send_slowly(*targets[index], piece, every_s)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(targets))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return times


def _servers(processes, tmp_path, limits: dict):
    """A manager (lean /generate and aiohttp's routes), a built-in engine and a weight server, all
    under `limits`; (targets, weight server process)."""
    engine = processes.engine(extra_args=tuple(_flags(limits)))
    manager = processes.manager(**limits)
    weights, weights_url = _weight_server(tmp_path, *_flags(limits), token="t0k")
    targets = [
        (manager.url, "POST", "/generate", None),  # the manager's lean path
        (manager.url, "POST", "/v1/sessions/s/turns", None),  # aiohttp's
        (engine.url, "POST", "/generate", None),
        (weights_url, "PUT", "/v1/versions/1", "t0k"),
    ]
    return targets, weights, [manager.url, engine.url, weights_url]


def test_a_body_sent_a_byte_a_second_is_closed_by_every_server(processes, tmp_path):
    targets, weights, urls = _servers(processes, tmp_path, TRICKLE_LIMITS)
    try:
        times = _close_times(targets, b"1", every_s=1.0)
        for target, took in zip(targets, times, strict=True):
            # the rate rule's deadline: read_timeout_s + the bytes sent / MIN_RATE after the head
            assert READ_TIMEOUT_S - 0.5 < took < CLOSED_WELL_BEFORE_S, (target, took)
        for url in urls:
            assert http("GET", url + "/health")[0] == 200
    finally:
        weights.kill()
        weights.wait()


def test_a_body_that_takes_longer_than_body_timeout_s_is_closed(processes, tmp_path):
    targets, weights, _ = _servers(processes, tmp_path, TOTAL_LIMITS)
    try:
        # 1,500 bytes every 0.5 s is 3,000 bytes/s, above the minimum rate: only the total time ends it
        times = _close_times(targets, b"1," * 750, every_s=0.5)
        for target, took in zip(targets, times, strict=True):
            assert TOTAL_LIMITS["body_timeout_s"] - 0.5 < took < CLOSED_WELL_BEFORE_S, (target, took)
    finally:
        weights.kill()
        weights.wait()
