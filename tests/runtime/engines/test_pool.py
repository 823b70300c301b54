"""The manager's kept-alive HTTP/1.1 client (`pool.py`) against a raw server on 127.0.0.1 that
writes exactly the bytes a test gives it, split where the test splits them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace

import pytest

from rollflow.runtime.engines import pool as pool_module
from rollflow.runtime.engines.pool import _DONE, ConnectionPool, ProtocolError, _Connection
from tests.runtime.engines.helpers import run

Answer = Callable[[int], list[bytes]]  # request number on the connection -> pieces to write


@contextlib.asynccontextmanager
async def raw_server(answer: Answer, close_after: int | None = None) -> AsyncIterator[dict]:
    """Answers each request head with `answer(n)`; `close_after` closes a connection after that
    many answers. Yields counters: connections accepted, requests seen, connections closed by the peer."""
    seen = {"connections": 0, "requests": 0, "peer_closed": 0}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen["connections"] += 1
        served = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length")
                    ),
                    0,
                )
                await reader.readexactly(length)
                seen["requests"] += 1
                for piece in answer(served):
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0.01)
                served += 1
                if close_after is not None and served >= close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            seen["peer_closed"] += 1
        except asyncio.CancelledError:
            pass  # the test is over
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    seen["url"] = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield seen
    finally:
        server.close()


async def until(condition: Callable[[], object], timeout_s: float = 10.0) -> None:
    """Waits for the event `condition` reads (a loop turn at a time), failing after `timeout_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, f"still waiting after {timeout_s}s"
        await asyncio.sleep(0.005)


async def _get_answered_with(pieces: list[bytes], **pool_options) -> None:
    """One GET through a new pool to a server that answers it by writing `pieces`."""
    async with raw_server(lambda n: pieces) as seen:
        await ConnectionPool(seen["url"], **pool_options).request("GET", "/x")


CHUNKED = [
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"6\r\ndata: \r\n",
    b"3\r\n{}\n\r\n",  # one event split over two chunks, and a chunk split over two writes below
    b"f\r\n\ndata",
    b": [DONE]\n\n\r\n0\r\n\r\n",
]


async def _listened_body(response) -> tuple[bytes, int]:
    """A body read as a reader of many streams reads it: no task waits on it; the listener takes
    what came. Returns the body and how many times the listener was called."""
    loop = asyncio.get_running_loop()
    taken: list[bytes] = []
    ended = loop.create_future()
    calls = 0

    def listener() -> None:
        nonlocal calls
        calls += 1
        while not ended.done():  # until nothing more has come (None), or the end ([])
            try:
                pieces = response.take_pieces()
            except Exception as exc:
                ended.set_exception(exc)
                return
            if pieces is None:
                return
            if pieces == []:
                ended.set_result(None)
            taken.extend(pieces)

    response.on_bytes(listener)
    await ended
    return b"".join(taken), calls


@pytest.mark.parametrize("listened", [False, True])
def test_a_chunked_body_split_anywhere_is_read_whole_and_the_connection_is_reused(listened):
    """Read by awaiting it, or by a listener that takes what came when told (no task waits on it)."""

    async def go():
        async with raw_server(lambda n: CHUNKED) as seen:
            pool = ConnectionPool(seen["url"])
            bodies = []
            for _ in range(3):
                response = await pool.request("POST", "/generate", b"{}")
                assert response.status == 200
                bodies.append(await _listened_body(response) if listened else (await response.read(), None))
            pool.close()
            return bodies, seen

    bodies, seen = run(go())
    assert [body for body, _ in bodies] == [b"data: {}\n\ndata: [DONE]\n\n"] * 3
    if listened:
        assert all(calls >= 2 for _, calls in bodies)  # told of each read as it came, then of the end
    assert seen["connections"] == 1 and seen["requests"] == 3


def test_a_long_listened_body_whose_bytes_wait_for_their_taker_is_not_read_meanwhile():
    """Once a long body's bytes wait untaken, what the engine sends stays in the socket until they
    are taken (one read then, not a loop wake-up and a callback per engine write), and none of it is
    lost; the body's first bytes (a short answer, whole) are read as they come."""
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    data = [bytes([65 + i % 26]) * 2000 for i in range(30)]
    pieces = [b"%x\r\n%s\r\n" % (len(piece), piece) for piece in data]  # 30 pieces 10 ms apart

    async def go():
        async with raw_server(lambda n: [head, *pieces, b"0\r\n\r\n"]) as seen:
            response = await ConnectionPool(seen["url"]).request("GET", "/x")
            calls = 0

            def listener() -> None:
                nonlocal calls
                calls += 1

            response.on_bytes(listener)
            await asyncio.sleep(0.6)  # every piece sent meanwhile, none taken
            told_while_waiting = calls
            body = []
            while (pieces_taken := await response.read_pieces()) != []:
                body.extend(pieces_taken)
            return told_while_waiting, b"".join(body)

    told_while_waiting, body = run(go())
    assert told_while_waiting <= pool_module.LISTENED_PAUSE_AFTER // 2000 + 3  # 30 pieces came
    assert body == b"".join(data)


def test_a_listener_is_told_of_a_stalled_body_by_the_read_timeout():
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    pieces = [b"1\r\n%d\r\n" % (i % 10) for i in range(30)]  # 30 pieces 10 ms apart, each in time

    async def go(answer: list[bytes]):
        async with raw_server(lambda n: answer) as seen:
            response = await ConnectionPool(seen["url"], read_timeout_s=0.2).request("GET", "/x")
            return await _listened_body(response)

    body, _ = run(go([head, *pieces, b"0\r\n\r\n"]))
    assert body == b"".join(b"%d" % (i % 10) for i in range(30))
    with pytest.raises(TimeoutError, match="no bytes from the engine"):
        run(go([head, *pieces[:3], *[b""] * 100]))


def test_content_length_and_read_until_close_bodies():
    fixed = [b"HTTP/1.1 400 Bad Request\r\nContent-Length: 11\r\n\r\nbad", b" request"]
    until_close = [b"HTTP/1.0 200 OK\r\n\r\nall of it"]

    async def go():
        async with raw_server(lambda n: fixed) as seen:
            pool = ConnectionPool(seen["url"])
            response = await pool.request("GET", "/x")
            first = (response.status, await response.read())
        async with raw_server(lambda n: until_close, close_after=1) as seen:
            pool = ConnectionPool(seen["url"])
            response = await pool.request("GET", "/x")
            second = (response.status, await response.read())
        return first, second

    assert run(go()) == ((400, b"bad request"), (200, b"all of it"))


def test_an_idle_connection_the_engine_closed_is_replaced_without_losing_the_request():
    ok = [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"]

    async def go():
        async with raw_server(lambda n: ok, close_after=1) as seen:  # closes after every answer
            pool = ConnectionPool(seen["url"])
            answers = []
            for _ in range(3):
                response = await pool.request("GET", "/x")
                answers.append(await response.read())
            return answers, seen

    answers, seen = run(go())
    assert answers == [b"ok"] * 3 and seen["requests"] == 3 and seen["connections"] == 3


def test_a_caller_that_stops_early_closes_the_connection_and_one_that_has_enough_keeps_it():
    def answer(n: int) -> list[bytes]:
        return [*CHUNKED[:2], *([b"1\r\n.\r\n"] * 20), b"0\r\n\r\n"]

    async def go():
        async with raw_server(answer) as seen:
            pool = ConnectionPool(seen["url"])
            response = await pool.request("POST", "/generate", b"{}")
            await response.read_chunk()
            response.release()  # has what it needs: the rest is drained, the connection kept
            await until(lambda: pool._idle)  # the rest of the body came (in 0.2s): it is back in the pool
            response = await pool.request("POST", "/generate", b"{}")
            await response.read_chunk()
            connections_after_release = seen["connections"]
            response.close()  # stops early: the engine must see its client go
            for _ in range(100):
                if seen["peer_closed"]:
                    break
                await asyncio.sleep(0.01)
            return connections_after_release, seen

    connections_after_release, seen = run(go())
    assert connections_after_release == 1
    assert seen["peer_closed"] == 1


def test_a_body_whose_end_came_before_its_release_is_not_read_by_the_next_request():
    """The SGLang client releases a stream at its finish event; when `data: [DONE]` and the body's
    end are in by then, the connection rejoins the pool at once, and must not carry that unread rest
    into the next response (its stream would begin with the last one's `[DONE]`)."""

    def answer(n: int) -> list[bytes]:
        event = f'data: {{"n": {n}}}\n\n'.encode()
        return [CHUNKED[0], b"%x\r\n%s\r\n" % (len(event), event), b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"]

    async def go():
        async with raw_server(answer) as seen:
            pool = ConnectionPool(seen["url"])
            bodies = []
            for _ in range(2):
                response = await pool.request("POST", "/generate", b"{}")
                bodies.append(await response.read_chunk())  # the finish event
                await asyncio.sleep(0.2)  # the rest of the body arrives meanwhile
                response.release()
            return bodies, seen["connections"]

    bodies, connections = run(go())
    assert bodies == [b'data: {"n": 0}\n\n', b'data: {"n": 1}\n\n']
    assert connections == 1  # the connection was kept


def test_a_request_cancelled_before_its_answer_closes_the_connection():
    async def go():
        async with raw_server(lambda n: [b""] * 100) as seen:  # never answers
            pool = ConnectionPool(seen["url"])
            task = asyncio.ensure_future(pool.request("POST", "/generate", b"{}"))
            await until(lambda: seen["requests"])  # the server has it: the answer is what is awaited
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            for _ in range(100):
                if seen["peer_closed"]:
                    break
                await asyncio.sleep(0.01)
            return seen

    assert run(go())["peer_closed"] == 1


def test_a_request_cancelled_in_the_turn_its_connection_opens_is_cancelled():
    """A move cancels an attempt whenever it comes, also in the loop turn its connection to the
    engine opens (asyncio.wait_for of Python 3.11 returned the connection then, and the cancelled
    attempt went on waiting for an engine that may never answer)."""

    async def go():
        async with raw_server(lambda n: [b""] * 100) as seen:  # never answers
            loop = asyncio.get_running_loop()
            pool = ConnectionPool(seen["url"])
            connect = loop.create_connection

            async def connect_then_cancel(*args, **kwargs):
                opened = await connect(*args, **kwargs)
                task.cancel()  # the move, as the connection completes
                return opened

            loop.create_connection = connect_then_cancel
            try:
                task = asyncio.ensure_future(pool.request("POST", "/generate", b"{}"))
                done, _ = await asyncio.wait([task], timeout=10.0)
            finally:
                del loop.create_connection
            assert done and task.cancelled(), "the cancelled request still waits for its answer"
            await until(lambda: seen["peer_closed"])  # and the engine sees its client go
            return seen

    assert run(go())["peer_closed"] == 1


def test_garbage_and_silence_are_errors():
    with pytest.raises(ProtocolError, match="status line"):
        run(_get_answered_with([b"SSH-2.0-OpenSSH\r\n\r\n"]))
    with pytest.raises(TimeoutError):
        run(_get_answered_with([b""] * 100, read_timeout_s=0.2))


def test_the_read_timeout_counts_from_the_last_bytes_of_a_body():
    """A body whose pieces keep coming, each well within `read_timeout_s`, is read whole however long
    it takes in all; one whose bytes stop mid-way ends in TimeoutError (one timer per connection
    looks at a deadline each wait moves, rather than a timer per wait)."""
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    pieces = [b"1\r\n%d\r\n" % (i % 10) for i in range(60)]  # 60 pieces 10 ms apart: 0.6 s

    async def slow_but_steady():
        async with raw_server(lambda n: [head, *pieces, b"0\r\n\r\n"]) as seen:
            response = await ConnectionPool(seen["url"], read_timeout_s=0.2).request("GET", "/x")
            return await response.read()

    assert run(slow_but_steady()) == b"".join(b"%d" % (i % 10) for i in range(60))

    async def stalled():
        async with raw_server(lambda n: [head, *pieces[:3], *[b""] * 100]) as seen:
            response = await ConnectionPool(seen["url"], read_timeout_s=0.2).request("GET", "/x")
            await response.read()

    with pytest.raises(TimeoutError, match="no bytes from the engine"):
        run(stalled())


def test_heads_alike_but_for_their_length_are_each_framed_by_their_own():
    """The framing of a head is remembered by its fields but its Content-Length: each response is
    still read to its own length, and one that says `Connection: close` is not reused."""
    bodies = [b"a", b"bcd", b"efghij"]

    def answer(n: int) -> list[bytes]:
        close = b"Connection: close\r\n" if n == 2 else b""
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + close
        return [head + b"Content-Length: %d\r\n\r\n" % len(bodies[n]) + bodies[n]]

    async def go():
        async with raw_server(answer) as seen:
            pool = ConnectionPool(seen["url"])
            got = [await (await pool.request("GET", "/x")).read() for _ in range(4)]
            pool.close()
            return got, seen

    got, seen = run(go())
    assert got == [b"a", b"bcd", b"efghij", b"a"]
    assert seen["connections"] == 2


def test_a_length_that_is_no_number_is_a_protocol_error():
    with pytest.raises(ProtocolError, match="bad HTTP response"):
        run(_get_answered_with([b"HTTP/1.1 200 OK\r\nContent-Length: 5x\r\n\r\nhello"]))


def test_many_chunks_in_one_write_are_read_as_the_same_body():
    """A streaming engine that outruns its reader leaves tens of chunks in one read: they are taken
    in one pass (chunk extensions and a partial last chunk included) and make the same body."""
    events = [b'data: {"n": %d}\n\n' % n for n in range(40)]
    chunks = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(e), e) for e in events)
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    cut = len(chunks) - 7  # the last chunk's end comes in a second write

    async def go():
        async with raw_server(lambda n: [head + chunks[:cut], chunks[cut:] + b"0\r\n\r\n"]) as seen:
            pool = ConnectionPool(seen["url"])
            response = await pool.request("POST", "/generate", b"{}")
            body = await response.read()
            pool.close()
            return body

    assert run(go()) == b"".join(events)


def test_a_chunk_not_ended_by_crlf_among_whole_chunks_is_a_protocol_error():
    bad = [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n2\r\ncdXX2\r\nef\r\n0\r\n\r\n"]

    async def go():
        async with raw_server(lambda n: bad) as seen:
            pool = ConnectionPool(seen["url"])
            try:
                response = await pool.request("POST", "/generate", b"{}")
                await response.read()
            finally:
                pool.close()

    with pytest.raises(ProtocolError, match="CRLF"):
        run(go())


def test_a_chunked_body_cut_anywhere_in_three_reads_gives_its_bytes_in_order():
    """Reads that start on a chunk's start, or with the rest of a chunk an earlier read cut off,
    are taken as they are; every other cut goes through the state machine: the same bytes."""
    events = [b"data: {%d}\n\n" % n * (n + 1) for n in range(4)]
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    whole = head + b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"
    for first in range(len(head), len(whole) + 1, 3):
        for second in range(first, len(whole) + 1, 2):
            conn = _Connection(SimpleNamespace(loop=None))
            conn.in_use = True
            for read in (whole[:first], whole[first:second], whole[second:]):
                conn.data_received(memoryview(read))
            assert b"".join(conn._body) == b"".join(events), (first, second)
            assert conn._state == _DONE and not conn._buf
