"""Half-open connections (a partial request head, or a body that stops half-way) are closed by
every server after its read timeout, so slow or abandoned clients cannot pile up sockets."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

from tests.runtime.processes import http
from tests.runtime.test_auth import _weight_server

TIMEOUT_S = "2"


def _half_open(url: str, method: str, path: str, token: str | None = None) -> list[socket.socket]:
    """25 connections stopped inside their request head and 25 inside their body."""
    parts = urlsplit(url)
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    sockets = []
    for index in range(50):
        sock = socket.create_connection((parts.hostname, parts.port), timeout=120)
        if index % 2:
            sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Le".encode())
        else:
            head = f"{method} {path} HTTP/1.1\r\nHost: {parts.netloc}\r\n{auth}Content-Length: 1000\r\n\r\n"
            sock.sendall(head.encode() + b'{"input_ids": [1, 2')
        sockets.append(sock)
    return sockets


def _assert_all_closed(sockets: list[socket.socket]) -> None:
    """Each connection is closed by the server (EOF or reset); recv blocks until then (120 s at most)."""
    for sock in sockets:
        try:
            while sock.recv(4096):
                pass
        except ConnectionResetError:
            pass
        except TimeoutError:
            raise AssertionError("the server kept a half-open connection open") from None
        finally:
            sock.close()


def test_the_manager_and_the_engine_close_half_open_connections(processes):
    engine = processes.engine(extra_args=("--read-timeout-s", TIMEOUT_S))
    manager = processes.manager(read_timeout_s=float(TIMEOUT_S))
    for server in (manager, engine):
        sockets = _half_open(server.url, "POST", "/generate")
        _assert_all_closed(sockets)
        assert http("GET", server.url + "/health")[0] == 200  # and it still serves


def test_the_weight_server_closes_half_open_connections(tmp_path):
    proc, url = _weight_server(tmp_path, "--read-timeout-s", TIMEOUT_S, token="t0k")
    try:
        _assert_all_closed(_half_open(url, "PUT", "/v1/versions/1", token="t0k"))
        assert http("GET", url + "/health")[0] == 200
    finally:
        proc.kill()
        proc.wait()
