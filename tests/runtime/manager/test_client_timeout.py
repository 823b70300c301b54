"""A manager that goes silent: the client's error names the server and the limit it waited."""

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from rollflow.runtime.manager.client import BatchHandle, ManagerClient, ManagerUnreachable

STREAM_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n"


@contextmanager
def silent_server(first_words: bytes = b"") -> Iterator[str]:
    """A real listener on 127.0.0.1 that accepts, sends `first_words`, and then says nothing (a hung
    manager: before its status line, or in the middle of a stream)."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            conn.sendall(first_words)
            held.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        listener.close()


def test_no_status_line_in_time_is_a_named_error():
    with silent_server() as url:
        client = ManagerClient(url, timeout_s=0.3)
        with pytest.raises(ManagerUnreachable, match=rf"{url} answered nothing within 0.3s \(timeout_s\)"):
            client.request("GET", "/health")


@pytest.mark.parametrize("first_words", [b"", STREAM_HEAD], ids=["before-head", "mid-stream"])
def test_silent_sample_stream_is_a_named_error(first_words):
    with silent_server(first_words) as url:
        handle = BatchHandle(ManagerClient(url, timeout_s=0.3), "b1", num_groups=1, num_samples=1)
        with pytest.raises(ManagerUnreachable, match=r"answered nothing within 0\.3s"):
            next(handle.samples())
