"""The C `whole_chunks` (rollflow/runtime/engines/_chunked.c) against its Python reference
(`whole_chunks_py`): the same answer, or the same error, for chunked bodies cut at every byte,
with extensions, the last chunk, and sizes and line ends of every wrong shape."""

from __future__ import annotations

import random

import pytest

from rollflow.runtime.engines.chunked import whole_chunks_py
from tests.compiled import require_compiled

whole_chunks = require_compiled("rollflow.runtime.engines._chunked").whole_chunks


def answer(function, buf):
    try:
        return function(buf)
    except ValueError as exc:
        return ("ValueError", str(exc))


def chunked(pieces: list[bytes], extension: bytes = b"", upper: bool = False) -> bytes:
    size = "%X" if upper else "%x"
    return b"".join((size % len(p)).encode() + extension + b"\r\n" + p + b"\r\n" for p in pieces)


BODIES = [
    chunked([b"data: {}\n\n"] * 3) + b"0\r\n\r\n",
    chunked([b"x" * 300, b"y" * 17], extension=b";name=value", upper=True),
    chunked([b"a\r\nb", b"\r\n"]),  # CRLF inside the data
    b"1a\r\n" + b"z" * 26 + b"\r\n" + b"5\r\nshort",  # a partial last chunk
    b"5\r\nabcdeXX" + b"3\r\nabc\r\n",  # data not followed by CRLF
    b"0x5\r\nabcde\r\n",  # a size of another shape: left to the state machine
    b" 5\r\nabcde\r\n",
    b"5 \r\nabcde\r\n",
    b"-5\r\nabcde\r\n",
    b"1" + b"0" * 16 + b"\r\nx\r\n",  # 17 digits
    b"f" * 16 + b"\r\nx\r\n",  # 16 digits: a size past any buffer
    b"5;ext\nabcde\r\n",  # a bare LF ends no size line
    b"",
]


@pytest.mark.parametrize("body", BODIES, ids=range(len(BODIES)))
def test_every_cut_of_each_body_answers_alike(body):
    for cut in range(len(body) + 1):
        for buf in (body[:cut], bytearray(body[:cut])):
            assert answer(whole_chunks, buf) == answer(whole_chunks_py, buf), (body, cut)


def test_whole_chunks_are_joined_and_the_last_is_left():
    events = [b"data: {%d}\n\n" % n for n in range(50)]
    body = chunked(events) + b"0\r\n\r\n"
    assert whole_chunks(body) == (b"".join(events), len(body) - 5)


def test_random_bodies_answer_alike():
    rng = random.Random(7)
    for _ in range(300):
        pieces = [
            bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40))) for _ in range(rng.randrange(1, 8))
        ]
        body = bytearray(chunked(pieces, extension=rng.choice([b"", b";a=b"])))
        if rng.random() < 0.5 and body:
            body[rng.randrange(len(body))] = rng.randrange(256)  # one byte of any value anywhere
        cut = rng.randrange(len(body) + 1)
        assert answer(whole_chunks, bytes(body[:cut])) == answer(whole_chunks_py, bytes(body[:cut]))
