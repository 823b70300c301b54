"""Big JSON bodies parsed in a child process, so the server's event loop never waits on them.

A worker thread is no help here: json's C parser holds the GIL for a whole document (60 MB of
token ids took 6 s on a loaded 2-core machine), and the loop, which needs the GIL for every
callback, waits as long; three such bodies at once kept `/health` from answering for 14 s. The
child parses the body and sends back its structure with every long list of ints (the token ids
that make a body big) packed as an `array` of int64, which crosses the pipe as raw bytes; the loop
then unpacks each array into a list a slice at a time, giving way between slices.

The body goes to the child through a file in /dev/shm (written from a worker thread, which lets
go of the GIL while it writes), not through the executor's pipe, whose pickling copies the whole
body while holding the GIL. One child serves a process (started at the first big body, `spawn`ed:
a fork of a process with threads and a running loop is unsafe); bodies wait their turn in it.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import tempfile
import threading
import time
from array import array
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from rollflow.runtime.http.json_object import parse_json_object

PACK_MIN_ITEMS = 1024  # shorter lists cross the pipe as they are
UNPACK_SLICE = 1 << 16  # ints made into Python objects between two turns of the loop
_INT64 = (-(1 << 63), (1 << 63) - 1)

_pool: ProcessPoolExecutor | None = None


def _executor() -> ProcessPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ProcessPoolExecutor(
            max_workers=1,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_exit_with_parent,
            initargs=(os.getpid(),),
        )
    return _pool


async def parse_in_child(raw: bytes) -> dict[str, Any]:
    """`json_object.parse_json_object(raw)` run in the child (its `BodyError` raised here), its packed
    lists unpacked without holding the loop for more than a slice at a time."""
    global _pool
    spilled = await asyncio.to_thread(_spill, raw)
    try:
        data, packed = await asyncio.get_running_loop().run_in_executor(_executor(), _parse_packed, spilled)
    except BrokenProcessPool:  # the child died (killed, out of memory): the next body gets a new one
        _pool = None
        raise
    finally:
        os.unlink(spilled)
    for path in packed:
        parent = data
        for key in path[:-1]:
            parent = parent[key]
        ints: array = parent[path[-1]]
        items: list[int] = []
        for start in range(0, len(ints), UNPACK_SLICE):
            items += ints[start : start + UNPACK_SLICE].tolist()
            await asyncio.sleep(0)
        parent[path[-1]] = items
    return data


def _exit_with_parent(parent_pid: int) -> None:
    """In the child: end when the server that started it is gone. A server killed with SIGKILL
    never shuts its pool down, and the child, blocked on its task queue, would outlive it for good."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _spill(raw: bytes) -> str:
    """Write `raw` to a new file in memory (/dev/shm where there is one); its path."""
    folder = "/dev/shm" if os.path.isdir("/dev/shm") else None
    fd, path = tempfile.mkstemp(prefix="rollflow-body-", dir=folder)
    with os.fdopen(fd, "wb") as file:
        file.write(raw)
    return path


def _parse_packed(path: str) -> tuple[Any, list[tuple]]:
    """In the child: the parsed body in `path` with its long int lists packed, and where they are."""
    with open(path, "rb") as file:
        data = parse_json_object(file.read())
    packed: list[tuple] = []
    _pack(data, (), packed)
    return data, packed


def _pack(value: Any, path: tuple, packed: list[tuple]) -> None:
    """Pack the long int lists inside `value` in place, noting their paths in `packed`."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if not isinstance(item, list):
            _pack(item, (*path, key), packed)
        elif len(item) >= PACK_MIN_ITEMS and set(map(type, item)) == {int}:  # no bools among them
            if _INT64[0] <= min(item) and max(item) <= _INT64[1]:
                value[key] = array("q", item)
                packed.append((*path, key))
        else:
            _pack(item, (*path, key), packed)
