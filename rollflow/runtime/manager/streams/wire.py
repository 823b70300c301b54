"""What the manager and its stream processes and relays say to each other.

A stream process (`processes: N`, N > 1) or a relay (`rollflow manager relay`, on an engine's own
node) reads engines' token streams for the manager: the manager opens a stream by a request id, and
gets back what the engine streamed, several events merged into one chunk per request and many
requests' chunks in one message, and a stream's end or error. A message is a 4-byte length and an
array, in one of two codecs: JSON (orjson) to and from a relay, whose connection may come from
another machine, so that nothing read from it can run code or crash the reader; marshal between
the manager and its own stream processes, children of the same interpreter on a socket pair, where
a chunk's logprobs are copied as 8 bytes each rather than printed and parsed as decimals (reading
a message costs about 0.6x JSON's). A relay's first message from the manager is HELLO with the
relay's token.
"""

from __future__ import annotations

import dataclasses
import marshal
import operator
import struct
from collections.abc import Callable
from typing import Any

import orjson

from rollflow.runtime.engines.base import GenerateChunk
from rollflow.runtime.wire.base import SamplingParams

HEADER = struct.Struct("<I")
MAX_MESSAGE_BYTES = 1 << 30

# manager -> stream process
OPEN = 0  # (OPEN, rid, engine_type, url, api_key, input_ids, sampling fields)
CLOSE = 1  # (CLOSE, rid): stop reading it (the engine sees its client go away)
HELLO = 2  # (HELLO, token): a relay's first message; a wrong token closes the connection

# stream process -> manager: one message is a list of these
CHUNK = 0  # (CHUNK, rid, *GenerateChunk fields)
FAILED = 1  # (FAILED, rid, kind, message): the stream ended with an error (one of ERROR_KINDS)

# why a stream ended without a finish_reason, as the stream process's engine client raised it
ENDED = "ended"  # the engine closed the stream early
REJECTED = "rejected"  # EngineRejectedError
REQUEST_FAILED = "request_failed"  # RequestFailedError
ENGINE = "engine"  # any of ENGINE_ERRORS: the engine is at fault
INTERNAL = "internal"  # the stream process's own fault


class StreamProcessLost(Exception):
    """The stream process reading this attempt died: the engine is not at fault, and the sample
    resumes from the tokens the manager had received."""


@dataclasses.dataclass(frozen=True)
class Codec:
    """How a message is written as bytes and read back."""

    dumps: Callable[[object], bytes]
    loads: Callable[[bytes | memoryview], Any]


JSON = Codec(orjson.dumps, orjson.loads)  # to and from relays
MARSHAL = Codec(marshal.dumps, marshal.loads)  # to and from this manager's stream processes


def frame(message: object, codec: Codec = JSON) -> bytes:
    payload = codec.dumps(message)
    return HEADER.pack(len(payload)) + payload


_SAMPLING_FIELDS = operator.attrgetter(*(field.name for field in dataclasses.fields(SamplingParams)))


def sampling_fields(sampling: SamplingParams) -> tuple:
    """The sampling parameters as the wire carries them (their values in field order). Read
    flat: every field is a number, a string or a tuple of them, and `dataclasses.astuple` would
    deep-copy each request's (a share of the manager's CPU per request)."""
    return _SAMPLING_FIELDS(sampling)


def sampling_from(fields: list | tuple) -> SamplingParams:
    """The sampling parameters back from the fields (JSON makes the tuples lists)."""
    values = [tuple(value) if isinstance(value, list) else value for value in fields]
    return SamplingParams(*values)


def chunk_from(item: tuple) -> GenerateChunk:
    """A CHUNK item back into the engine client's chunk."""
    return GenerateChunk(*item[2:])


class FrameReader:
    """Splits a byte stream into messages; feed it what the socket gave. A message longer than
    `max_bytes` is refused (ValueError): a peer that sends one is not a rollflow manager."""

    def __init__(self, max_bytes: int = MAX_MESSAGE_BYTES, codec: Codec = JSON) -> None:
        self._buffer = bytearray()
        self.max_bytes = max_bytes
        self._loads = codec.loads

    def feed(self, data: bytes) -> list:
        self._buffer += data
        messages = []
        offset = 0
        buffer = self._buffer
        while len(buffer) - offset >= HEADER.size:
            (size,) = HEADER.unpack_from(buffer, offset)
            if size > self.max_bytes:
                raise ValueError(f"a message of {size} bytes, more than {self.max_bytes}")
            end = offset + HEADER.size + size
            if len(buffer) < end:
                break
            messages.append(self._loads(memoryview(buffer)[offset + HEADER.size : end]))
            offset = end
        if offset:
            del buffer[:offset]
        return messages
