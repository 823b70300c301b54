"""What the manager and its stream processes say to each other (`processes: N`, N > 1).

A stream process reads engines' token streams for the manager: the manager opens a stream by a
request id, the process sends back what the engine streamed, several events merged into one chunk
per request and many requests' chunks in one message, and a stream's end or error. The messages go
over a local socket pair as a 4-byte length and a `marshal`-ed tuple: the two sides are one Python
build (the manager starts the process with its own interpreter), and marshal reads and writes
lists of ints and floats several times faster than JSON or pickle.
"""

from __future__ import annotations

import dataclasses
import marshal
import struct

from rollflow.runtime.engines.base import GenerateChunk, SamplingParams

HEADER = struct.Struct("<I")

# manager -> stream process
OPEN = 0  # (OPEN, rid, engine_type, url, api_key, input_ids, sampling fields)
CLOSE = 1  # (CLOSE, rid): stop reading it (the engine sees its client go away)

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


def frame(message: object) -> bytes:
    payload = marshal.dumps(message)
    return HEADER.pack(len(payload)) + payload


def sampling_fields(sampling: SamplingParams) -> tuple:
    """The sampling parameters as marshal carries them (a tuple in field order)."""
    return dataclasses.astuple(sampling)


def sampling_from(fields: tuple) -> SamplingParams:
    return SamplingParams(*fields)


def chunk_from(item: tuple) -> GenerateChunk:
    """A CHUNK item back into the engine client's chunk."""
    return GenerateChunk(*item[2:])


class FrameReader:
    """Splits a byte stream into messages; feed it what the socket gave."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list:
        self._buffer += data
        messages = []
        offset = 0
        buffer = self._buffer
        while len(buffer) - offset >= HEADER.size:
            (size,) = HEADER.unpack_from(buffer, offset)
            end = offset + HEADER.size + size
            if len(buffer) < end:
                break
            messages.append(marshal.loads(memoryview(buffer)[offset + HEADER.size : end]))
            offset = end
        if offset:
            del buffer[:offset]
        return messages
