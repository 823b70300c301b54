"""Big bodies parsed in a child process come back equal to what json reads, and a child that dies
is replaced for the next body."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from concurrent.futures.process import BrokenProcessPool

import pytest

from rollflow.runtime.http import parse_process
from rollflow.runtime.http.json_object import BodyError


def test_a_body_comes_back_as_json_reads_it_with_long_int_lists_unpacked():
    body = {
        "input_ids": [[i % 50_000 for i in range(70_000)], [1, 2]],
        "flags": [True] * 2000,  # bools stay bools, not ints
        "big": [2**70] + [1] * 2000,  # beyond int64: stays as it is
        "text": "x" * 10,
        "nested": {"ids": list(range(5000)), "mixed": [1, 2.0] * 1000},
    }
    parsed = asyncio.run(parse_process.parse_in_child(json.dumps(body).encode()))
    assert parsed == body
    assert [type(v) for v in parsed["flags"][:2]] == [bool, bool]
    assert type(parsed["input_ids"][0]) is list and type(parsed["input_ids"][0][0]) is int


def test_a_bad_body_raises_its_body_error():
    with pytest.raises(BodyError, match="malformed JSON"):
        asyncio.run(parse_process.parse_in_child(b'{"input_ids": [1,'))


def test_a_child_that_dies_is_replaced_for_the_next_body():
    async def run() -> None:
        await parse_process.parse_in_child(b"{}")  # the child is up
        (pid,) = parse_process._executor()._processes
        big = b'{"input_ids": [' + b"12345," * (4 << 20) + b"1]}"
        parsing = asyncio.ensure_future(parse_process.parse_in_child(big))
        await asyncio.sleep(0.5)
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(BrokenProcessPool):
            await parsing
        assert await parse_process.parse_in_child(b'{"a": 1}') == {"a": 1}

    asyncio.run(run())


SERVER = """
import asyncio, sys
from rollflow.runtime.http import parse_process
asyncio.run(parse_process.parse_in_child(b"{}"))
(pid,) = parse_process._executor()._processes
print(pid, flush=True)
sys.stdin.read()  # until killed
"""


def test_the_child_ends_when_its_server_is_killed():
    """A server killed with SIGKILL never shuts its pool down: its child must not outlive it."""
    import subprocess
    import sys
    import time

    server = subprocess.Popen(
        [sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    child = int(server.stdout.readline())
    server.kill()
    server.wait()
    deadline = time.monotonic() + 60
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(child), f"the parsing child {child} outlived its server"


def _alive(pid: int) -> bool:
    """Whether `pid` runs (an exited child of init is reaped at once; a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
