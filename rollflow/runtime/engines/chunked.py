"""The whole chunks at the front of an HTTP/1.1 chunked body, taken in one pass (pool.py).

A streaming engine writes one chunk per event, and a read holds tens of them under load: walking
them one trip through the connection's state machine each cost the manager a sixth of its CPU per
streamed token. `whole_chunks` is the C extension `rollflow.runtime.engines._chunked` where it is
built, else `whole_chunks_py`, the reference it is tested against (the same answers, errors
included).
"""

from __future__ import annotations

import re

# 1 to 16 hex digits, an optional extension, CRLF (RFC 9112's chunk-size line, without whitespace)
_SIZE_LINE = re.compile(rb"([0-9A-Fa-f]{1,16})(?![0-9A-Fa-f])(?:;[^\r\n]*)?\r\n")


def whole_chunks_py(buf: bytes | bytearray) -> tuple[bytes, int] | None:
    """Every chunk from `buf`'s start whose size line, data and closing CRLF are all in `buf`, up to
    the last (size 0) chunk: their data joined and the bytes they span; None when there is none.
    The last chunk, a partial one and a size line of another shape are left to the caller's state
    machine. ValueError when a chunk's data is not followed by CRLF."""
    pieces, start = [], 0
    while True:
        line = _SIZE_LINE.match(buf, start)
        if line is None:
            break
        size, data_start = int(line[1], 16), line.end()
        stop = data_start + size
        if size == 0 or stop + 2 > len(buf):
            break
        if buf[stop : stop + 2] != b"\r\n":
            raise ValueError("chunk not followed by CRLF")
        pieces.append(buf[data_start:stop])
        start = stop + 2
    if not pieces:
        return None
    return b"".join(pieces), start


try:
    from rollflow.runtime.engines._chunked import whole_chunks
except ImportError:  # no C compiler at install time: the reference, slower
    whole_chunks = whole_chunks_py
