"""The pipe between a leader process and the worker processes it starts: the elastic actor's ranks
(trainer/elastic.py) and the inference workers (inference/workers.py).

The leader listens on 127.0.0.1 with a key made for the run, starts each worker with the port and
the key in its environment, and `accept_workers` waits for every worker to connect back
(`connect_to_leader`, which sends the worker's number first). Messages then go both ways as
pickled objects (`send`, `receive`); `Stop`, the leader's last message, ends a worker's loop.
"""

from __future__ import annotations

import pickle
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing.connection import Client, Connection, Listener
from subprocess import Popen
from typing import Any


@dataclass(frozen=True)
class Stop:
    """The run is over: the worker leaves its command loop and exits. One message for every leader
    and its workers, whether it travels on this pipe or, for tensor parallelism's ranks, in a
    torch.distributed broadcast."""


def send(connection: Connection, message: Any) -> None:
    """Plain pickle: multiprocessing's own would pass tensors as shared-memory handles, which only a
    process forked from this one could open."""
    connection.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def receive(connection: Connection) -> Any:
    """The next message `send` wrote on the other end; EOFError once that end is closed."""
    return pickle.loads(connection.recv_bytes())


def connect_to_leader(port: int, authkey: bytes, number: int) -> Connection:
    """In a worker: the connection to its leader's listener, announced with the worker's `number`."""
    connection = Client(("127.0.0.1", port), authkey=authkey)
    connection.send(number)
    return connection


def accept_workers(
    listener: Listener, processes: Mapping[int, Popen], timeout_s: float, who: tuple[str, str]
) -> dict[int, Connection]:
    """Each worker's connection by its number, once all of `processes` have connected; a RuntimeError
    if one exits first, one cannot connect, or they take over `timeout_s`. `who`: the leader's and a
    worker's names in those messages, e.g. ("elastic actor", "rank")."""
    leader, member = who
    connections: dict[int, Connection] = {}
    failure: list[BaseException] = []

    def accept_all() -> None:
        try:
            while len(connections) < len(processes):
                connection = listener.accept()
                connections[connection.recv()] = connection
        except (OSError, EOFError) as exc:  # handed to the waiting thread
            failure.append(exc)

    thread = threading.Thread(target=accept_all, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while thread.is_alive():
        thread.join(0.2)
        for number, process in processes.items():
            code = process.poll()
            if code is not None and number not in connections:
                raise RuntimeError(
                    f"{leader}: {member} {number} exited with status {code} while starting (see its log)"
                )
        if time.monotonic() > deadline:
            raise RuntimeError(f"{leader}: {member}s did not start within {timeout_s:g} s")
    if failure:
        raise RuntimeError(f"{leader}: a {member} could not connect: {failure[0]}")
    return connections
